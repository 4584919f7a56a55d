"""The loop every multi-process test runs on each rank: a DDP epoch, one collective per step."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


def fork_is_safe(version: tuple[int, int, int] = sys.version_info[:3]) -> bool:
    """Whether this CPython has the fix for gh-112275 (a fork while another thread creates or deletes its thread
    state can deadlock the child in ``os.fork()``): 3.10.15+, 3.11.8+, 3.12.1+."""
    return version >= (3, 12, 1) or (3, 11, 8) <= version < (3, 12) or (3, 10, 15) <= version < (3, 11)


def worker_context() -> str:
    """The ``multiprocessing_context`` for DataLoader workers in a DDP test rank: ``"fork"`` (a spawned rank would
    spawn its workers, seconds each), or ``"forkserver"`` on a CPython without the fix for gh-112275.

    In a rank, native threads of torch.distributed and DDP enter Python; a worker forked at that moment
    hangs in ``os.fork()`` on such a CPython (about 1 run in 35 of the Lightning resume test on 3.11.7).
    The fork server is a fresh process with no such threads; it imports torch and shardwise once, so
    each worker it forks starts in milliseconds.
    """
    if fork_is_safe():
        return "fork"
    multiprocessing.set_forkserver_preload(["torch", "numpy", "shardwise.tools.scenarios"])  # the tests' datasets
    return "forkserver"


def lockstep_epochs(loader: Iterable[Any], sampler: Any, epochs: int = 2) -> list[list[list[int]]]:
    """Per epoch, the batches this rank drew, with ``sampler.set_epoch(epoch)`` before each epoch.

    Before each epoch the ranks compare ``len(sampler)`` (it must be equal everywhere, known before
    the first batch); then every step all_reduces, as a DDP training step would: a rank with one
    step more than another blocks there until the group's collective timeout, so a length
    mismatch fails, never hangs.
    """
    drawn_per_epoch = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        planned = torch.tensor([len(sampler)])
        dist.all_reduce(planned, op=dist.ReduceOp.MAX)
        if int(planned) != len(sampler):
            raise RuntimeError(f"this rank plans {len(sampler)} units, another plans {int(planned)}")
        drawn = []
        for batch in loader:
            flag = torch.ones(1)
            dist.all_reduce(flag)
            drawn.append(batch.tolist())
        drawn_per_epoch.append(drawn)
    return drawn_per_epoch
