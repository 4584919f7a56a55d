"""torchdata's ``StatefulDataLoader``: shardwise samplers are ``Stateful``, so resume is O(1).

``StatefulDataLoader(dataset, batch_sampler=<shardwise>)`` (or ``sampler=``) saves the sampler's
global position in its ``state_dict()`` and restores it with ``load_state_dict()``: no batch is
replayed, with ``num_workers=0`` or more (torchdata snapshots the sampler as indices are handed to
workers). The state loads at another world size too, except a state saved between two of
torchdata's snapshots (workers and ``snapshot_every_n_steps > 1``): torchdata replays the steps
since its snapshot, which cover another number of samples there, so loading it raises
``StateMismatchError`` naming the fix (docs/torchdata.md). :func:`to_stateful` turns an existing
``DataLoader`` into one with the same settings.
"""

from __future__ import annotations

from typing import Any

from .._core.foreign import check
from . import require
from .loader_settings import copy_settings

_stateful = require("torchdata.stateful_dataloader", "torchdata", "torchdata", "torchdata")
check("torchdata")  # the names samplers/delivery.py reads from its iterators

__all__ = ["to_stateful"]


def to_stateful(loader: Any, **overrides: Any) -> Any:
    """A ``StatefulDataLoader`` with ``loader``'s dataset, sampling and settings (``overrides`` win).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from shardwise import ShardedSampler
        >>> loader = to_stateful(DataLoader(range(8), sampler=ShardedSampler(8, num_replicas=1, rank=0), batch_size=2))
        >>> type(loader).__name__, len(loader)
        ('StatefulDataLoader', 4)
    """
    settings = copy_settings(loader, stateful=True)
    if loader.batch_size is not None:
        # torchdata's own BatchSampler nests the sampler's state, so the index sampler resumes in O(1).
        settings.update(sampler=loader.sampler, batch_size=loader.batch_size, drop_last=loader.drop_last)
    else:
        settings["batch_sampler"] = loader.batch_sampler
    settings.update(overrides)
    return _stateful.StatefulDataLoader(loader.dataset, **settings)
