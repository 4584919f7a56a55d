"""The main job: `shardwise demo` runs real gloo ranks and reports a clean table."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardwise.samplers.worker_seeds import fork_advice
from shardwise.tools import demo, scenarios
from shardwise.tools.demo import run_demo
from shardwise.tools.scenarios import SCENARIOS, SHARD_FRACTIONS, SHARDED_SIZE

LOCALITY = "LocalitySampler(ShardedSource)"

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def every_scenario() -> tuple[list[demo.Row], list[dict[str, Any]]]:
    """The demo's every scenario on 3 ranks, 601 samples, 2 epochs: rows and per-rank reports (the next two tests)."""
    return run_demo(world_size=3, size=601, epochs=2, timeout=240)


def test_demo_every_scenario_equal_steps_no_overlap_full_coverage(
    every_scenario: tuple[list[demo.Row], list[dict[str, Any]]],
) -> None:
    """Every scenario on 3 ranks: rows all ok, equal steps on every rank."""
    rows, reports = every_scenario
    assert {row.scenario for row in rows} == {s.name for s in SCENARIOS if s.missing() is None}
    assert all(row.ok for row in rows), [row for row in rows if not row.ok]
    for name in reports[0]:
        assert len({tuple(report[name]["steps"]) for report in reports}) == 1


def test_locality_scenario_over_local_parquet_shards(every_scenario: tuple[list[demo.Row], list[dict[str, Any]]]) -> None:
    """The sharded scenario on 3 ranks over 601 samples in 6 uneven shards: equal steps, every id read once
    per epoch (plus the 2 documented padding ids), and each rank's first batch from one window of 2 shards.

    Its rows and reports in the run of every scenario (each scenario draws from its own seeded plan and files)."""
    pytest.importorskip("pyarrow")
    rows = [row for row in every_scenario[0] if row.scenario == LOCALITY]
    reports = every_scenario[1]
    assert [(row.epoch, row.rank) for row in rows] == [(e, r) for e in range(2) for r in range(3)]
    assert all(row.ok and row.coverage == 1.0 and row.padding == 2 for row in rows), rows
    assert {(row.batches, row.samples) for row in rows} == {(7, 201)}  # ceil(601 / 3) = 201 ids in 7 steps
    assert len({tuple(report[LOCALITY]["steps"]) for report in reports}) == 1
    bounds = np.round(np.asarray(SHARD_FRACTIONS) * 601).astype(int)
    for epoch in range(2):
        read = [i for report in reports for i in report[LOCALITY]["seen"][epoch]]
        assert set(read) == set(range(601)) and len(read) == 603  # the ids come from the shards' id column
        for report in reports:
            first = report[LOCALITY]["seen"][epoch][:32]
            assert len(set(np.searchsorted(bounds, first, side="right") - 1)) <= 2  # window=2: locality
    assert reports[0][LOCALITY]["seen"][0] != reports[0][LOCALITY]["seen"][1]  # shard order differs per epoch


def test_shards_hold_their_global_ids_and_are_capped(tmp_path: Path) -> None:
    """The scenario's files: 6 uneven shards whose id column is the global id, at most SHARDED_SIZE rows in all."""
    pytest.importorskip("pyarrow")
    scenarios._locality_files(tmp_path, 9_600)  # the command's default size
    loader, sampler = scenarios._locality(9_600, tmp_path)
    source: Any = loader.dataset
    assert source.shard_sizes.tolist() == [336, 408, 504, 192, 504, 456] and len(source) == SHARDED_SIZE
    assert [source[i]["id"] for i in range(0, SHARDED_SIZE, 97)] == list(range(0, SHARDED_SIZE, 97))
    assert sorted(sampler) == list(range(SHARDED_SIZE))  # one rank, here: every id once


def test_scenario_without_its_extra_is_skipped_with_a_note(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scenario whose optional module is missing is left out with one line, and the rest still runs."""
    sharded, locality = (next(s for s in SCENARIOS if s.name == name) for name in ("ShardedSampler", LOCALITY))
    missing = dataclasses.replace(locality, requires="shardwise_no_such_module")
    monkeypatch.setattr(demo, "SCENARIOS", [sharded, missing])
    rows, _ = run_demo(world_size=2, size=64, epochs=1, timeout=240)
    assert {row.scenario for row in rows} == {"ShardedSampler"} and all(row.ok for row in rows)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"skipped {LOCALITY}: needs shardwise_no_such_module"), out
    assert "pip install 'shardwise[demo]'" in out


def test_demo_command_line() -> None:
    """`python -m shardwise demo` exits 0 and prints the table."""
    result = subprocess.run(
        [sys.executable, "-m", "shardwise", "demo", "--world-size", "2", "--size", "300"],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "equal steps on every rank: True; epoch orders differ: yes, for all" in result.stdout
    assert "{'" not in result.stdout  # no raw dict
    assert "MixtureSampler: " in result.stdout and "samples an epoch over 300 held: stop='all_exhausted'" in result.stdout
    assert LOCALITY in result.stdout or f"skipped {LOCALITY}" in result.stdout
    assert "FAIL" not in result.stdout
    # The verify step: the ShardedSampler loader passes, a RandomSampler on every rank is caught (overlap).
    assert "verify caught the broken loader and passed the shardwise one: True" in result.stdout
    assert "    overlap: ranks train on the same samples" in result.stdout
    # What the reader sees is explained: a legend above the table, a header for every column, and
    # messages broken at word boundaries (a log viewer narrower than rich's 140 columns wraps mid-word).
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("┃ sampler"))
    assert [cell.strip() for cell in header.strip("┃").split("┃")][-1] == "check"
    assert all(cell.strip() for cell in header.strip("┃").split("┃")), header
    assert any(line.startswith("  padding: samples drawn twice") or "; padding: samples drawn twice" in line
               for line in lines), result.stdout  # fmt: skip
    messages = [line for line in lines if line and line[0] not in "┏┃┡│└"]
    assert max(map(len, messages)) <= demo.WRAP, max(messages, key=len)
    assert "  ScheduledBatchSampler: " in result.stdout and " batches a rank in epoch 0, " in result.stdout


def test_check_command_describes_resolution() -> None:
    """`shardwise check` prints the resolved rank, world size and seed source."""
    result = subprocess.run(
        [sys.executable, "-m", "shardwise", "check"], capture_output=True, text=True, timeout=120, check=False,
        env={"RANK": "1", "WORLD_SIZE": "2", "SHARDWISE_SEED": "5", "PATH": ""},
    )
    assert result.returncode == 0, result.stderr
    assert "world_size: 2" in result.stdout and "seed_source: SHARDWISE_SEED" in result.stdout
    # and whether this interpreter can hang forked DataLoader workers (CPython's gh-112275)
    assert f"python: {fork_advice()}\n" in result.stdout


def _row(scenario: str, drawn: int, data: int, padding: int | None = 0) -> demo.Row:
    return demo.Row(scenario, 0, 0, 1, drawn // 2, 0, padding, 1.0, 1, data=data, drawn=drawn)


def test_sample_counts_that_differ_from_the_header_are_explained() -> None:
    """The table's per-scenario counts: a mixture drawing more, shards holding fewer, each get a line saying why;
    a scenario drawing its data (padding aside) gets none; epoch orders are one sentence, never a raw dict."""
    rows = [_row("ShardedSampler", 9_600, 9_600), _row("PackedBatchSampler", 9_601, 9_600, padding=1),
            _row("MixtureSampler", 24_000, 9_600, padding=None), _row(LOCALITY, 2_400, 2_400)]  # fmt: skip
    notes = demo.size_notes(rows, 9_600)
    assert [note.split(":")[0] for note in notes] == ["MixtureSampler", LOCALITY]
    assert "24,000 samples an epoch over 9,600 held: stop='all_exhausted'" in notes[0]
    assert "2,400 samples an epoch over 2,400 held: its Parquet shards hold at most 2,400 rows" in notes[1]
    assert demo.orders_line({"a": True, "b": True}) == "epoch orders differ: yes, for all 2 samplers"
    assert demo.orders_line({"a": True, "b": False}) == "epoch orders differ: not for b"


def test_batches_and_padding_that_change_between_epochs_are_explained() -> None:
    """A scenario whose batches or padding differ by epoch gets one line with the figures and why; others none."""
    def row(scenario: str, epoch: int, batches: int, padding: int) -> demo.Row:
        return demo.Row(scenario, epoch, 0, batches, 4_800, 0, padding, 1.0, 1, data=9_600, drawn=9_600 + padding)

    rows = [row("ShardedSampler", 0, 150, 0), row("ShardedSampler", 1, 150, 0),
            row("BucketBatchSampler", 0, 311, 0), row("BucketBatchSampler", 1, 311, 26),
            row("ScheduledBatchSampler", 0, 225, 0), row("ScheduledBatchSampler", 1, 300, 0)]  # fmt: skip
    notes = demo.epoch_notes(rows, 9_600)
    assert [note.split(":")[0] for note in notes] == ["BucketBatchSampler", "ScheduledBatchSampler"]
    assert notes[0].startswith("BucketBatchSampler: padding 0 in epoch 0, 26 in epoch 1: a batch holds as many")
    assert notes[1].startswith("ScheduledBatchSampler: 225 batches a rank in epoch 0, 300 in epoch 1: the schedule")
    assert "batch size 32 for the first 4,800 (half of epoch 0), then 16" in notes[1]


def test_messages_wrap_at_word_boundaries() -> None:
    """Long messages break between words at most WRAP wide, continuation lines indented; a long word stays whole."""
    text = "fix: " + " ".join(["shardwise.shard_batches(batch_sampler)"] * 6) + " x" * 80
    lines = demo.wrap(text, 140, indent=4).splitlines()
    assert max(map(len, lines)) <= demo.WRAP and all(line.startswith("      ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == text
    assert demo.wrap("a" * 120, 80) == "a" * 120
