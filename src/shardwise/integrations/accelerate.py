"""HF Accelerate: the one line that keeps Accelerate from sharding a shardwise sampler twice.

``accelerator.prepare(loader)`` wraps every batch sampler in Accelerate's ``BatchSamplerShard``
(``prepare_data_loader`` does so whenever ``num_processes > 1``, whatever the sampler), which would
deal an already distributed plan a second time. shardwise refuses that at the first ``__iter__``,
before any step, and names the fix, which is this module's :func:`prepare_data_loader`::

    loader = shardwise.integrations.accelerate.prepare_data_loader(accelerator, loader)

It builds Accelerate's own ``DataLoaderShard`` around the loader's shardwise sampler (device
placement, ``end_of_dataloader`` for gradient accumulation, ``use_stateful_dataloader``, RNG
synchronisation all as ``prepare`` would give them) and registers it with ``accelerator.prepare``
so ``save_state``/``load_state`` include it. Resume: with
``DataLoaderConfiguration(use_stateful_dataloader=True)`` the loader state saved by
``save_state`` carries the sampler's O(1) global position (an index sampler's too: the loader is
rebuilt from ``sampler=`` and ``batch_size=``, so torchdata's stateful batch sampler holds it), and
``load_state`` restores it, with no batch replayed, at any world size; call
``loader.set_epoch(epoch)`` at the start of every epoch, because Accelerate's own epoch counter
restarts at 0 in a new process.

``accelerator.gather_for_metrics`` cuts the last gathered step to the samples that are not padding
(NOTE [ The last gathered step ]); ``total_batch_size`` is the batch of all ranks together.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from torch.utils.data import BatchSampler

from .._core.foreign import check, private
from ..samplers.base import PlanSampler
from ..samplers.frameworks import is_batch_plan
from ..samplers.wrappers import ShardedBatchWrapper
from . import require
from .loader_settings import copy_settings

_accelerate = require("accelerate", "accelerate", "accelerate", "accelerate")
_data_loader = require("accelerate.data_loader", "accelerate", "accelerate", "accelerate")
check("accelerate")

_DROP_LAST = private("accelerate", "_drop_last")  # DataLoaderShard's keywords
_NON_BLOCKING = private("accelerate", "_non_blocking")
_PREPARED = private("accelerate", "_is_accelerate_prepared")  # what Accelerator.prepare returns as it is

__all__ = ["prepare_data_loader"]

_NO_PADDING, _UNKNOWN = 0, -1  # Accelerate's remainder: 0 keeps the whole last step, -1 says "no length"


def _plan_of(loader: Any) -> tuple[PlanSampler[Any], Any]:
    """``(shardwise sampler, the loader's batch sampler)``: a batch plan, or an index plan in a batch sampler."""
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, PlanSampler) and is_batch_plan(batch_sampler):
        return batch_sampler, batch_sampler
    inner = getattr(batch_sampler, "sampler", None)
    if isinstance(inner, PlanSampler):
        return inner, batch_sampler
    raise TypeError(
        "loader should sample with a shardwise sampler or batch sampler, but its batch_sampler is "
        f"{type(batch_sampler).__name__} over {type(inner).__name__}; "
        "a loader that shardwise does not distribute goes through accelerator.prepare(loader) as usual"
    )


def _check_accelerator(accelerator: Any, plan: PlanSampler[Any], batch_sampler: Any) -> None:
    """Refuse what the helper cannot honour, naming the fix: split batches, and a world Accelerate does not see."""
    world = plan.world
    processes = accelerator.num_processes
    if world.world_size != processes and not world.source.startswith("arguments"):
        fix = (
            "on a CPU job create it with Accelerator(cpu=True) (without it, each process of a CPU torchrun job "
            "runs as a world of 1)"
            if processes == 1
            else "start every process with the same launcher settings"
        )
        raise ValueError(
            f"{type(plan).__name__} sees {world.world_size} ranks ({world.source}), but this Accelerator runs "
            f"num_processes={processes}: gathers, gradients and gather_for_metrics would cover one process each; "
            f"{fix}"
        )
    if accelerator.split_batches:
        per_rank = getattr(batch_sampler, "batch_size", None)
        hint = (
            f"build the loader with each rank's batch (batch_size={per_rank // processes} for {per_rank} over "
            f"{processes} processes)"
            if isinstance(per_rank, int) and per_rank % processes == 0
            else "build the loader with each rank's batch"
        )
        raise ValueError(
            "split_batches=True cuts every batch into per-rank pieces, but a shardwise sampler already plans "
            f"each rank's batches: {hint} and keep Accelerator's split_batches=False (its default)"
        )


_DataLoaderShard: Any = _data_loader.DataLoaderShard


class _ShardwiseLoader(_DataLoaderShard):  # type: ignore[misc]  # accelerate is untyped
    """Accelerate's ``DataLoaderShard`` whose ``total_batch_size`` and last-step remainder follow the shardwise plan.

    NOTE [ The last gathered step ]: ``gather_for_metrics`` keeps the first ``remainder`` samples of
    the epoch's last gathered step (rank 0's batch, then rank 1's, ...). The plan pads its end with
    repeated units (``drop_last=False``) and ``even_batches`` completes a short batch; the remainder
    is the number of real samples of that step, counted from the plan. It is exact when the padding
    trails the real samples in gathered order: always for batch plans (padding is whole batches of
    the last ranks; a completed batch is the last real one), and for an index plan when at most one
    padded position falls in that step's batches of more than one unit (any plan at 2 ranks).
    Otherwise, and where a batch plan's sizes are not known, reading the remainder at the last step
    warns, naming the fix (``drop_last=True``, or ``shard_batches`` for evaluation).
    """

    def __init__(self, dataset: Any, *, shardwise_sampler: PlanSampler[Any], per_rank: int | None, index: bool,
                 index_drop_last: bool, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(dataset, **kwargs)
        self._shardwise = shardwise_sampler  # the loader's own 'sampler' is DataLoader's
        self._per_rank = per_rank
        self._index = index
        self._index_drop_last = index_drop_last
        self._loaded_start: dict[str, Any] | None = None
        self._last: tuple[int, str] = (_UNKNOWN, "")
        self._warned = False

    @property
    def total_batch_size(self) -> int | None:
        """The batch of all processes together at one step (``None`` where batches have no fixed size)."""
        return None if self._per_rank is None else self._per_rank * self._shardwise.world.world_size

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._loaded_start = _plan_state(state_dict)
        if self._loaded_start is not None:
            # Accelerate's epoch counter restarts at 0 in a new process and is set on the sampler at
            # iter(): without a set_epoch call, the loaded epoch is the one to continue.
            self.iteration = int(self._loaded_start["epoch"])

    def begin(self) -> None:
        super().begin()
        self._last = self._last_step()

    def _last_step(self) -> tuple[int, str]:
        """``(remainder, why it is not exact or "")`` for the pass about to begin (NOTE [ The last gathered step ])."""
        epoch = self.iteration  # DataLoaderShard sets it on the sampler right after begin()
        total = self._shardwise.plan.size(epoch)
        loaded, self._loaded_start = self._loaded_start, None
        start = 0
        if loaded is not None and loaded.get("epoch") == epoch and 0 < int(loaded.get("consumed", 0)) < total:
            start = int(loaded["consumed"])  # a restored pass runs from the loaded position
        world = self._shardwise.world.world_size
        rest = total - start
        count = self._shardwise.plan.pass_units(epoch, start, world)  # units a rank yields this pass
        if count == 0:
            return _NO_PADDING, ""
        if self._index:
            return self._index_last_step(rest, world, count)
        return self._batch_last_step(rest, world, count)

    def _index_last_step(self, rest: int, world: int, count: int) -> tuple[int, str]:
        size = int(self._per_rank or 1)
        steps = count // size if self._index_drop_last else -(-count // size)
        if steps == 0:
            return _NO_PADDING, ""
        first = (steps - 1) * size
        local = np.arange(first, min(first + size, count))
        real = (local[None, :] * world + np.arange(world)[:, None] < rest).ravel()  # (world, last batch): rank-major
        kept = int(real.sum())
        if kept == real.size:
            return _NO_PADDING, ""
        if real[kept:].any():
            return _UNKNOWN, (
                f"the padding of the plan's end ({real.size - kept} repeated samples) sits inside the batches of "
                f"ranks {sorted({int(i) // len(local) for i in np.flatnonzero(~real)})}, not after every real sample"
            )
        return kept, ""

    def _batch_last_step(self, rest: int, world: int, count: int) -> tuple[int, str]:
        positions = (count - 1) * world + np.arange(world)  # the last step's plan positions, from the pass start
        real = int((positions < rest).sum())
        if real == world and not self._completes_short_batch():
            return _NO_PADDING, ""
        name, size = type(self._shardwise).__name__, self._per_rank
        if not isinstance(self._shardwise, ShardedBatchWrapper) or size is None:
            # A sampler's own batches may be short anywhere (a bucket's last batch): only the wrapper's are counted.
            return _UNKNOWN, f"the samples in {name}'s {world - real} padded batches of that step are not known"
        holds_last = real > 0 and int(positions[real - 1]) == rest - 1  # the plan's last batch, maybe short
        short = self._short_batch(size) if holds_last else size
        if short is None:
            inner = type(self._shardwise.batch_sampler).__name__
            return _UNKNOWN, f"the size of the last batch of {inner} is not known"
        return (real - 1) * size + short if holds_last else real * size, ""

    def _completes_short_batch(self) -> bool:
        return isinstance(self._shardwise, ShardedBatchWrapper) and self._shardwise.even_batches

    def _short_batch(self, size: int) -> int | None:
        """Samples in the last batch ``shard_batches`` wraps, where they can be counted (its sampler's length)."""
        inner = self._shardwise.batch_sampler  # type: ignore[attr-defined]  # a ShardedBatchWrapper (the caller checks)
        if getattr(inner, "drop_last", None) is True:
            return size
        source = getattr(inner, "sampler", None)
        try:
            samples = len(source)  # type: ignore[arg-type]
        except TypeError:
            return None
        return samples - (len(inner) - 1) * size

    def _remainder(self) -> int:
        remainder, why = self._last
        if why and self.end_of_dataloader and not self._warned:
            self._warned = True
            warnings.warn(
                f"accelerator.gather_for_metrics cannot drop the padding of this epoch's last step exactly: {why}, "
                "and Accelerate keeps a leading part of the gathered step; it returns the whole step, padding "
                "included. Pass drop_last=True to the sampler (no padding), or, for an evaluation, deal whole "
                "batches: shardwise.shard_batches(BatchSampler(SequentialSampler(dataset), batch_size, False))",
                RuntimeWarning,
                stacklevel=3,
            )
        return remainder

    def __reduce__(self) -> Any:
        # A new object of this class with these attributes (DataLoaderShard's own reduce names DataLoaderShard;
        # ``__class__`` here reports the wrapped loader's class, so the default reduce cannot name this one).
        return (object.__new__, (_ShardwiseLoader,), self.__dict__)


# DataLoaderStateMixin.__init_subclass__ sets a class attribute remainder = -1 on every subclass, and
# reset()/begin() assign Accelerate's own rule (len(dataset) % total_batch_size); the plan decides here.
_ShardwiseLoader.remainder = property(_ShardwiseLoader._remainder, lambda self, value: None)


def _plan_state(state: Any) -> dict[str, Any] | None:
    """The shardwise sampler state nested in a loader state (``epoch``, ``consumed``), if there is one."""
    if isinstance(state, dict):
        if "consumed" in state and "epoch" in state and "fingerprint" in state:
            return state
        for value in state.values():
            found = _plan_state(value)
            if found is not None:
                return found
    return None


def prepare_data_loader(accelerator: Any, loader: Any) -> Any:
    """``accelerator.prepare(loader)`` for a loader whose sampling shardwise already distributes.

    ``accelerator.gather_for_metrics`` then returns each sample of the epoch once (NOTE [ The last
    gathered step ]); ``Accelerator(even_batches=True)`` (its default) sets ``even_batches`` on a
    ``shard_batches`` sampler, so every rank's batch has one shape at every step; with
    ``even_batches=False`` a short batch stays short.

    Args:
        accelerator: the ``accelerate.Accelerator`` of the run.
        loader: a ``torch.utils.data.DataLoader`` built with ``batch_sampler=<shardwise batch sampler>``
            or ``sampler=<shardwise index sampler>``.

    Returns:
        Accelerate's ``DataLoaderShard`` over the same batches, registered with ``accelerator``.

    Raises:
        TypeError: the loader is not sampled by shardwise.
        ValueError: ``split_batches=True``, or the sampler sees another number of ranks than the
            Accelerator (an Accelerator without ``cpu=True`` in a CPU torchrun job runs as 1).

    Example:
        >>> loader = prepare_data_loader(accelerator, DataLoader(data, batch_sampler=sampler))  # doctest: +SKIP
    """
    plan, batch_sampler = _plan_of(loader)
    _check_accelerator(accelerator, plan, batch_sampler)
    index = plan is not batch_sampler
    if isinstance(plan, ShardedBatchWrapper) and accelerator.even_batches and isinstance(plan.batch_size, int):
        plan.even_batches = True
    if index and type(batch_sampler) is BatchSampler:
        # sampler= and batch_size=: torchdata's StatefulDataLoader batches with its own stateful batch
        # sampler, whose state holds the sampler's (a torch BatchSampler has none: resume would replay).
        per_rank: int | None = batch_sampler.batch_size
        sampling = {"sampler": plan, "batch_size": per_rank, "drop_last": batch_sampler.drop_last}
    else:
        per_rank = getattr(batch_sampler, "batch_size", None)
        sampling = {"batch_sampler": batch_sampler}
    config = accelerator.dataloader_config
    rng_types = [kind for kind in accelerator.rng_types if str(kind) != "generator" and kind != "generator"]
    placement = accelerator.device_placement
    shard = _ShardwiseLoader(
        loader.dataset,
        shardwise_sampler=plan,
        per_rank=per_rank if isinstance(per_rank, int) else None,
        index=index,
        index_drop_last=bool(getattr(batch_sampler, "drop_last", False)),
        device=accelerator.device if placement else None,
        rng_types=rng_types or None,
        use_stateful_dataloader=config.use_stateful_dataloader,
        **sampling,
        **{_DROP_LAST: False, _NON_BLOCKING: config.non_blocking},
        **copy_settings(loader),
    )
    # Accelerate returns a loader it has already prepared as it is, and registers it (save_state).
    setattr(shard, _PREPARED, True)
    return accelerator.prepare(shard)
