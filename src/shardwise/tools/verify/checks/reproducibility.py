"""Reproducibility: the plan depends on nothing but the seed (not on global RNG state, the clock, or ``hash()``).

Runs compared: ``A`` and ``A2`` (two builds in one process, same seeds), ``B`` (other global
seeds), ``C`` (a fresh process with another ``PYTHONHASHSEED``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..report import ERROR, PASS, SKIPPED, CheckResult, Finding
from ..worker import RankRun
from .facts import Facts, first_difference


def _differences(a: list[RankRun], b: list[RankRun]) -> list[tuple[int, int, int]]:
    out = []
    for r, (x, y) in enumerate(zip(a, b, strict=False)):
        for e, (ex, ey) in enumerate(zip(x.epochs, y.epochs, strict=False)):
            if not ex.same(ey):
                out.append((r, e, first_difference(ex, ey)))
    return out


@dataclass(frozen=True)
class PlanChange:
    """What a difference between two runs means: ``message`` and ``summary`` name {rank}, {epoch}, {step}."""

    message: str
    fix: str
    summary: str

    def error(self, check: str, diffs: list[tuple[int, int, int]]) -> CheckResult:
        """``check``'s error at the first of ``diffs`` (rank, epoch, first differing step)."""
        r, e, step = diffs[0]
        where = {"rank": r, "epoch": e, "step": step}
        data = {**where, "ranks": sorted({d[0] for d in diffs})}
        finding = Finding(check, ERROR, self.message.format(**where), self.fix, data)
        return CheckResult(check, ERROR, self.summary.format(**where), finding)

    def verdict(self, check: str, diffs: list[tuple[int, int, int]], passed: str) -> CheckResult:
        """``check`` passes (saying ``passed``) when the runs agree, else its error."""
        return self.error(check, diffs) if diffs else CheckResult(check, PASS, passed)


GLOBAL_SEEDS = PlanChange(
    "the plan depends on the global random state: rank {rank} draws another epoch {epoch} (from step {step}) "
    "when only its process's random/numpy/torch seed changes. Ranks are separate processes, seeded differently "
    "unless the script seeds them alike, so their plans disagree (samples overlap, others are never drawn); "
    "and any other use of the global generators (dropout, augmentation) shifts the plan.",
    "give the sampler its own generator, seeded alike on every rank from (seed, epoch) in __iter__; or wrap "
    "it: shardwise.shard(sampler, seed=...) / shardwise.shard_batches(batch_sampler, seed=...), which run it "
    "under a forked generator",
    "rank {rank} epoch {epoch} differs from step {step} under other global seeds",
)
"""Runs ``A`` and ``B`` differ: only the processes' global seeds changed."""

SAME_SEEDS = PlanChange(
    "the plan changes between two builds in the same process with the same seeds (rank {rank}, epoch "
    "{epoch}, from step {step}): it depends on the clock, the process id or OS entropy. Ranks disagree on "
    "the plan and no run can be reproduced or resumed.",
    "seed the sampler from a fixed value shared by every rank (a seed argument, or "
    "shardwise's seed resolution), never time.time(), os.getpid() or an unseeded generator",
    "rank {rank} epoch {epoch} differs between identical builds",
)
"""Runs ``A`` and ``A2`` differ: nothing changed."""

HASH_SEED = PlanChange(
    "the plan differs between two fresh processes that differ only in PYTHONHASHSEED (rank {rank}, epoch "
    "{epoch}, from step {step}): it depends on hash() order (iterating a set or dict keyed by str, hash(name) % "
    "n). Every rank is its own process with its own hash seed, so ranks plan differently, and a restart draws "
    "another plan.",
    "sort before shuffling (sorted(set_of_names)), and derive numbers with zlib.crc32 or hashlib instead of "
    "hash()",
    "rank {rank} epoch {epoch} differs under another PYTHONHASHSEED",
)
"""Runs ``A`` and ``C`` differ: only ``PYTHONHASHSEED`` changed."""


def global_rng(f: Facts) -> CheckResult:
    runs = f.obs.runs
    if _differences(runs["A"], runs["A2"]):
        return CheckResult("global_rng", SKIPPED, "the plan changes even with the same seeds (see determinism)")
    passed = "the plan ignores the global random, numpy and torch state"
    return GLOBAL_SEEDS.verdict("global_rng", _differences(runs["A"], runs["B"]), passed)


def determinism(f: Facts) -> CheckResult:
    runs = f.obs.runs
    same_process = _differences(runs["A"], runs["A2"])
    if same_process:
        return SAME_SEEDS.error("determinism", same_process)
    passed = "the same plan in fresh processes with another PYTHONHASHSEED"
    return HASH_SEED.verdict("determinism", _differences(runs["A"], runs["C"]), passed)
