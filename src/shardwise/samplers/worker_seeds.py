"""Seeds for each rank and each DataLoader worker, derived by hashing, never by adding; forked workers' hang.

The common advice ``seed = 42 + local_rank`` gives rank 0 of every node the same stream (local
ranks repeat on each node), ignores DataLoader workers, and makes seed 42 on rank 1 equal seed 43
on rank 0. :func:`worker_seed` hashes ``(seed, epoch, global rank, worker id)`` instead, so every
(rank, worker) pair of a job draws a distinct stream and a rerun draws the same ones.

A DataLoader worker forked while another thread of its process starts or ends can hang in
``os.fork()`` on CPython without the fix of gh-112275 (:func:`fork_may_hang`); a process running
torch.distributed has such threads (gloo's, DDP's). The first fork of such a process on such an
interpreter warns once (an ``os.register_at_fork`` hook, registered when ``shardwise.samplers`` is
imported), naming the fix: a later patch release or ``multiprocessing_context="forkserver"``.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import warnings
from typing import Any

import numpy as np
import torch

from .._core.errors import check_int
from .._core.seeds import check_seed, derive_seed, logger
from .._core.world import World

WORKER_SEED = "worker-seed"
_MAIN_PROCESS = 0  # the worker id used outside DataLoader workers (num_workers=0)
_NUMPY_BITS = 32  # numpy's legacy global RNG takes a 32-bit seed


def _resolve_rank(rank: int | None) -> World:
    from .world import current_world

    return current_world(None, rank) if rank is None else World(rank, rank + 1, "argument")


def _resolve_worker(worker_id: int | None) -> int:
    """The DataLoader worker id; 0 outside a worker (``num_workers=0``)."""
    if worker_id is not None:
        return check_int("worker_id", worker_id, minimum=0)
    info = torch.utils.data.get_worker_info()
    return _MAIN_PROCESS if info is None else int(info.id)


def worker_seed(seed: int, *, rank: int | None = None, worker_id: int | None = None, epoch: int = 0) -> int:
    """The 64-bit seed of one (global rank, DataLoader worker, epoch): distinct for every pair.

    Derived with :func:`shardwise._core.seeds.derive_seed` from ``(seed, epoch, "worker-seed", rank,
    worker)``: a hash, so no two (rank, worker) pairs of a job share a stream, and the same inputs
    give the same seed in every process and on every rerun.

    Args:
        seed: the run's base seed, the same on every rank.
        rank: global rank; ``None`` resolves it as samplers do (``torch.distributed``, then the
            launcher's ``RANK``/``SLURM_PROCID``/..., else 0). Never the local rank.
        worker_id: DataLoader worker id; ``None`` reads ``torch.utils.data.get_worker_info()``
            (0 in the main process, i.e. with ``num_workers=0``).
        epoch: mix in the epoch when workers are re-created every epoch and should draw anew.

    Example:
        >>> worker_seed(42, rank=0, worker_id=0) != worker_seed(42, rank=1, worker_id=0)
        True
        >>> worker_seed(42, rank=3, worker_id=1) == worker_seed(42, rank=3, worker_id=1)
        True
    """
    base = check_seed(seed)
    if base is None:
        raise TypeError("seed should be an integer in [0, 2**64), but got seed=None")
    epoch = check_int("epoch", epoch, minimum=0)
    global_rank = _resolve_rank(None if rank is None else check_int("rank", rank, minimum=0)).rank
    worker = _resolve_worker(worker_id)
    return derive_seed(base, epoch, WORKER_SEED, global_rank, worker)


def seed_everything_in_worker(value: int) -> None:
    """Seed Python's ``random``, numpy's global RNG and torch's CPU RNG from one 64-bit seed."""
    random.seed(value)
    np.random.seed(value % 2**_NUMPY_BITS)  # noqa: NPY002  # user code draws from the legacy global RNG
    torch.manual_seed(value)


_records: list[dict[str, Any]] = []


def worker_seeds() -> list[dict[str, Any]]:
    """Every seed :func:`seed_worker` set in this process (a DataLoader worker records its own)."""
    return list(_records)


def seed_worker(worker_id: int, *, seed: int | None = None) -> None:
    """A ready ``worker_init_fn``: seeds ``random``, numpy and torch in each worker from :func:`worker_seed`.

    With ``seed=None`` the base is the DataLoader's own per-iteration base seed (in a worker,
    ``torch.initial_seed()`` is ``base_seed + worker_id``): new every epoch, and the same on every
    rank and on a rerun when the loader has ``generator=torch.Generator().manual_seed(s)``; the
    global rank and the worker id are hashed in, so no two (rank, worker) pairs share a stream.
    With ``seed`` given (``functools.partial(seed_worker, seed=1234)``) each (rank, worker) pair
    gets one fixed stream, the same every epoch. Each call logs one line on the ``shardwise``
    logger (INFO) and is kept in :func:`worker_seeds`.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader = DataLoader(range(8), batch_size=2, num_workers=0, worker_init_fn=seed_worker)
    """
    if seed is None:
        # Inside a worker torch seeded itself with base_seed + worker_id: recover the loader's base seed.
        in_worker = torch.utils.data.get_worker_info() is not None
        base = (torch.initial_seed() - worker_id) % 2**64 if in_worker else torch.initial_seed()
    else:
        base = seed
    world = _resolve_rank(None)
    value = worker_seed(base, rank=world.rank, worker_id=worker_id)
    seed_everything_in_worker(value)
    record = {"rank": world.rank, "worker_id": worker_id, "base_seed": base, "seed": value, "pid": os.getpid()}
    _records.append(record)
    if logger.isEnabledFor(logging.INFO):
        logger.info(
            "worker seed: rank=%d worker_id=%d base_seed=%d -> seed=%d", world.rank, worker_id, base, value
        )


FORK_FIXED = ((3, 10, 15), (3, 11, 8), (3, 12, 1))
"""The first CPython release of each line with the fix of gh-112275 (3.13 and later have it)."""


def fork_may_hang(version: tuple[int, ...], implementation: str = "cpython") -> bool:
    """Whether a process forked on this interpreter may hang in ``os.fork()`` while another thread of the parent
    starts or ends (CPython's gh-112275: 3.10 before 3.10.15, 3.11 before 3.11.8, 3.12.0; earlier lines too).

    Example:
        >>> fork_may_hang((3, 11, 7)), fork_may_hang((3, 11, 8)), fork_may_hang((3, 12, 0)), fork_may_hang((3, 13, 0))
        (True, False, True, False)
    """
    if implementation != "cpython":
        return False
    line = tuple(version[:2])
    fixed = next((first for first in FORK_FIXED if first[:2] == line), None)
    if fixed is not None:
        return tuple(version[:3]) < fixed
    return line < FORK_FIXED[0][:2]  # 3.9 and older (this package needs 3.10); 3.13 and later have the fix


def fork_advice(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> str:
    """What to do about gh-112275 on this interpreter: one sentence (``shardwise check`` and the warning say it)."""
    shown = ".".join(map(str, version[:3]))
    if not fork_may_hang(version, sys.implementation.name):
        return f"Python {shown}: forked DataLoader workers are safe from gh-112275"
    return (f"Python {shown} can hang a DataLoader worker forked while another thread starts or ends (CPython "
            "gh-112275, fixed in 3.10.15, 3.11.8 and 3.12.1), as torch.distributed's and DDP's threads do: use a "
            "later patch release, or DataLoader(..., multiprocessing_context=\"forkserver\")")


_fork_warned = False


def _warn_before_fork() -> None:
    """``os.register_at_fork(before=...)``: warn once when a process running torch.distributed forks on an
    interpreter with gh-112275 (a DataLoader worker under the ``fork`` start method, Linux's default)."""
    global _fork_warned  # noqa: PLW0603  # once a process: the hook has no object to hold it
    if _fork_warned or not fork_may_hang(tuple(sys.version_info[:3]), sys.implementation.name):
        return
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    _fork_warned = True
    warnings.warn(f"shardwise: this process runs torch.distributed and forks: {fork_advice()}", RuntimeWarning,
                  stacklevel=2)


if hasattr(os, "register_at_fork"):  # POSIX; Windows does not fork
    os.register_at_fork(before=_warn_before_fork)
