"""The loop every multi-process test runs on each rank: a DDP epoch, one collective per step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


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
