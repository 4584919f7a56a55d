"""The checks: each turns what the ranks yielded into a verdict and, if needed, one finding.

Every check is a function of an :class:`~.runner.Observed` and returns a :class:`CheckResult`.
Allowances follow torch's ``DistributedSampler`` contract: to give every rank the same number of
units the tail of a plan may be padded (repeating at most ``W-1`` units) or dropped (leaving out
at most ``W-1``); a unit is one index, or one batch for a batch sampler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .report import ERROR, PASS, SKIPPED, WARNING, CheckResult, Finding, VerifyReport
from .runner import Observed
from .worker import Epoch, RankRun

TOKEN_IMBALANCE = 1.25
"""Mean over steps of (busiest rank's tokens / mean tokens) above which token balance is a warning."""

SHARD_FIX = (
    "deal one global plan out by rank: torch's DistributedSampler or shardwise.ShardedSampler for "
    "indices, or wrap what you have: shardwise.shard(sampler) / shardwise.shard_batches(batch_sampler)"
)


@dataclass
class Facts:
    """What several checks share, computed once."""

    obs: Observed
    runs: list[RankRun]
    world_size: int
    epochs: int
    dataset_size: int | None
    unit: list[int]
    """Per epoch, the largest unit (indices in one step) on any rank: the padding allowance's unit."""
    replacement: list[bool]
    """Per epoch, whether ranks repeat indices within their own epoch (draws with replacement)."""

    def epoch(self, rank: int, epoch: int) -> Epoch:
        return self.runs[rank].epochs[epoch]

    def allowance(self, epoch: int, ranks: int | None = None) -> int:
        return ((ranks or self.world_size) - 1) * self.unit[epoch]


def _facts(obs: Observed) -> Facts:
    runs = obs.runs["A"]
    world_size, epochs = obs.setup.world_size, obs.setup.epochs
    unit = []
    replacement = []
    for e in range(epochs):
        sizes = [int(run.epochs[e].sizes.max()) if run.epochs[e].steps else 0 for run in runs]
        unit.append(max([*sizes, 1]))
        repeats = sum(int(run.epochs[e].flat.size - np.unique(run.epochs[e].flat).size) for run in runs)
        replacement.append(repeats > (world_size - 1) * unit[-1])
    probe = obs.probe
    return Facts(obs, runs, world_size, epochs, probe.dataset_size if probe else None, unit, replacement)


def _first_difference(a: Epoch, b: Epoch) -> int:
    """The first step at which two epochs differ (``min(steps)`` if one is a prefix of the other)."""
    for k in range(min(a.steps, b.steps)):
        if not np.array_equal(a.flat[a.offsets[k]:a.offsets[k + 1]], b.flat[b.offsets[k]:b.offsets[k + 1]]):
            return k
    return min(a.steps, b.steps)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    listed = ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)} ranks)"
    return f"ranks {listed}"


def _have(ranks: list[int]) -> str:
    return "has" if len(ranks) == 1 else "have"


# -- the checks -----------------------------------------------------------------------------------


def equal_steps(f: Facts) -> CheckResult:
    for e in range(f.epochs):
        steps = [f.epoch(r, e).steps for r in range(f.world_size)]
        if len(set(steps)) > 1:
            k = min(steps)
            waiting = [r for r, s in enumerate(steps) if s > k]
            done = [r for r, s in enumerate(steps) if s == k]
            finding = Finding(
                "equal_steps", ERROR,
                f"the run will hang at step {k} of epoch {e}: {_ranks(waiting)} {_have(waiting)} a step {k} and "
                "wait in "
                f"its gradient all-reduce for {_ranks(done)}, which {_have(done)} already finished the epoch "
                "(the job stalls until the collective times out, 10 minutes or more with NCCL).",
                "give every rank the same number of steps by padding or dropping the tail, as torch's "
                f"DistributedSampler does; or {SHARD_FIX}",
                {"epoch": e, "hang_step": k, "steps_per_rank": steps, "waiting_ranks": waiting, "finished_ranks": done},
            )
            return CheckResult("equal_steps", ERROR, f"epoch {e}: steps per rank {steps}; hangs at step {k}", finding)
    per_epoch = [f.epoch(0, e).steps for e in range(f.epochs)]
    return CheckResult("equal_steps", PASS, f"every rank: {per_epoch} steps per epoch")


def len_matches(f: Facts) -> CheckResult:
    wrong = []
    known = 0
    for r in range(f.world_size):
        for e in range(f.epochs):
            epoch = f.epoch(r, e)
            if epoch.length is not None:
                known += 1
                if epoch.length != epoch.steps:
                    wrong.append({"rank": r, "epoch": e, "len": epoch.length, "yielded": epoch.steps})
    if not known:
        return CheckResult("len_matches", SKIPPED, "the sampler has no len()")
    if not wrong:
        return CheckResult("len_matches", PASS, f"len() = steps yielded on every rank ({f.epoch(0, 0).steps})")
    first = wrong[0]
    over = first["len"] > first["yielded"]
    consequence = (
        "the epoch ends early: a schedule sized from len() (OneCycleLR, cosine with total steps, Lightning's "
        "estimated_stepping_batches) never reaches its end, and progress bars and step-based checkpoints are off"
        if over else
        "the epoch runs past what len() announced: OneCycleLR raises 'Tried to step ... times', and a schedule "
        "sized from len() ends before training does"
    )
    finding = Finding(
        "len_matches", ERROR,
        f"len() says {first['len']} steps but rank {first['rank']} yields {first['yielded']} in epoch "
        f"{first['epoch']} ({len(wrong)} rank-epochs disagree): {consequence}.",
        "make __len__ return exactly what __iter__ yields on this rank, computed from the same rank, world "
        "size and padding rule (for a sharded sampler: ceil(n / world_size), or floor with drop_last)",
        {**first, "mismatches": wrong[:16]},
    )
    return CheckResult("len_matches", ERROR, f"rank {first['rank']} epoch {first['epoch']}: len() {first['len']}, "
                       f"yields {first['yielded']}", finding)


def overlap(f: Facts) -> tuple[CheckResult, list[list[list[int]]]]:
    matrices = []
    result: CheckResult | None = None
    for e in range(f.epochs):
        uniques = [np.unique(f.epoch(r, e).flat) for r in range(f.world_size)]
        matrix = [[0] * f.world_size for _ in range(f.world_size)]
        for r in range(f.world_size):
            matrix[r][r] = int(uniques[r].size)
            for r2 in range(r + 1, f.world_size):
                shared = int(np.intersect1d(uniques[r], uniques[r2], assume_unique=True).size)
                matrix[r][r2] = matrix[r2][r] = shared
        matrices.append(matrix)
        if result is not None or f.world_size == 1:
            continue
        allowance = f.allowance(e)
        if f.replacement[e]:
            result = _same_streams(f, e)
            continue
        values, counts = np.unique(np.concatenate(uniques), return_counts=True)
        extra = int((counts[counts > 1] - 1).sum())
        if extra > allowance:
            shared_values = values[counts > 1]
            pairs = sorted(
                ((matrix[r][r2], r, r2) for r in range(f.world_size) for r2 in range(r + 1, f.world_size)),
                reverse=True,
            )
            top: list[dict[str, Any]] = [{"ranks": [r, r2], "shared": n} for n, r, r2 in pairs[:4] if n]
            finding = Finding(
                "overlap", ERROR,
                f"ranks train on the same samples: in epoch {e}, {shared_values.size} indices are drawn by more than "
                f"one rank ({extra} extra copies; padding explains at most {allowance}). Those samples are trained "
                f"on several times per epoch and the epoch covers less of the dataset than it seems.",
                f"{SHARD_FIX}; take the rank from RANK (global), never LOCAL_RANK; seed every rank alike",
                {"epoch": e, "shared_indices": int(shared_values.size), "extra_copies": extra,
                 "allowance": allowance, "example": shared_values[:10], "pairs": top},
            )
            pair = top[0]["ranks"] if top else [0, 0]
            result = CheckResult("overlap", ERROR, f"epoch {e}: {shared_values.size} indices on 2+ ranks "
                                 f"(ranks {pair[0]} and {pair[1]} share {top[0]['shared'] if top else 0})", finding)
    if result is None:
        if f.world_size == 1:
            result = CheckResult("overlap", SKIPPED, "one rank")
        elif all(f.replacement):
            result = CheckResult("overlap", PASS, "draws with replacement; no two ranks draw the same stream")
        else:
            worst = max(
                max(m[r][r2] for r in range(f.world_size) for r2 in range(f.world_size) if r != r2)
                for m in matrices
            )
            result = CheckResult("overlap", PASS, f"at most {worst} indices shared by two ranks "
                                 f"(padding allows {f.allowance(0)})")
    return result, matrices


def _same_streams(f: Facts, e: int) -> CheckResult | None:
    """Draws with replacement overlap by chance; two ranks drawing the *same stream* is the bug."""
    for r in range(f.world_size):
        a = f.epoch(r, e).flat
        for r2 in range(r + 1, f.world_size):
            b = f.epoch(r2, e).flat
            n = min(a.size, b.size)
            if n and float(np.mean(a[:n] == b[:n])) >= 0.5:
                finding = Finding(
                    "overlap", ERROR,
                    f"ranks {r} and {r2} draw the same stream in epoch {e} ({np.mean(a[:n] == b[:n]):.0%} of their "
                    "draws are equal, position by position): every sample they draw is trained on twice per step.",
                    f"{SHARD_FIX}; for weighted draws: shardwise.WeightedSampler",
                    {"epoch": e, "ranks": [r, r2], "equal_fraction": float(np.mean(a[:n] == b[:n])),
                     "example": a[:10]},
                )
                return CheckResult("overlap", ERROR, f"epoch {e}: ranks {r} and {r2} draw the same stream", finding)
    return None


def coverage(f: Facts) -> tuple[CheckResult, CheckResult, list[float | None]]:
    n = f.dataset_size
    if n is None:
        skipped = "dataset size unknown (pass dataset_size= or --size)"
        nothing: list[float | None] = [None] * f.epochs
        return CheckResult("index_range", SKIPPED, skipped), CheckResult("coverage", SKIPPED, skipped), nothing
    fractions: list[float | None] = []
    in_range: CheckResult | None = None
    covered: CheckResult | None = None
    for e in range(f.epochs):
        for r in range(f.world_size):
            epoch = f.epoch(r, e)
            bad = np.flatnonzero((epoch.flat < 0) | (epoch.flat >= n))
            if bad.size and in_range is None:
                step = int(np.searchsorted(epoch.offsets, bad[0], side="right") - 1)
                index = int(epoch.flat[bad[0]])
                finding = Finding(
                    "index_range", ERROR,
                    f"rank {r} draws index {index} at step {step} of epoch {e}, but the dataset has {n} samples "
                    "(indices 0..n-1): the DataLoader raises IndexError there, or reads the wrong sample.",
                    "draw from range(len(dataset)); if the dataset size differs from what the sampler was built "
                    "for, build the sampler from the dataset itself",
                    {"rank": r, "epoch": e, "step": step, "index": index, "dataset_size": n,
                     "out_of_range": int(bad.size)},
                )
                in_range = CheckResult("index_range", ERROR, f"rank {r}: index {index} of a {n}-sample dataset",
                                       finding)
        drawn = np.unique(np.concatenate([f.epoch(r, e).flat for r in range(f.world_size)]))
        drawn = drawn[(drawn >= 0) & (drawn < n)]
        fractions.append(drawn.size / n if n else 1.0)
        if covered is None and not f.replacement[e] and n - drawn.size > f.allowance(e):
            mask = np.ones(n, dtype=bool)
            mask[drawn] = False
            missing = np.flatnonzero(mask)
            finding = Finding(
                "coverage", WARNING,
                f"{missing.size} of {n} samples ({missing.size / n:.1%}) are never drawn by any rank in epoch {e} "
                f"(dropping the tail explains at most {f.allowance(e)}): that data is not trained on this epoch.",
                f"if unintended: {SHARD_FIX}; expected for a stream (unlabelled data) or a subset",
                {"epoch": e, "missing": int(missing.size), "dataset_size": n, "example": missing[:10],
                 "allowance": f.allowance(e)},
            )
            covered = CheckResult("coverage", WARNING, f"epoch {e}: {drawn.size / n:.1%} of {n} samples drawn", finding)
    in_range = in_range or CheckResult("index_range", PASS, f"every index in [0, {n})")
    if covered is None:
        if all(f.replacement):
            covered = CheckResult("coverage", SKIPPED, "draws with replacement")
        else:
            low = min(x for x in fractions if x is not None)
            covered = CheckResult("coverage", PASS, f"at least {low:.1%} of {n} samples drawn every epoch")
    return in_range, covered, fractions


def epoch_order(f: Facts) -> CheckResult:
    if f.epochs < 2:
        return CheckResult("epoch_order", SKIPPED, "one epoch (use epochs >= 2)")
    probe = f.obs.probe
    same = [e for e in range(f.epochs - 1) if f.epoch(0, e + 1).same(f.epoch(0, e))]
    if not same:
        return CheckResult("epoch_order", PASS, "every epoch's order differs from the previous one")
    monotonic = all(bool(np.all(np.diff(f.epoch(r, 0).flat) >= 0)) for r in range(f.world_size))
    if (probe is not None and probe.not_shuffled) or monotonic:
        return CheckResult("epoch_order", PASS, "not shuffled (shuffle=False or sequential): same order by design")
    unreached = probe.unreached if probe else []
    has = {path: cls for path, cls in (probe.set_epoch_on.items() if probe else []) if cls}
    if unreached:
        fix = (f"forward the epoch: give the wrapper at the path that holds {unreached[0]} a "
               "set_epoch(self, epoch) that calls the inner sampler's set_epoch, or call "
               "shardwise.set_epoch(loader, epoch), which reaches nested samplers")
    elif has:
        fix = ("make set_epoch change the shuffle: derive the generator's seed from (seed, epoch) in __iter__, "
               "e.g. numpy.random.default_rng((seed, epoch)), not from a seed fixed at construction")
    else:
        fix = ("add set_epoch(epoch) that reseeds the shuffle with (seed, epoch), or use a shardwise sampler, "
               "which also advances the epoch by itself")
    finding = Finding(
        "epoch_order", ERROR,
        f"epoch {same[0] + 1} repeats epoch {same[0]}'s order exactly although the epoch is set the way Lightning, "
        "Accelerate and Composer set it: every epoch trains on the same batches in the same order.",
        fix,
        {"identical_epochs": [[e, e + 1] for e in same], "set_epoch_on": has, "unreached_set_epoch": unreached},
    )
    where = f"; set_epoch not forwarded to {unreached[0]}" if unreached else ""
    return CheckResult("epoch_order", ERROR, f"epochs {same[0]} and {same[0] + 1} identical{where}", finding)


def set_epoch_paths(f: Facts) -> CheckResult:
    probe = f.obs.probe
    if probe is None:
        return CheckResult("set_epoch_paths", SKIPPED, "no probe")
    short = {name: name.split(" (")[0] for name in probe.frameworks}
    reached = [short[n] for n, ok in probe.frameworks.items() if ok]
    missing = [short[n] for n, ok in probe.frameworks.items() if not ok]
    if not missing:
        return CheckResult("set_epoch_paths", PASS, "reached by " + ", ".join(reached))
    if probe.changes_without_calls:
        return CheckResult("set_epoch_paths", PASS, f"order advances by itself; set_epoch not reached by "
                           f"{', '.join(missing)}")
    if not reached:
        return CheckResult("set_epoch_paths", PASS, "no framework's set_epoch changes the order (see epoch_order)")
    finding = Finding(
        "set_epoch_paths", WARNING,
        f"set_epoch changes the order under {', '.join(reached)} but not under {', '.join(missing)}: "
        "with those, every epoch repeats the same order.",
        _paths_fix(missing),
        {"frameworks": probe.frameworks, "set_epoch_on": probe.set_epoch_on},
    )
    return CheckResult("set_epoch_paths", WARNING, f"not reached by {', '.join(missing)}", finding)


def _paths_fix(missing: list[str]) -> str:
    fixes = []
    if "Lightning" in missing or "Accelerate" in missing or "PyTorch recipe" in missing:
        fixes.append(
            "expose the object that owns set_epoch where Lightning and Accelerate look: as loader.sampler, or as "
            "the batch sampler's .sampler attribute with a set_epoch that forwards (shardwise batch samplers do both)"
        )
    if "Composer" in missing:
        fixes.append("Composer sets the epoch only on a DistributedSampler: subclass it (as shardwise.ShardedSampler)")
    return "; ".join(fixes) + "; or call shardwise.set_epoch(loader, epoch) at the start of every epoch"


def _differences(a: list[RankRun], b: list[RankRun]) -> list[tuple[int, int, int]]:
    out = []
    for r, (x, y) in enumerate(zip(a, b, strict=False)):
        for e, (ex, ey) in enumerate(zip(x.epochs, y.epochs, strict=False)):
            if not ex.same(ey):
                out.append((r, e, _first_difference(ex, ey)))
    return out


def global_rng(f: Facts) -> CheckResult:
    runs = f.obs.runs
    if _differences(runs["A"], runs["A2"]):
        return CheckResult("global_rng", SKIPPED, "the plan changes even with the same seeds (see determinism)")
    diffs = _differences(runs["A"], runs["B"])
    if not diffs:
        return CheckResult("global_rng", PASS, "the plan ignores the global random, numpy and torch state")
    r, e, step = diffs[0]
    finding = Finding(
        "global_rng", ERROR,
        f"the plan depends on the global random state: rank {r} draws another epoch {e} (from step {step}) when "
        "only its process's random/numpy/torch seed changes. Ranks are separate processes, seeded differently "
        "unless the script seeds them alike, so their plans disagree (samples overlap, others are never drawn); "
        "and any other use of the global generators (dropout, augmentation) shifts the plan.",
        "give the sampler its own generator, seeded alike on every rank from (seed, epoch) in __iter__; or wrap "
        "it: shardwise.shard(sampler, seed=...) / shardwise.shard_batches(batch_sampler, seed=...), which run it "
        "under a forked generator",
        {"rank": r, "epoch": e, "step": step, "ranks": sorted({d[0] for d in diffs})},
    )
    return CheckResult("global_rng", ERROR, f"rank {r} epoch {e} differs from step {step} under other global seeds",
                       finding)


def determinism(f: Facts) -> CheckResult:
    runs = f.obs.runs
    same_process = _differences(runs["A"], runs["A2"])
    if same_process:
        r, e, step = same_process[0]
        finding = Finding(
            "determinism", ERROR,
            f"the plan changes between two builds in the same process with the same seeds (rank {r}, epoch {e}, "
            f"from step {step}): it depends on the clock, the process id or OS entropy. Ranks disagree on the plan "
            "and no run can be reproduced or resumed.",
            "seed the sampler from a fixed value shared by every rank (a seed argument, or "
            "shardwise's seed resolution), never time.time(), os.getpid() or an unseeded generator",
            {"rank": r, "epoch": e, "step": step, "ranks": sorted({d[0] for d in same_process})},
        )
        return CheckResult("determinism", ERROR, f"rank {r} epoch {e} differs between identical builds", finding)
    diffs = _differences(runs["A"], runs["C"])
    if not diffs:
        return CheckResult("determinism", PASS, "the same plan in fresh processes with another PYTHONHASHSEED")
    r, e, step = diffs[0]
    finding = Finding(
        "determinism", ERROR,
        f"the plan differs between two fresh processes that differ only in PYTHONHASHSEED (rank {r}, epoch {e}, "
        f"from step {step}): it depends on hash() order (iterating a set or dict keyed by str, hash(name) % n). "
        "Every rank is its own process with its own hash seed, so ranks plan differently, and a restart draws "
        "another plan.",
        "sort before shuffling (sorted(set_of_names)), and derive numbers with zlib.crc32 or hashlib instead of "
        "hash()",
        {"rank": r, "epoch": e, "step": step, "ranks": sorted({d[0] for d in diffs})},
    )
    return CheckResult("determinism", ERROR, f"rank {r} epoch {e} differs under another PYTHONHASHSEED", finding)


def balance(f: Facts) -> tuple[CheckResult, list[list[list[int]]], list[list[list[int]]] | None]:
    probe = f.obs.probe
    lengths = probe.lengths if probe else None
    sizes = [[f.epoch(r, e).sizes.tolist() for r in range(f.world_size)] for e in range(f.epochs)]
    tokens: list[list[list[int]]] | None = None
    if lengths is not None:
        tokens = []
        for e in range(f.epochs):
            row = []
            for r in range(f.world_size):
                epoch = f.epoch(r, e)
                inside = np.clip(epoch.flat, 0, lengths.size - 1)
                cumulative = np.concatenate([[0], np.cumsum(lengths[inside], dtype=np.int64)])
                row.append((cumulative[epoch.offsets[1:]] - cumulative[epoch.offsets[:-1]]).tolist())
            tokens.append(row)
    if f.runs[0].epochs and f.obs.probe is not None and f.obs.probe.kind == "index":
        return CheckResult("balance", SKIPPED, "steps are single indices: verify the DataLoader to judge batches"), \
            sizes, tokens
    if f.world_size == 1:
        return CheckResult("balance", SKIPPED, "one rank"), sizes, tokens
    if tokens is not None:
        ratios = []
        for e in range(f.epochs):
            k = min(len(row) for row in tokens[e])
            if not k:
                continue
            grid = np.array([row[:k] for row in tokens[e]], dtype=np.float64)  # grid: (world_size, steps)
            mean = grid.mean(axis=0)
            keep = mean > 0
            ratios.append(float((grid.max(axis=0)[keep] / mean[keep]).mean()) if keep.any() else 1.0)
        worst = max(ratios) if ratios else 1.0
        if worst > TOKEN_IMBALANCE:
            finding = Finding(
                "balance", WARNING,
                f"tokens per step are unbalanced across ranks: the busiest rank has {worst:.2f}x the mean on an "
                f"average step, so every step waits for it (about {1 - 1 / worst:.0%} of the other ranks' time idle).",
                "batch by token budget and balance the ranks of each step: shardwise.BucketBatchSampler(lengths, "
                "max_tokens=...)",
                {"imbalance": worst, "threshold": TOKEN_IMBALANCE, "per_epoch": ratios},
            )
            verdict = CheckResult("balance", WARNING, f"tokens: busiest rank {worst:.2f}x the mean", finding)
            return verdict, sizes, tokens
        return CheckResult("balance", PASS, f"tokens: busiest rank {worst:.2f}x the mean per step"), sizes, tokens
    for e in range(f.epochs):
        k = min(len(row) for row in sizes[e])
        table = np.array([row[:k] for row in sizes[e]], dtype=np.int64).reshape(f.world_size, k)
        # The last common step may be partial (the tail of the plan); every other step must match.
        uneven = np.flatnonzero(table.max(axis=0)[: max(k - 1, 0)] != table.min(axis=0)[: max(k - 1, 0)])
        if uneven.size:
            step = int(uneven[0])
            finding = Finding(
                "balance", WARNING,
                f"batch sizes differ across ranks at {uneven.size} steps of epoch {e} (first: step {step}, sizes "
                f"{table[:, step].tolist()}): DDP averages gradients over ranks alike, so samples in smaller batches "
                "weigh more, and the ranks with larger batches set the pace.",
                "give every rank of a step the same batch size (a fixed batch size over a sharded sampler), or "
                "pass lengths= to judge token balance instead when batches are built by token budget",
                {"epoch": e, "step": step, "sizes": table[:, step], "uneven_steps": int(uneven.size)},
            )
            return CheckResult("balance", WARNING, f"epoch {e}: batch sizes differ at {uneven.size} steps", finding), \
                sizes, tokens
    return CheckResult("balance", PASS, "every step: the same batch size on every rank"), sizes, tokens


def resume(f: Facts) -> CheckResult:
    obs = f.obs
    if obs.probe is None or obs.probe.holder is None:
        return CheckResult("resume", SKIPPED, "no state_dict/load_state_dict")
    checked = 0
    for r in range(f.world_size):
        saved = obs.saved[r]
        if saved is None:
            continue
        got = obs.resumed.get(r)
        if saved.error or got is None or got.error:
            message = saved.error or (got.error if got else "no resumed run")
            finding = Finding(
                "resume", ERROR, f"a mid-epoch checkpoint cannot be restored on rank {r}: {message}.",
                "state_dict() must return plain, picklable values that load_state_dict() accepts in a new process",
                {"rank": r, "step": saved.step, "holder": saved.holder, "error": message},
            )
            return CheckResult("resume", ERROR, f"rank {r}: {message}", finding)
        reference = obs.runs["C"][r].epochs
        expected = [reference[0].tail(saved.step), *reference[1:]]
        checked += 1
        for e, (want, have) in enumerate(zip(expected, got.epochs, strict=False)):
            if want.same(have):
                continue
            repeated = int(np.intersect1d(have.flat, saved.before).size) if e == 0 else 0
            missing = int(np.setdiff1d(want.flat, have.flat).size)
            when = "the rest of the epoch" if e == 0 else f"epoch {e} after it"
            finding = Finding(
                "resume", ERROR,
                f"resuming rank {r} in a new process from a checkpoint saved at step {saved.step} of epoch 0 does "
                f"not continue the run: {when} yields {have.steps} steps instead of {want.steps}, repeats "
                f"{repeated} samples trained on before the checkpoint and skips {missing}.",
                "save the position in state_dict (the epoch and how many units were handed out) and start from it "
                "in the first __iter__ after load_state_dict, also when set_epoch(saved epoch) is called after "
                "loading (Lightning does); shardwise samplers do this in O(1)",
                {"rank": r, "step": saved.step, "epoch": e, "expected_steps": want.steps, "resumed_steps": have.steps,
                 "repeated": repeated, "skipped": missing, "first_difference": _first_difference(want, have)},
            )
            return CheckResult("resume", ERROR, f"rank {r}: repeats {repeated}, skips {missing} after step "
                               f"{saved.step}", finding)
    if not checked:
        return CheckResult("resume", SKIPPED, "epochs too short to checkpoint mid-epoch")
    return CheckResult("resume", PASS, f"resumed mid-epoch (step {obs.saved[0].step if obs.saved[0] else '?'}) in a "
                       "new process = the uninterrupted run, on every rank")


def elastic_resume(f: Facts) -> CheckResult:
    obs = f.obs
    if obs.probe is None or not obs.probe.elastic:
        return CheckResult("elastic_resume", SKIPPED, "does not claim elastic resume")
    if obs.elastic is None or obs.saved[0] is None or obs.elastic_world_size is None:
        return CheckResult("elastic_resume", SKIPPED, "no mid-epoch checkpoint to resume")
    if f.replacement[0]:
        return CheckResult("elastic_resume", SKIPPED, "draws with replacement")
    other = obs.elastic_world_size
    failed = [run for run in obs.elastic if run.error]
    step = obs.saved[0].step
    if failed:
        finding = Finding(
            "elastic_resume", ERROR, f"the checkpoint of world size {f.world_size} does not load at world size "
            f"{other}: {failed[0].error}.",
            "keep the state free of the world size: count the units handed out by all ranks together",
            {"world_size": f.world_size, "resumed_world_size": other, "error": failed[0].error},
        )
        return CheckResult("elastic_resume", ERROR, f"does not load at world size {other}", finding)
    reference = [run.epochs[0] for run in obs.runs["C"]]
    before = np.concatenate([epoch.head(step) for epoch in reference])
    after = np.concatenate([run.epochs[0].flat for run in obs.elastic])
    expected = np.concatenate([epoch.flat for epoch in reference])
    combined = np.concatenate([before, after])
    distinct = np.unique(combined)
    lost = np.setdiff1d(np.unique(expected), distinct)
    repeated = max(0, int(combined.size - distinct.size) - int(expected.size - np.unique(expected).size))
    allowance = (f.world_size + other - 2) * f.unit[0]
    if lost.size > allowance or repeated > allowance:
        finding = Finding(
            "elastic_resume", ERROR,
            f"a checkpoint saved at step {step} of epoch 0 with {f.world_size} ranks and resumed with {other} loses "
            f"{lost.size} samples and repeats {repeated} (padding explains {allowance}): the sampler claims an "
            "elastic resume it does not keep.",
            "count the global position (units handed out by all ranks together) in the state and deal the rest "
            "of the plan out by the new rank and world size; or do not claim elastic=True",
            {"world_size": f.world_size, "resumed_world_size": other, "step": step, "lost": int(lost.size),
             "repeated": repeated, "allowance": allowance, "example_lost": lost[:10]},
        )
        return CheckResult("elastic_resume", ERROR, f"{f.world_size} -> {other} ranks: loses {lost.size}, "
                           f"repeats {repeated}", finding)
    return CheckResult("elastic_resume", PASS, f"{f.world_size} -> {other} ranks at step {step}: nothing lost, "
                       "nothing repeated beyond padding")


def build_report(obs: Observed, mode: str) -> VerifyReport:
    """Run every check over what the ranks yielded."""
    setup = obs.setup
    if obs.error is not None:
        finding = Finding(
            "iterates", ERROR, f"the sampler fails in training: {obs.error}",
            "fix the error above; verify iterates the index source exactly as a DataLoader does", {"error": obs.error},
        )
        return VerifyReport(obs.label, setup.world_size, setup.epochs, "unknown",
                            [CheckResult("iterates", ERROR, obs.error.splitlines()[0], finding)], mode=mode)
    f = _facts(obs)
    overlap_result, matrices = overlap(f)
    range_result, coverage_result, fractions = coverage(f)
    balance_result, sizes, tokens = balance(f)
    simple: list[Callable[[Facts], CheckResult]] = [equal_steps, len_matches]
    checks = [c(f) for c in simple]
    checks += [overlap_result, range_result, coverage_result, epoch_order(f), set_epoch_paths(f), global_rng(f),
               determinism(f), balance_result, resume(f), elastic_resume(f)]
    data = {
        "steps": [[f.epoch(r, e).steps for r in range(f.world_size)] for e in range(f.epochs)],
        "lengths": [[f.epoch(r, e).length for r in range(f.world_size)] for e in range(f.epochs)],
        "batch_sizes": sizes,
        "tokens": tokens,
        "overlap": matrices,
        "coverage": fractions,
        "dataset_size": f.dataset_size,
        "set_epoch": obs.probe.frameworks if obs.probe else {},
        "describe": obs.probe.describe if obs.probe else "",
    }
    kind = obs.probe.kind if obs.probe else "unknown"
    return VerifyReport(obs.label, setup.world_size, setup.epochs, kind, checks, data, mode=mode)
