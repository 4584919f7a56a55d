"""Balance: every step costs about the same on every rank (batch sizes, or tokens when lengths are known)."""

from __future__ import annotations

import numpy as np

from ..report import PASS, SKIPPED, WARNING, CheckResult, Finding
from .facts import Facts

TOKEN_IMBALANCE = 1.25
"""Mean over steps of (busiest rank's tokens / mean tokens) above which token balance is a warning."""


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

