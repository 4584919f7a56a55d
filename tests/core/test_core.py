"""Core pure functions: plan arithmetic, seeds, world resolution, state and epoch rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise._core.plan import Even, pass_end, rank_count, rank_positions
from shardwise._core.seeds import derive_seed, resolve_seed
from shardwise._core.state import Progress
from shardwise._core.world import resolve_world
from tests.strategies import seeds, world_and_size


@settings(max_examples=200, deadline=None)
@given(world_and_size(), st.integers(min_value=0, max_value=40), st.sampled_from(list(Even)))
def test_rank_counts_cover_the_plan_within_w_minus_one(shape, start, even) -> None:
    """Per-rank counts are equal and pad/drop differ from the remaining plan by at most W-1 units."""
    world_size, total = shape
    count = rank_count(total, start, world_size, even)
    remaining = max(total - start, 0)
    dealt = count * world_size
    if even is Even.PAD:
        assert remaining <= dealt < remaining + world_size
    else:
        assert remaining - world_size < dealt <= remaining
    assert pass_end(total, start, world_size, even) >= total


def test_rank_positions_stride_and_wrap() -> None:
    """Rank r takes start+r, +W, ...; positions past the plan wrap to its start."""
    assert rank_positions(0, 1, 3, 0, 4, 10).tolist() == [1, 4, 7, 0]
    assert rank_positions(6, 2, 3, 0, 2, 10).tolist() == [8, 1]


@given(seeds, st.integers(0, 1000))
def test_derived_seeds_are_hashes_not_sums(seed: int, epoch: int) -> None:
    """derive_seed(s, e) != derive_seed(s+1, e-1): sub-seeds are hashed, never added."""
    if epoch:
        assert derive_seed(seed, epoch, "shuffle") != derive_seed(seed + 1, epoch - 1, "shuffle")
    assert derive_seed(seed, epoch, "shuffle") != derive_seed(seed, epoch, "other")
    assert derive_seed(seed, epoch, "shuffle") == derive_seed(seed, epoch, "shuffle")


def test_derived_seed_is_pinned_across_releases() -> None:
    """A known value: plans must not change silently between versions or platforms."""
    assert derive_seed(1234, 5, "shuffle") == 4714677707376452948


def test_seed_resolution_order() -> None:
    """Argument, then SHARDWISE_SEED, then the job identity, then random only for one process."""
    assert resolve_seed(5, world_size=4, env={"SHARDWISE_SEED": "9"}) == (5, "argument")
    assert resolve_seed(None, world_size=4, env={"SHARDWISE_SEED": "9"}) == (9, "SHARDWISE_SEED")
    job = {"SLURM_JOB_ID": "77", "MASTER_PORT": "1234"}
    seed, source = resolve_seed(None, world_size=4, env=job)
    assert seed == resolve_seed(None, world_size=4, env=dict(job))[0]
    assert seed != resolve_seed(None, world_size=4, env={"SLURM_JOB_ID": "78", "MASTER_PORT": "1234"})[0]
    assert "SLURM_JOB_ID" in source
    with pytest.raises(ValueError, match=r"SHARDWISE_SEED should be a non-negative integer, but got SHARDWISE_SEED='x'"):
        resolve_seed(None, world_size=1, env={"SHARDWISE_SEED": "x"})


def _pair(world) -> tuple[int, int]:
    return world.rank, world.world_size


def test_world_resolution_order() -> None:
    """Explicit > torch.distributed > torchrun > SLURM > single process; LOCAL_RANK is never used."""
    env = {"RANK": "3", "WORLD_SIZE": "8", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "LOCAL_RANK": "0"}
    assert _pair(resolve_world(None, None, dist=(5, 6), env=env)) == (5, 6)
    assert _pair(resolve_world(None, None, dist=None, env=env)) == (3, 8)
    slurm = {k: v for k, v in env.items() if not k.endswith(("RANK", "WORLD_SIZE")) or k.startswith("SLURM")}
    assert _pair(resolve_world(None, None, dist=None, env=slurm)) == (1, 2)
    assert _pair(resolve_world(None, None, dist=None, env={"LOCAL_RANK": "1"})) == (0, 1)
    assert resolve_world(4, 2, dist=(5, 6), env=env).source == "arguments"
    assert _pair(resolve_world(None, 1, dist=None, env=env)) == (1, 8)


def test_progress_rules() -> None:
    """set_epoch wins; a completed pass auto-advances; a loaded position survives set_epoch of its epoch."""
    progress = Progress()
    assert progress.begin() == (0, 0)
    progress.consumed, progress.completed = 10, True
    assert progress.upcoming_epoch() == 1
    assert progress.begin() == (1, 0)
    progress.set_epoch(7)
    assert progress.begin() == (7, 0)
    progress.load(3, 4, total=10)
    progress.set_epoch(3)
    assert progress.begin() == (3, 4)
    progress.load(3, 10, total=10)
    progress.set_epoch(3)
    assert progress.begin() == (3, 10)  # the saved epoch was complete: nothing left of it


def test_progress_a_new_pass_starts_its_epoch_unless_a_loaded_position_waits() -> None:
    """NOTE [ A new pass starts its epoch ]: a broken-off position restarts; a loaded one, even after set_epoch, resumes."""
    progress = Progress()
    progress.set_epoch(2)
    assert progress.begin() == (2, 0)
    progress.consumed = 6  # the pass was broken off after 6 units: state_dict says 6
    assert progress.begin() == (2, 0)
    progress.consumed = 6
    progress.set_epoch(2)  # Lightning sets the epoch again before the next validation run
    assert progress.begin() == (2, 0)
    progress.load(2, 6, total=10)
    progress.set_epoch(2)
    assert progress.begin() == (2, 6)
    progress.consumed = 8  # the resumed pass broken off in turn: the next pass starts the epoch
    assert progress.begin() == (2, 0)
