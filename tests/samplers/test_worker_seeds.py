"""Per-rank, per-worker seeds: hash-derived from the global rank, distinct where ``42 + local_rank`` collides."""

from __future__ import annotations

import functools
import itertools
import logging
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import shardwise

NODES, RANKS_PER_NODE, WORKERS = 2, 2, 2


def _stream(seed: int) -> tuple[float, float, float]:
    shardwise.samplers.worker_seeds.seed_everything_in_worker(seed)
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_two_nodes_two_ranks_two_workers_draw_distinct_streams() -> None:
    """2 nodes x 2 ranks x 2 workers: 8 distinct seeds and streams; 42 + local_rank gives only 2."""
    pairs = [(node * RANKS_PER_NODE + local, local, worker)
             for node, local, worker in itertools.product(range(NODES), range(RANKS_PER_NODE), range(WORKERS))]  # fmt: skip
    ours = {(g, w): shardwise.worker_seed(42, rank=g, worker_id=w) for g, _, w in pairs}
    assert len(set(ours.values())) == 8
    assert len({_stream(s) for s in ours.values()}) == 8
    common = {(g, w): 42 + local for g, local, w in pairs}
    assert len(set(common.values())) == 2  # every node repeats it, and workers share it


def test_worker_seed_is_identical_across_reruns_and_epochs_differ() -> None:
    """Same inputs, same seed (no per-process salt); another epoch gives another seed."""
    assert shardwise.worker_seed(7, rank=3, worker_id=1) == shardwise.worker_seed(7, rank=3, worker_id=1)
    assert shardwise.worker_seed(7, rank=3, worker_id=1, epoch=1) != shardwise.worker_seed(7, rank=3, worker_id=1)
    assert shardwise.worker_seed(7, rank=1, worker_id=0) != shardwise.worker_seed(8, rank=0, worker_id=0)


def test_worker_seed_resolves_the_global_rank_like_samplers(monkeypatch: pytest.MonkeyPatch) -> None:
    """rank=None reads the launcher's global RANK, never LOCAL_RANK."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert shardwise.worker_seed(1, worker_id=0) == shardwise.worker_seed(1, rank=3, worker_id=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"rank": -1}, "rank"), ({"worker_id": -2}, "worker_id"), ({"epoch": True}, "epoch"), ({"epoch": -1}, "epoch")],
)
def test_worker_seed_bad_input(kwargs: dict[str, Any], match: str) -> None:
    """Bad rank, worker id or epoch is refused, naming the parameter."""
    with pytest.raises((TypeError, ValueError), match=match):
        shardwise.worker_seed(1, **kwargs)


def test_worker_seed_refuses_a_missing_seed() -> None:
    """seed=None is refused: a worker seed needs the run's base seed."""
    with pytest.raises(TypeError, match="seed"):
        shardwise.worker_seed(None)  # type: ignore[arg-type]


class Draws(Dataset[list[float]]):
    """Each item draws from the worker's global random, numpy and torch generators."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> list[float]:
        return [random.random(), float(np.random.random()), float(torch.rand(1))]


@pytest.mark.timeout(120)
def test_seed_worker_seeds_each_worker_distinctly_and_reproducibly(caplog: pytest.LogCaptureFixture) -> None:
    """seed_worker as worker_init_fn: workers differ, a rerun repeats, and the seed is logged (main process)."""

    def run() -> list[list[float]]:
        loader = DataLoader(Draws(), batch_size=None, num_workers=2, multiprocessing_context="spawn",
                            worker_init_fn=functools.partial(shardwise.seed_worker, seed=11))  # fmt: skip
        return [list(map(float, item)) for item in loader]

    first, second = run(), run()
    assert first == second
    assert first[0] != first[1]  # items 0 and 1 come from workers 0 and 1
    with caplog.at_level(logging.INFO, logger="shardwise"):
        shardwise.seed_worker(0, seed=11)
    assert "worker seed: rank=0 worker_id=0 base_seed=11" in caplog.text
    assert shardwise.worker_seeds()[-1]["seed"] == shardwise.worker_seed(11, rank=0, worker_id=0)
