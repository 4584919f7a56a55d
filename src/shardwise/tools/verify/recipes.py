"""The ways frameworks set the epoch (with their default settings), replayed on a rank's objects.

Each recipe takes the view of :meth:`objects.Instance.view` (the objects at each of :data:`PATHS`)
and calls ``set_epoch`` where its framework does, through the one ``set_epoch`` implementation,
:func:`shardwise.samplers.set_epoch.call_set_epoch`. ``shardwise verify`` reports, per recipe,
whether the order of epoch 1 differs from epoch 0's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...samplers.set_epoch import call_set_epoch

PATHS = ("loader.sampler", "loader.batch_sampler", "loader.batch_sampler.sampler")
"""Where frameworks call ``set_epoch``; a bare sampler is seen as the DataLoader it would be put in."""


def set_epoch_everywhere(view: dict[str, Any], epoch: int) -> None:
    """Set ``epoch`` on every path at once (the union of all frameworks), each object once."""
    call_set_epoch(list(view.values()), epoch)


def _pytorch(view: dict[str, Any], epoch: int) -> None:
    # The recipe calls set_epoch on the object the script built: the sampler, else the batch sampler.
    sampler = view["loader.sampler"]
    call_set_epoch([sampler if callable(getattr(sampler, "set_epoch", None)) else view["loader.batch_sampler"]], epoch)


def _lightning(view: dict[str, Any], epoch: int) -> None:
    call_set_epoch([view["loader.sampler"], view["loader.batch_sampler.sampler"]], epoch)


def _accelerate(view: dict[str, Any], epoch: int) -> None:
    call_set_epoch([view["loader.batch_sampler"], view["loader.batch_sampler.sampler"]], epoch)


def _composer(view: dict[str, Any], epoch: int) -> None:
    from torch.utils.data import DistributedSampler

    # Composer's _get_distributed_sampler: the batch sampler if it is a DistributedSampler, else the sampler.
    for path in ("loader.batch_sampler", "loader.sampler"):
        if isinstance(view[path], DistributedSampler):
            view[path].set_epoch(epoch)
            return


FRAMEWORKS: dict[str, Callable[[dict[str, Any], int], None]] = {
    "PyTorch recipe (the sampler or batch sampler built)": _pytorch,
    "Lightning (loader.sampler, loader.batch_sampler.sampler)": _lightning,
    "Accelerate (loader.batch_sampler, its .sampler)": _accelerate,
    "Composer (whichever is a DistributedSampler)": _composer,
}
"""Per framework (the name the report prints), its way of calling ``set_epoch`` on a view."""
