"""``shardwise demo``: a real multi-process run on CPU that shows what every rank drew.

Each scenario builds a DataLoader around a shardwise sampler. Every rank (a spawned process in a
real gloo group) iterates it for some epochs with an ``all_reduce`` every step, exactly as a DDP
training loop would, and reports the indices it saw. The parent checks and tabulates them: per
rank the batches and samples, the overlap with other ranks (0 but for the documented padding),
the coverage of the dataset, and the seed every rank resolved.

The scenarios are in ``shardwise.tools.scenarios`` (a later sampler joins the demo by adding one
``Scenario`` to ``SCENARIOS``); the files of a scenario over files are written once, in the parent,
into a temporary folder that every rank reads and that is removed after the run.

The demo ends with ``shardwise.verify`` run before training on two loaders (``VERIFIED``): the
ShardedSampler one, which must pass, and the classic mistake, a plain ``RandomSampler`` on every
rank, which must be caught.
"""

from __future__ import annotations

import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler

from .launch import run_distributed
from .scenarios import EPOCHS_WHY, SCENARIOS, IndexDataset, sharded_scenario

VERIFY_SIZE = 4_800
VERIFIED: list[tuple[str, str, bool]] = [
    ("DataLoader(sampler=ShardedSampler)", "shardwise.tools.demo:sharded_loader", True),
    ("DataLoader(sampler=RandomSampler) on every rank", "shardwise.tools.demo:unsharded_loader", False),
]
"""``(what, factory, should pass)`` for the verify step of the demo."""


def sharded_loader() -> DataLoader[Any]:
    """The ShardedSampler scenario's loader: the verifier finds nothing."""
    return sharded_scenario(VERIFY_SIZE)[0]


def unsharded_loader() -> DataLoader[Any]:
    """The classic mistake: each rank shuffles the whole dataset, seeded differently; the verifier catches it."""
    dataset = IndexDataset(VERIFY_SIZE)
    return DataLoader(dataset, batch_size=32, sampler=RandomSampler(dataset))


def run_verify(*, world_size: int = 2, timeout: float = 300.0) -> list[tuple[str, bool, Any]]:
    """``(what, should pass, VerifyReport)`` for every loader of ``VERIFIED``."""
    from .verify import verify_many

    reports = verify_many([factory for _, factory, _ in VERIFIED], world_size=world_size, epochs=2, timeout=timeout)
    return [(what, should, report) for (what, _, should), report in zip(VERIFIED, reports, strict=True)]


def _folder(root: str, name: str) -> Path:
    return Path(root) / "".join(c if c.isalnum() else "-" for c in name)


def _rank_main(rank: int, world_size: int, names: list[str], size: int, epochs: int, root: str) -> dict[str, Any]:
    """One rank: iterate every scenario like a DDP loop, all_reduce each step, report what it saw."""
    import torch.distributed as dist

    report: dict[str, Any] = {}
    scenarios = {s.name: s for s in SCENARIOS}
    for name in names:
        scenario = scenarios[name]
        loader, sampler = scenario.build(size, _folder(root, name)) if scenario.files else scenario.build(size)
        seen: list[list[int]] = []
        steps: list[int] = []
        started = time.perf_counter()
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            drawn: list[int] = []
            step = 0
            for batch in loader:
                # Every rank must reach every collective: a rank with one batch more would hang here.
                count = torch.tensor([len(batch)], dtype=torch.int64)
                dist.all_reduce(count)
                drawn += batch.tolist()
                step += 1
            seen.append(drawn)
            steps.append(step)
        report[name] = {
            "seen": seen,
            "steps": steps,
            "seconds": time.perf_counter() - started,
            "describe": sampler.describe(),
        }
    return report


@dataclass(frozen=True)
class Row:
    scenario: str
    epoch: int
    rank: int
    batches: int
    samples: int
    overlap: int | None
    padding: int | None
    coverage: float | None
    seed: int
    data: int = 0
    """The samples the scenario's data holds."""
    drawn: int = 0
    """The samples all ranks drew in this epoch."""

    @property
    def ok(self) -> bool:
        if self.overlap is None or self.padding is None or self.coverage is None:
            return True  # draws with replacement: only equal steps are required
        return self.overlap <= self.padding and self.coverage >= 1.0


def summarise(reports: list[dict[str, Any]], size: int) -> list[Row]:
    """Turn every rank's report into table rows, checking overlap and coverage per epoch."""
    scenarios = {s.name: s for s in SCENARIOS}
    rows = []
    for name in reports[0]:
        tracked = scenarios[name].tracked(size)
        data = scenarios[name].data_size(size)
        for epoch in range(len(reports[0][name]["seen"])):
            per_rank = [Counter(report[name]["seen"][epoch]) for report in reports]
            drawn = sum(sum(counts.values()) for counts in per_rank)
            covered = padding = None
            if tracked is not None:
                union: Counter[int] = Counter()
                for counts in per_rank:
                    union.update({i: c for i, c in counts.items() if i in tracked})
                covered = len(union) / len(tracked) if tracked else 1.0
                padding = max(sum(union.values()) - len(tracked), 0)
            for rank, counts in enumerate(per_rank):
                overlap = None
                if tracked is not None:
                    others = set().union(*(set(c) for r, c in enumerate(per_rank) if r != rank))
                    overlap = len(set(counts) & others & tracked)
                rows.append(
                    Row(
                        scenario=name,
                        epoch=epoch,
                        rank=rank,
                        batches=reports[rank][name]["steps"][epoch],
                        samples=sum(counts.values()),
                        overlap=overlap,
                        padding=padding,
                        coverage=covered,
                        seed=reports[rank][name]["describe"]["seed"],
                        data=data,
                        drawn=drawn,
                    )
                )
    return rows


def run_demo(
    *, world_size: int = 2, size: int = 9_600, epochs: int = 2, names: list[str] | None = None, timeout: float = 300.0
) -> tuple[list[Row], list[dict[str, Any]]]:
    """Run the demo and return its rows (and the raw per-rank reports).

    A scenario whose optional extra is missing is left out, with a one-line note on stdout.
    """
    unknown = sorted(set(names or ()) - {s.name for s in SCENARIOS})
    if unknown:
        raise ValueError(f"names should be scenarios of the demo, but got {unknown}; accepted: "
                         f"{[s.name for s in SCENARIOS]}")  # fmt: skip
    chosen = [s for s in SCENARIOS if names is None or s.name in names]
    for scenario in chosen:
        note = scenario.missing()
        if note:
            print(note, flush=True)
    chosen = [s for s in chosen if s.missing() is None]
    with tempfile.TemporaryDirectory(prefix="shardwise-demo-") as root:
        for scenario in chosen:
            if scenario.files is not None:
                folder = _folder(root, scenario.name)
                folder.mkdir()
                scenario.files(folder, size)
        names = [s.name for s in chosen]
        reports = run_distributed(_rank_main, world_size, names, size, epochs, root, timeout=timeout)
    return summarise(reports, size), reports


def size_notes(rows: list[Row], size: int) -> list[str]:
    """One line for each scenario whose data holds other than ``size`` samples or whose epoch draws other
    than its data holds (beyond the padding an even split adds): the table's sample counts, explained."""
    scenarios = {s.name: s for s in SCENARIOS}
    notes = []
    for name in dict.fromkeys(row.scenario for row in rows):
        mine = [row for row in rows if row.scenario == name]
        data, drawn = mine[0].data, max(row.drawn for row in mine)
        padding = max((row.padding or 0) for row in mine)
        if data == size and abs(drawn - data) <= max(padding, len(mine)):
            continue
        why = scenarios[name].why or "see its sampler's documentation"
        notes.append(f"{name}: {drawn:,} samples an epoch over {data:,} held: {why}")
    return notes


def epoch_notes(rows: list[Row], size: int) -> list[str]:
    """One line for each scenario whose batches a rank, or padding, differ between epochs: the figures, and why."""
    scenarios = {s.name: s for s in SCENARIOS}
    notes = []
    for name in dict.fromkeys(row.scenario for row in rows):
        first = sorted((row for row in rows if row.scenario == name and row.rank == 0), key=lambda row: row.epoch)
        said = []
        if len({row.batches for row in first}) > 1:
            said.append(f"{first[0].batches:,} batches a rank in epoch {first[0].epoch}, "
                        + ", ".join(f"{row.batches:,} in epoch {row.epoch}" for row in first[1:]))
        if len({row.padding for row in first}) > 1:
            said.append("padding " + ", ".join(f"{_count(row.padding)} in epoch {row.epoch}" for row in first))
        if said:
            why = scenarios[name].epochs_why
            notes.append(f"{name}: {'; '.join(said)}: {EPOCHS_WHY if why is None else why(size)}")
    return notes


def _count(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


LEGEND = (
    "batches: the steps this rank took; samples: the samples it drew; epoch total: the samples all ranks drew in the "
    "epoch; data: the samples the data holds",
    "overlap: samples this rank drew that another rank drew too; padding: samples drawn twice in the epoch so that "
    "every rank takes as many steps (the last step repeats samples of the epoch); overlap must not exceed "
    "padding",
    "coverage: the share of the data drawn in the epoch, which must be 100%; n/a: draws with replacement, where "
    "overlap, padding and coverage do not apply",
    "seed: the seed every rank resolved; check: ok when overlap <= padding and coverage is 100%; otherwise the row "
    "fails and the demo exits with status 1",
)
"""What the demo's table shows, column by column: printed above it."""

WRAP = 100
"""Messages wrap at word boundaries at most this wide (the table is as wide as it needs)."""


def wrap(text: str, width: int, indent: int = 0, hanging: int = 2) -> str:
    """``text`` broken at word boundaries into lines of at most ``min(width, WRAP)`` characters (a word longer than
    that stays whole), indented by ``indent``, continuation lines by ``hanging`` more."""
    return textwrap.fill(text, width=min(width, WRAP), initial_indent=" " * indent,
                         subsequent_indent=" " * (indent + hanging), break_long_words=False,
                         break_on_hyphens=False)  # fmt: skip


def orders_line(differ: dict[str, bool]) -> str:
    """``epoch orders differ``, said for every sampler at once, or naming those whose order repeats."""
    same = [name for name, changed in differ.items() if not changed]
    if not same:
        return f"epoch orders differ: yes, for all {len(differ)} samplers"
    return f"epoch orders differ: not for {', '.join(same)}"


def epochs_differ(reports: list[dict[str, Any]]) -> dict[str, bool]:
    """Whether rank 0's order differs between consecutive epochs, per scenario."""
    return {
        name: all(
            not np.array_equal(reports[0][name]["seen"][e], reports[0][name]["seen"][e + 1])
            for e in range(len(reports[0][name]["seen"]) - 1)
        )
        for name in reports[0]
    }
