"""Where rank and world size come from: explicit arguments, then torch.distributed, then the launcher.

This module is pure: the caller passes what ``torch.distributed`` reports (or ``None``) and the
environment, so the resolution order can be tested without a process group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import check_int

# (rank variable, world-size variable, launcher), most specific first: torchrun inside a SLURM
# allocation sets RANK/WORLD_SIZE per process while SLURM_NTASKS may count one task per node.
LAUNCHER_ENV = (
    ("RANK", "WORLD_SIZE", "torchrun"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "MPI (PMI)"),
)


@dataclass(frozen=True)
class World:
    """This process's global rank, the number of ranks, and where each came from."""

    rank: int
    world_size: int
    source: str


def check_world_args(num_replicas: object, rank: object) -> tuple[int | None, int | None]:
    """Validate explicit ``num_replicas``/``rank`` at construction (either may be ``None``).

    A rank out of range says "Invalid rank", as torch's ``DistributedSampler`` does (code and
    tests written for it match that), then the interval and the value.
    """
    replicas = None if num_replicas is None else check_int("num_replicas", num_replicas, minimum=1)
    rank_ = None if rank is None else check_int("rank", rank)
    if rank_ is not None and rank_ < 0:
        raise ValueError(f"Invalid rank: rank should be a non-negative integer, but got rank={rank!r}")
    if replicas is not None and rank_ is not None and rank_ >= replicas:
        raise ValueError(
            f"Invalid rank: rank should be in the interval [0, {replicas - 1}] for num_replicas={replicas}, "
            f"but got rank={rank_}"
        )
    return replicas, rank_


def _env_int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"environment variable {name} should be an integer, but got {name}={env[name]!r}") from None


def resolve_world(
    num_replicas: int | None,
    rank: int | None,
    *,
    dist: tuple[int, int] | None,
    env: Mapping[str, str],
) -> World:
    """Resolve global rank and world size; each explicit argument wins over every other source.

    Args:
        num_replicas: explicit world size, or ``None``.
        rank: explicit global rank, or ``None``.
        dist: ``(rank, world_size)`` of an initialised ``torch.distributed`` default group, or ``None``.
        env: the process environment (launcher variables). ``LOCAL_RANK`` is never used: it
            repeats on every node.

    Raises:
        ValueError: if the resolved rank is outside ``[0, world_size)``.
    """
    source_rank, source_size, source = 0, 1, "single process"
    if dist is not None:
        source_rank, source_size = dist
        source = "torch.distributed"
    else:
        for rank_var, size_var, launcher in LAUNCHER_ENV:
            if rank_var in env and size_var in env:
                source_rank, source_size = _env_int(env, rank_var), _env_int(env, size_var)
                source = f"{launcher} ({rank_var}/{size_var})"
                break
    world_size = source_size if num_replicas is None else num_replicas
    global_rank = source_rank if rank is None else rank
    if num_replicas is not None or rank is not None:
        source = "arguments" if (num_replicas is not None and rank is not None) else f"arguments + {source}"
    if world_size < 1:
        raise ValueError(f"world size should be a positive integer, but {source} gave world_size={world_size}")
    if not 0 <= global_rank < world_size:
        raise ValueError(
            f"rank should be in the interval [0, {world_size - 1}] for world_size={world_size}, "
            f"but {source} gave rank={global_rank}"
        )
    return World(global_rank, world_size, source)
