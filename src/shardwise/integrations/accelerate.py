"""HF Accelerate: the one line that keeps Accelerate from sharding a shardwise sampler twice.

``accelerator.prepare(loader)`` wraps every batch sampler in Accelerate's ``BatchSamplerShard``
(``prepare_data_loader`` does so whenever ``num_processes > 1``, whatever the sampler), which would
deal an already distributed plan a second time. shardwise refuses that at the first ``__iter__``,
before any step, and names the fix, which is this module's :func:`prepare_data_loader`::

    loader = shardwise.integrations.accelerate.prepare_data_loader(accelerator, loader)

It builds Accelerate's own ``DataLoaderShard`` around the loader's shardwise batch sampler (device
placement, ``end_of_dataloader`` for gradient accumulation, ``use_stateful_dataloader``, RNG
synchronisation all as ``prepare`` would give them) and registers it with ``accelerator.prepare``
so ``save_state``/``load_state`` include it. Resume: with
``DataLoaderConfiguration(use_stateful_dataloader=True)`` the loader state saved by
``save_state`` carries the sampler's O(1) global position, and ``load_state`` restores it, with
no batch replayed; call ``loader.set_epoch(epoch)`` at the start of every epoch, because
Accelerate's own epoch counter restarts at 0 in a new process.
"""

from __future__ import annotations

from typing import Any

from .._core.foreign import check, private
from ..samplers.base import PlanSampler
from ..samplers.frameworks import is_batch_plan
from . import require
from .loader_settings import copy_settings

_accelerate = require("accelerate", "accelerate", "accelerate", "accelerate")
_data_loader = require("accelerate.data_loader", "accelerate", "accelerate", "accelerate")
check("accelerate")

_DROP_LAST = private("accelerate", "_drop_last")  # DataLoaderShard's keywords
_NON_BLOCKING = private("accelerate", "_non_blocking")
_PREPARED = private("accelerate", "_is_accelerate_prepared")  # what Accelerator.prepare returns as it is

__all__ = ["prepare_data_loader"]


def _shardwise_batches(loader: Any) -> Any:
    """The loader's batch sampler if shardwise distributes it (directly, or through its index sampler)."""
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, PlanSampler) and is_batch_plan(batch_sampler):
        return batch_sampler
    if isinstance(getattr(batch_sampler, "sampler", None), PlanSampler):
        return batch_sampler
    raise TypeError(
        "loader should sample with a shardwise sampler or batch sampler, but its batch_sampler is "
        f"{type(batch_sampler).__name__} over {type(getattr(batch_sampler, 'sampler', None)).__name__}; "
        "a loader that shardwise does not distribute goes through accelerator.prepare(loader) as usual"
    )


def prepare_data_loader(accelerator: Any, loader: Any) -> Any:
    """``accelerator.prepare(loader)`` for a loader whose sampling shardwise already distributes.

    Args:
        accelerator: the ``accelerate.Accelerator`` of the run.
        loader: a ``torch.utils.data.DataLoader`` built with ``batch_sampler=<shardwise batch sampler>``
            or ``sampler=<shardwise index sampler>``.

    Returns:
        Accelerate's ``DataLoaderShard`` over the same batches, registered with ``accelerator``.

    Raises:
        TypeError: the loader is not sampled by shardwise.

    Example:
        >>> loader = prepare_data_loader(accelerator, DataLoader(data, batch_sampler=sampler))  # doctest: +SKIP
    """
    batch_sampler = _shardwise_batches(loader)
    config = accelerator.dataloader_config
    settings = copy_settings(loader)
    rng_types = [kind for kind in accelerator.rng_types if str(kind) != "generator" and kind != "generator"]
    placement = accelerator.device_placement
    shard = _data_loader.DataLoaderShard(
        loader.dataset,
        device=accelerator.device if placement else None,
        rng_types=rng_types or None,
        use_stateful_dataloader=config.use_stateful_dataloader,
        batch_sampler=batch_sampler,
        **{_DROP_LAST: False, _NON_BLOCKING: config.non_blocking},
        **settings,
    )
    # Accelerate returns a loader it has already prepared as it is, and registers it (save_state).
    setattr(shard, _PREPARED, True)
    return accelerator.prepare(shard)
