"""Rank and world size, resolved now: arguments, then ``torch.distributed``, then the launcher's environment.

The rules are pure (``shardwise._core.world``); this module asks torch and the environment.
"""

from __future__ import annotations

import os

from .._core.world import World, resolve_world


def torch_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` of an initialised default ``torch.distributed`` group, else ``None``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def current_world(num_replicas: int | None = None, rank: int | None = None) -> World:
    """Resolve rank and world size now (docs/design.md, "Rank and world size"): arguments, torch.distributed, env."""
    return resolve_world(num_replicas, rank, dist=torch_world(), env=os.environ)
