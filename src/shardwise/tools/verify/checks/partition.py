"""Partition: what the ranks draw together, against the dataset (overlap, index range, coverage).

Padding and dropping the tail explain up to ``(W - 1)`` units of overlap or of samples left out
(:meth:`.facts.Facts.allowance`); draws with replacement overlap by chance, so for them only two
ranks drawing the same stream is an error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..report import ERROR, PASS, SKIPPED, WARNING, CheckResult, Finding
from .facts import SHARD_FIX, Facts


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

