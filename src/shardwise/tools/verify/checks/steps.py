"""Steps: every rank takes the same number of steps (else the run hangs), and ``len()`` says how many."""

from __future__ import annotations

from ..report import ERROR, PASS, SKIPPED, CheckResult, Finding
from .facts import SHARD_FIX, Facts, has_or_have, rank_list


def equal_steps(f: Facts) -> CheckResult:
    for e in range(f.epochs):
        steps = [f.epoch(r, e).steps for r in range(f.world_size)]
        if len(set(steps)) > 1:
            k = min(steps)
            waiting = [r for r, s in enumerate(steps) if s > k]
            done = [r for r, s in enumerate(steps) if s == k]
            finding = Finding(
                "equal_steps", ERROR,
                f"the run will hang at step {k} of epoch {e}: {rank_list(waiting)} {has_or_have(waiting)} a step "
                f"{k} and wait in its gradient all-reduce for {rank_list(done)}, which {has_or_have(done)} already "
                "finished the epoch "
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

