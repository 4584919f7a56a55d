"""skip_ids on a MixtureSampler with adaptive weights: a skipped id never trains, wherever later updates draw it.

The positions that draw a skipped id are known only as far as the weight ledger reaches
(``ledger.known_until``); each update reveals more of them, and the epoch shrinks by those it
reveals (``len(sampler)`` is an upper bound until the epoch's weights are all known). The loop is
the recipe's: a plain loop over the sampler, ``record`` every batch, ``update`` when due. The
per-sample loss is a function of the sample, so any split of the samples over ranks reports the
same sums and every world size follows one ledger.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from shardwise import AdaptiveWeights, ExponentiatedGradient, MixtureSampler, when, which
from shardwise.tools.launch import run_distributed

SIZES = [100, 60, 30]
NUM_SAMPLES, INTERVAL, STEP, EPOCHS = 640, 128, 32, 2  # STEP: plan positions a global step, at any world size
SKIPPED = [(90, 110), (165, 185)]  # ids across sources 0 and 1, and in source 2 (the highest loss: drawn more)


def _sampler(world_size: int = 1, rank: int = 0, *, drop_last: bool = False, **plan: int) -> MixtureSampler:
    """``plan``: ``num_samples``, ``interval``, ``seed`` other than the module's."""
    adaptive = AdaptiveWeights(ExponentiatedGradient(rate=2.0), interval=plan.get("interval", INTERVAL))
    return MixtureSampler(SIZES, adaptive, num_samples=plan.get("num_samples", NUM_SAMPLES), block=64,
                          seed=plan.get("seed", 5), num_replicas=world_size, rank=rank, drop_last=drop_last)  # fmt: skip


def _skipping(world_size: int = 1, rank: int = 0, *, drop_last: bool = False, **plan: int) -> MixtureSampler:
    sampler = _sampler(world_size, rank, drop_last=drop_last, **plan)
    with pytest.warns(UserWarning, match="ends earlier than len"):
        sampler.skip_id_ranges(SKIPPED)
    return sampler


def _is_skipped(indices: Any) -> np.ndarray:
    array = np.asarray(indices)
    return np.logical_or.reduce([(first <= array) & (array < stop) for first, stop in SKIPPED])


def _loss(indices: Any) -> np.ndarray:
    """A made-up per-sample loss, a function of the sample alone; source 2 (ids 160-189) the highest."""
    array = np.asarray(indices)
    return (array % 7) / 3.0 + 2.0 * (array >= 160)


def _train(sampler: MixtureSampler, epochs: range, *, stop: int | None = None, on_update: Any = None,
           collective: bool = False, step: int = STEP) -> list[list[list[int]]]:  # fmt: skip
    """Per epoch, this rank's batches: record each, update when due; stop after ``stop`` batches in all."""
    per_rank = step // sampler.num_replicas
    out: list[list[list[int]]] = []
    done = 0
    for epoch in epochs:
        sampler.set_epoch(epoch)
        batches: list[list[int]] = []
        out.append(batches)
        batch: list[int] = []
        for index in sampler:
            batch.append(int(index))
            if len(batch) < per_rank:
                continue
            if collective:
                dist.all_reduce(torch.ones(1))  # a rank with a batch more or less fails here
            sampler.adaptive.record(_loss(batch), sampler.sources_of(batch))
            batches.append(batch)
            batch = []
            done += 1
            if sampler.adaptive.update_due():
                sampler.adaptive.update()
                if on_update is not None:
                    on_update(sampler, done)
            if stop is not None and done == stop:
                return out
        if batch:
            batches.append(batch)  # a last partial batch (a DataLoader with drop_last=False yields it)
    return out


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def _unskipped_plan(sampler: MixtureSampler, epoch: int) -> list[int]:
    """``epoch``'s plan under ``sampler``'s weight ledger with the skipped ids removed (the plan without skips)."""
    twin = _sampler()
    state = sampler.state_dict()
    state.pop("skip_ids")
    twin.load_state_dict(state)
    plan = twin.plan.units(epoch, np.arange(NUM_SAMPLES), 1)
    return [int(i) for i in plan if not _is_skipped(i)]


def test_skipped_ids_never_train_with_adaptive_weights() -> None:
    """Two epochs, a plain loop with record/update: no skipped id trains, everything else exactly as planned."""
    sampler = _skipping()
    announced = len(sampler)
    trained = _train(sampler, range(EPOCHS))
    assert sampler.adaptive.ledger.updates >= EPOCHS * NUM_SAMPLES // INTERVAL - 1  # the last one is due after the run
    for epoch, batches in enumerate(trained):
        flat = _flat(batches)
        assert int(_is_skipped(flat).sum()) == 0, f"epoch {epoch}: {int(_is_skipped(flat).sum())} skipped ids trained"
        assert flat == _unskipped_plan(sampler, epoch)
        assert len(flat) == sampler.plan.size(epoch)  # the size the ledger gives once every position is known
        assert [int(i) for i in sampler.plan.units(epoch, np.arange(len(flat)), 1)] == flat
    assert len(_flat(trained[0])) < announced  # the epoch shrank as the updates revealed where the ids are drawn
    for step in (0, 5, len(trained[0]) - 2):
        assert which(sampler, epoch=0, step=step, batch_size=STEP)[0].indices == trained[0][step]
    assert when(sampler, 170, epochs=0, batch_size=STEP) == []


def test_skip_ids_with_adaptive_weights_warns_at_the_callers_line() -> None:
    """skip_ids and skip_id_ranges warn that the epoch shrinks as updates come, pointing at the caller's line."""
    sampler = _sampler()
    for call in (lambda: sampler.skip_ids(3, 5), lambda: sampler.skip_id_ranges([[7, 9]])):
        with pytest.warns(UserWarning, match=r"len\(sampler\) said at its start") as caught:
            call()
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name]
    assert sampler.skipped_ids == [[0, 0, 3, 5], [0, 0, 7, 9]]


def test_a_resume_at_an_update_continues_the_same_run() -> None:
    """Checkpoint right after the first update of epoch 0, resume in a new sampler: the same batches, the same ledger."""
    whole = _skipping()
    expected = _train(whole, range(EPOCHS))
    saved: dict[str, Any] = {}

    def save(sampler: MixtureSampler, done: int) -> None:
        saved.setdefault("state", sampler.state_dict())
        saved.setdefault("done", done)

    head = _train(_skipping(), range(EPOCHS), stop=6, on_update=save)  # the first update: after 3 or 4 batches
    state = saved["state"]
    assert state["epoch"] == 0 and state["consumed"] == saved["done"] * STEP
    resumed = _sampler()
    resumed.load_state_dict(state)
    tail = _train(resumed, range(EPOCHS))
    assert _flat(head[0])[: state["consumed"]] + _flat(tail[0]) == _flat(expected[0])
    assert _flat(tail[1]) == _flat(expected[1])
    assert (resumed.adaptive.ledger.shares == whole.adaptive.ledger.shares).all()
    assert resumed.skipped_ids == whole.skipped_ids


# -- 2 real gloo ranks: the same run, a checkpoint each way between world sizes 1 and 2 ------------------------------
def _interleave(per_rank: list[list[int]], world_size: int) -> list[int]:
    return [per_rank[q % world_size][q // world_size] for q in range(sum(len(units) for units in per_rank))]


EDGE = {"num_samples": 641, "interval": 64}
EDGE_SEEDS = {False: 0, True: 3}  # (by drop_last) where the last step's units are drawn before the size is final
EDGE_STEP = 16


def _prefetching_epoch(sampler: MixtureSampler) -> list[int]:
    """Epoch 0 drawn as far ahead as the ledger allows (each pull empties the pass's current chunk, which is cut
    where the known weights end), trained step by step: each rank reaches the epoch's last units before the update
    that reveals the plan's last positions, and so before the epoch's size is final."""
    per_rank = EDGE_STEP // sampler.num_replicas
    units = iter(sampler)
    drawn: list[int] = []
    trained: list[int] = []
    while True:
        for index in itertools.islice(units, per_rank - min(len(drawn), per_rank)):
            drawn.append(int(index))
        live = sampler._pass
        if live is not None and live.current is not None:
            drawn.extend(int(index) for index in itertools.islice(units, live.current.__length_hint__()))
        batch, drawn = drawn[:per_rank], drawn[per_rank:]
        dist.all_reduce(torch.ones(1))  # a rank with a batch more or less fails here
        trained += batch
        if len(batch) < per_rank:
            return trained
        sampler.adaptive.record(_loss(batch), sampler.sources_of(batch))
        position = sampler.adaptive.trained_position(0, len(trained) * sampler.num_replicas)  # the loop's count
        if sampler.adaptive.update_due(position):
            sampler.adaptive.update(position=position)


def _job(rank: int, world_size: int, directory: str) -> dict[str, Any]:
    folder = Path(directory)
    results: dict[str, Any] = {}
    for drop_last in (False, True):

        def save(sampler: MixtureSampler, done: int, drop_last: bool = drop_last) -> None:
            if rank == 0 and sampler.adaptive.ledger.updates == 2:  # the second update, in epoch 0
                torch.save(sampler.state_dict(), folder / f"w2-{drop_last}.pt")

        sampler = _skipping(world_size, rank, drop_last=drop_last)
        results[f"whole-{drop_last}"] = [_flat(b) for b in _train(sampler, range(EPOCHS), on_update=save,
                                                                   collective=True)]  # fmt: skip
        results[f"sizes-{drop_last}"] = [sampler.plan.size(epoch) for epoch in range(EPOCHS)]
        resumed = _sampler(world_size, rank, drop_last=drop_last)
        resumed.load_state_dict(torch.load(folder / f"w1-{drop_last}.pt", weights_only=True))
        results[f"resumed-{drop_last}"] = [_flat(b) for b in _train(resumed, range(EPOCHS), collective=True)]
        edge = _skipping(world_size, rank, drop_last=drop_last, seed=EDGE_SEEDS[drop_last], **EDGE)
        results[f"edge-{drop_last}"] = _prefetching_epoch(edge)
    return results


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_gloo_ranks_never_train_skipped_ids_and_resume_across_world_sizes(tmp_path: Path) -> None:
    """W=2 (pad and drop_last) equals W=1: no skipped id, one ledger; checkpoints W=1 -> W=2 and W=2 -> W=1 exact."""
    reference: dict[bool, list[list[int]]] = {}
    edges: dict[bool, tuple[list[int], int]] = {}
    for drop_last in (False, True):
        edge = _skipping(drop_last=drop_last, seed=EDGE_SEEDS[drop_last], **EDGE)
        edges[drop_last] = (_flat(_train(edge, range(1), step=EDGE_STEP)[0]), edge.plan.size(0))

        def save(sampler: MixtureSampler, done: int, drop_last: bool = drop_last) -> None:
            if sampler.adaptive.ledger.updates == 1:  # the first update, in epoch 0
                torch.save(sampler.state_dict(), tmp_path / f"w1-{drop_last}.pt")

        reference[drop_last] = [_flat(b) for b in _train(_skipping(drop_last=drop_last), range(EPOCHS),
                                                         on_update=save)]  # fmt: skip
    ranks = run_distributed(_job, 2, str(tmp_path), timeout=240, collective_timeout=30)
    for drop_last in (False, True):
        sizes = ranks[0][f"sizes-{drop_last}"]
        assert ranks[1][f"sizes-{drop_last}"] == sizes
        for epoch in range(EPOCHS):
            per_rank = [result[f"whole-{drop_last}"][epoch] for result in ranks]
            assert len(per_rank[0]) == len(per_rank[1]), json.dumps([len(u) for u in per_rank])
            merged = _interleave(per_rank, 2)
            assert int(_is_skipped(merged).sum()) == 0
            kept = sizes[epoch] - sizes[epoch] % 2 if drop_last else sizes[epoch]
            assert merged[:kept] == reference[drop_last][epoch][:kept]
            assert len(merged) == (kept if drop_last else kept + kept % 2)
        # W=1 checkpoint after the first update, resumed at W=2.
        early = torch.load(tmp_path / f"w1-{drop_last}.pt", weights_only=True)["consumed"]
        for epoch, start in enumerate([early, 0]):
            merged = _interleave([result[f"resumed-{drop_last}"][epoch] for result in ranks], 2)
            assert int(_is_skipped(merged).sum()) == 0
            kept = sizes[epoch] - (sizes[epoch] - start) % 2 if drop_last else sizes[epoch]
            assert merged[: kept - start] == reference[drop_last][epoch][start:kept]
        # W=2 checkpoint after the second update, resumed at W=1.
        state = torch.load(tmp_path / f"w2-{drop_last}.pt", weights_only=True)
        late = _sampler(drop_last=drop_last)
        late.load_state_dict(state)
        tail = [_flat(b) for b in _train(late, range(EPOCHS))]
        assert int(_is_skipped(tail[0] + tail[1]).sum()) == 0
        assert tail[0] == reference[drop_last][0][state["consumed"] :] and tail[1] == reference[drop_last][1]
        # Drawn ahead to the epoch's last units before its size is final: equal lengths, the plan, no skipped id.
        expected, size = edges[drop_last]
        per_rank = [result[f"edge-{drop_last}"] for result in ranks]
        assert len(per_rank[0]) == len(per_rank[1])
        merged = _interleave(per_rank, 2)
        kept = size - size % 2 if drop_last else size
        assert merged[:kept] == expected[:kept] and len(merged) == (kept if drop_last else kept + kept % 2)
        assert int(_is_skipped(merged).sum()) == 0
