"""``shardwise.verify``: prove a sampler, batch sampler or DataLoader safe for distributed training.

The factory is called once per rank, the rank visible as launchers make it visible, and what every
rank would train on is checked before any training run: equal steps (else the run hangs), ``len``,
overlap and coverage, epoch order under each framework's ``set_epoch``, dependence on global RNG
state and on ``PYTHONHASHSEED``, per-step balance, and mid-epoch (and elastic) resume. See
``docs/verify.md``.

Modules: ``target`` (naming the factory for fresh processes), ``worker`` (what runs in them:
build, iterate, save, resume), ``launcher`` (a rank's environment, seeds and simulated group),
``recipes`` (each framework's ``set_epoch``), ``objects`` (what the factory returned, and the graph
behind it), ``runner`` (the processes), ``checks/`` (one module per concern, run by
``checks.build_report``), ``report``, ``plot`` (the ``plot`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._core.errors import check_bool, check_int, check_seconds
from ...samplers.inputs import as_lengths
from .report import ERROR, WARNING, CheckResult, Finding, VerificationError, VerifyReport
from .target import TargetError, as_ref, stop_if_importing_a_target
from .worker import Setup, nodes_for

__all__ = [
    "ERROR",
    "WARNING",
    "CheckResult",
    "Finding",
    "TargetError",
    "VerificationError",
    "VerifyReport",
    "verify",
    "verify_many",
]

DEFAULT_TIMEOUT = 300.0
_MAX_UNITS = 10_000_000


def _setup(
    world_size: object, epochs: object, dataset_size: object, lengths: object, spawn: bool
) -> Setup:
    world_size = check_int("world_size", world_size, minimum=1)
    epochs = check_int("epochs", epochs, minimum=1)
    size = None if dataset_size is None else check_int("dataset_size", dataset_size, minimum=0)
    array = None if lengths is None else as_lengths(lengths)
    if size is None and array is not None:
        size = int(array.size)
    max_units = _MAX_UNITS if size is None else max(_MAX_UNITS, 4 * size)
    return Setup(
        world_size=world_size,
        epochs=epochs,
        local_world_size=nodes_for(world_size),
        # Every rank its own seeds, as separate processes have; B differs from A everywhere.
        seeds_a=tuple(10_007 + 7_919 * r for r in range(world_size)),
        seeds_b=tuple(90_001 + 6_007 * r for r in range(world_size)),
        max_units=max_units,
        dataset_size=size,
        lengths=None if array is None else np.asarray(array, dtype=np.int64),
        simulated=not spawn,
    )


def verify_many(
    factories: Sequence[Callable[..., Any] | str],
    *,
    world_size: int = 4,
    epochs: int = 2,
    dataset_size: int | None = None,
    lengths: Any = None,
    spawn: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    processes: int | None = None,
) -> list[VerifyReport]:
    """:func:`verify` several factories with one pool of fresh processes (the same options for all).

    Returns:
        One report per factory, in order.
    """
    from .checks import build_report
    from .runner import observe

    stop_if_importing_a_target()  # a verify process importing a script that calls verify() unguarded
    spawn = check_bool("spawn", spawn)
    if not factories:
        return []
    setup = _setup(world_size, epochs, dataset_size, lengths, spawn)
    timeout = check_seconds("timeout", timeout, allow_zero=False)
    refs = [as_ref(f) for f in factories]
    observed = observe(refs, [setup] * len(refs), spawn=spawn, timeout=timeout, processes=processes)
    mode = f"spawn ({setup.world_size} gloo processes)" if spawn else "simulated"
    return [build_report(obs, mode) for obs in observed]


def verify(
    factory: Callable[..., Any] | str,
    *,
    world_size: int = 4,
    epochs: int = 2,
    dataset_size: int | None = None,
    lengths: Any = None,
    spawn: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    state: Any = None,
) -> VerifyReport:
    """Check that what ``factory`` builds is safe for distributed training, before the run.

    ``factory`` is called once per rank. The rank is visible the way launchers make it visible:
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (two simulated nodes when the world splits evenly, so
    local rank differs from rank), ``MASTER_ADDR``/``MASTER_PORT`` and ``TORCHELASTIC_RUN_ID`` in the
    environment, and ``rank=``/``world_size=`` keywords if the factory names them. By default the
    ranks are simulated in a few fresh processes, each rank with its own global seeds and
    ``torch.distributed`` answering its rank; ``spawn=True`` starts ``world_size`` processes in a
    real gloo group instead. Nothing is loaded from the dataset: the index source is iterated.

    Args:
        factory: a module-level callable (pickled by reference), or ``"package.module:function"``,
            or ``"path/to/file.py:function"``; it returns a ``Sampler``, a batch sampler or a
            ``DataLoader`` (map-style). A lambda, a nested function or one typed into a notebook is
            refused at once; a script that calls ``verify`` without a main guard is imported by the
            fresh processes only up to that call.
        world_size: ranks to verify.
        epochs: epochs every rank iterates (2 or more to check that the order changes).
        dataset_size: number of samples, for the coverage and index range checks (taken from
            ``len(loader.dataset)``, a sampler's ``dataset``/``data_source`` or ``lengths`` if not given).
        lengths: per-sample lengths (tokens) to judge per-step token balance (a sampler's own
            ``lengths`` attribute is used if not given).
        spawn: verify in a real ``torch.distributed`` gloo group of ``world_size`` processes.
            ``True`` or ``False`` only.
        timeout: seconds for the whole verification.
        state: a saved sampler state (a dict, or the path of a state or checkpoint file) to resume on
            ``world_size`` real ranks: the ``skip_ledger`` check lists its skipped ranges and checks
            that they never train and nothing else is lost or repeated (``verify/ledger.py``).

    Returns:
        A :class:`VerifyReport`; ``report.ok`` is False when a finding would break training, and
        ``report.raise_for_findings()`` turns that into a test failure.

    Raises:
        TargetError: the factory cannot be imported or called, or returns something else than a
            sampler, batch sampler or DataLoader.
        TimeoutError: the ranks did not finish within ``timeout``.

    Example:
        >>> import shardwise
        >>> report = shardwise.verify("mypkg.data:make_train_loader", world_size=8)  # doctest: +SKIP
        >>> report.ok, [f.check for f in report.findings]  # doctest: +SKIP
        (False, ['equal_steps'])
        >>> report.raise_for_findings()  # doctest: +SKIP
    """
    report = verify_many(
        [factory], world_size=world_size, epochs=epochs, dataset_size=dataset_size, lengths=lengths,
        spawn=spawn, timeout=timeout,
    )[0]
    if state is not None:
        from .ledger import check_ledger

        report.checks.append(check_ledger(as_ref(factory), state, report.world_size, timeout=timeout))
    return report
