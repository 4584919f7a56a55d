"""Resume: a mid-epoch checkpoint restored in a new process (and at another world size) continues the run."""

from __future__ import annotations

import numpy as np

from ..report import ERROR, PASS, SKIPPED, CheckResult, Finding
from .facts import Facts, first_difference


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
                 "repeated": repeated, "skipped": missing, "first_difference": first_difference(want, have)},
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

