"""What a launcher gives one rank of a verify job: its environment, its seeds, and (simulated) its group.

Each rank gets what torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...), with the
variables other launchers set (SLURM, Open MPI, PMI) cleared so they cannot disagree; the global
``random``/``numpy``/``torch`` generators are seeded with that rank's own seed. In simulated mode
``torch.distributed`` answers ``is_initialized``, ``get_rank`` and ``get_world_size`` for the
simulated rank, so a sampler that asks the process group is verified without one; a collective
fails, and the report says to verify with ``spawn=True``.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

RUN_ID = "shardwise-verify"
MASTER_PORT = "29500"
CLEARED_ENV = (
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
)
"""Other launchers' rank variables, removed so only torchrun's describe the rank."""


def launcher_env(rank: int, world_size: int, local_world_size: int) -> dict[str, str]:
    """What torchrun sets for ``rank`` of ``world_size`` on nodes of ``local_world_size`` processes."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % local_world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(rank // local_world_size),
        "NODE_RANK": str(rank // local_world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": MASTER_PORT,
        "TORCHELASTIC_RUN_ID": RUN_ID,
    }


def nodes_for(world_size: int) -> int:
    """Processes per simulated node: two nodes when the world splits evenly (so local rank != rank)."""
    return world_size // 2 if world_size >= 2 and world_size % 2 == 0 else world_size


def seed_globals(seed: int) -> None:
    """Seed every global generator a sampler might read, as a process's own seeding would."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the legacy global state is what user samplers read)
    torch.manual_seed(seed)


@contextlib.contextmanager
def simulated_group(rank: int, world_size: int) -> Iterator[None]:
    """Answer ``torch.distributed``'s rank queries for a simulated rank (no collective works)."""
    import torch.distributed as dist

    names = ("is_available", "is_initialized", "get_rank", "get_world_size")
    saved = {name: getattr(dist, name) for name in names}
    fakes: dict[str, Callable[..., Any]] = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "get_rank": lambda group=None: rank,
        "get_world_size": lambda group=None: world_size,
    }
    for name, fake in fakes.items():
        setattr(dist, name, fake)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


@contextlib.contextmanager
def rank_environment(rank: int, world_size: int, *, simulated: bool) -> Iterator[None]:
    """Be ``rank`` of ``world_size`` as launched by torchrun; ``simulated``: with :func:`simulated_group` too."""
    env = launcher_env(rank, world_size, nodes_for(world_size))
    for name in CLEARED_ENV:
        os.environ.pop(name, None)
    os.environ.update(env)
    if simulated:
        with simulated_group(rank, world_size):
            yield
    else:
        yield
