"""Epoch order: every epoch's order differs from the last under each framework's ``set_epoch``."""

from __future__ import annotations

import numpy as np

from ..report import ERROR, PASS, SKIPPED, WARNING, CheckResult, Finding
from .facts import Facts


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

