"""Lightning Fabric: resume a run where Fabric's own epoch count restarts at 0.

Training needs nothing from this module: ``fabric.setup_dataloaders(loader)`` keeps every
shardwise sampler as it is and calls ``set_epoch(n)`` on it at the ``n``-th ``iter(loader)``
(docs/fabric.md). Resuming does: that count restarts at 0 in a new process, so the first
``iter(loader)`` of a resumed run would move a sampler restored in epoch ``e > 0`` back to epoch 0.
:func:`load_state_dict` restores the sampler's O(1) position and makes the loader's count continue
from it; it returns the epoch the next ``iter(loader)`` runs, the first of the resumed loop::

    from shardwise.integrations import fabric as shardwise_fabric

    # saving, at any step (mid-epoch or after an epoch's loop):
    fabric.save(path, {"model": model, "optimizer": optimizer, "sampler": shardwise_fabric.state_dict(loader)})

    # in the new process, after building model, optimizer and loader as before:
    state = {"model": model, "optimizer": optimizer}
    remainder = fabric.load(path, state)
    start = shardwise_fabric.load_state_dict(loader, remainder["sampler"])
    for epoch in range(start, num_epochs):
        for batch in loader:  # continues with the batch after the last one trained before the save
            ...

The state is the sampler's own (epoch and global position), so the new run may have another
world size. With DataLoader workers, ``state_dict`` counts the batches the loop received, not the
ones the workers prefetched.
"""

from __future__ import annotations

from typing import Any

from .._core.foreign import check, private
from ..samplers.base import PlanSampler
from . import require

_wrappers = require("lightning.fabric.wrappers", "lightning", "lightning", "fabric")
check("lightning")

__all__ = ["load_state_dict", "state_dict"]

_COUNTER = private("lightning", "_num_iter_calls")  # _FabricDataLoader: set_epoch(<this>) at every __iter__, += 1
_FABRIC_LOADER = private("lightning", "_FabricDataLoader")


def _sampler(loader: Any) -> PlanSampler[Any]:
    """The shardwise sampler or batch sampler that ``loader`` draws from."""
    for name in ("batch_sampler", "sampler"):
        candidate = getattr(loader, name, None)
        if isinstance(candidate, PlanSampler):
            return candidate
    batches, indices = (type(getattr(loader, name, None)).__name__ for name in ("batch_sampler", "sampler"))
    raise TypeError(
        "loader should be the loader fabric.setup_dataloaders returned for a DataLoader built with "
        "sampler=<shardwise sampler> or batch_sampler=<shardwise batch sampler>, but it samples with "
        f"{batches} over {indices}"
    )


def _fabric_loader(loader: Any) -> Any:
    if not isinstance(loader, getattr(_wrappers, _FABRIC_LOADER)) or not hasattr(loader, _COUNTER):
        raise TypeError(
            "loader should be what fabric.setup_dataloaders(...) returned (a lightning.fabric "
            f"_FabricDataLoader, which counts iter() calls in {_COUNTER}), but got {type(loader).__name__}; "
            "without Fabric, call sampler.load_state_dict(state) and set_epoch yourself"
        )
    return loader


def state_dict(loader: Any) -> dict[str, Any]:
    """The O(1) state of the shardwise sampler of a Fabric loader: what was trained so far.

    Args:
        loader: the loader ``fabric.setup_dataloaders`` returned.

    Returns:
        The sampler's ``state_dict()`` (epoch, global position, seed, fingerprint): save it with
        ``fabric.save``.

    Raises:
        TypeError: ``loader`` is not sampled by a shardwise sampler.
    """
    return _sampler(loader).state_dict()


def load_state_dict(loader: Any, state: dict[str, Any]) -> int:
    """Restore a Fabric loader's sampler and make Fabric's epoch count continue from it.

    Args:
        loader: the loader ``fabric.setup_dataloaders`` returned in the new process, built as in
            the saved run (any world size).
        state: what :func:`state_dict` returned in the saved run.

    Returns:
        The epoch the next ``iter(loader)`` runs: the saved epoch if it was saved mid-epoch, the
        next one if it was saved after the epoch's last batch. Start the epoch loop there.

    Raises:
        TypeError: ``loader`` is not a Fabric loader sampled by a shardwise sampler.
        ValueError: ``state`` does not belong to this sampler (another dataset, seed or options).
    """
    loader = _fabric_loader(loader)
    sampler = _sampler(loader)
    sampler.load_state_dict(state)
    upcoming = sampler.epoch  # the saved epoch, or the next one after a completed epoch
    setattr(loader, _COUNTER, upcoming)
    return upcoming
