"""``verify(..., state=)``: a saved state's skip ledger, resumed on real ranks and checked.

Given a state (or a checkpoint holding one) with skipped ranges of plan positions (``skip``) or of
sample ids (``skip_ids``), the ``skip_ledger`` check lists them and resumes the state on
``world_size`` real gloo ranks (each rank builds the factory and loads the state, as a resumed run
does), then compares what the ranks train in the rest of the epoch with the plan, built once in
this process at world size 1 from the same factory and state:

- the skipped samples (the plan's samples without the ledger, less those with it) never train;
- every other sample after the saved position trains exactly once (the padding or dropping of at
  most ``W - 1`` units that an even split needs aside);
- every rank trains the same number of units.

Cost: three passes over the rest of one epoch in this process plus one per rank, O(epoch) in
samples: meant for the sizes ``verify`` runs on, not for 1e9.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .report import ERROR, PASS, CheckResult, Finding
from .target import FactoryRef, TargetError, call_factory

LEDGER = "skip_ledger"


def read_state(state: object) -> dict[str, Any]:
    """The sampler state in ``state``: a dict (the state, or a checkpoint dict holding it) or a file path.

    Raises:
        TargetError: nothing that holds a shardwise sampler state.
    """
    from ..which import WhichError, find_state, load_state_file

    try:
        if isinstance(state, Mapping):
            return find_state(state)
        if isinstance(state, (str, Path)):
            return load_state_file(Path(state))
    except WhichError as error:
        raise TargetError(str(error).replace("--state", "state")) from None
    raise TargetError(f"state should be a state dict or the path of a saved state, but got {type(state).__name__}")


def _sampler_of(obj: object) -> Any:
    """The shardwise sampler whose units the factory's loader (or batch sampler) trains on."""
    from ...samplers.base import PlanSampler

    for candidate in (getattr(obj, "batch_sampler", None), getattr(obj, "sampler", None), obj):
        if isinstance(candidate, PlanSampler):
            return candidate
    raise TargetError(f"the factory built {type(obj).__name__}, which holds no shardwise sampler to load a state into")


def _flat(units: Iterable[Any]) -> tuple[list[int], int]:
    """Every sample of ``units`` (ints, or batches of ints) in order, and the number of units."""
    out: list[int] = []
    count = 0
    for unit in units:
        count += 1
        if isinstance(unit, (list, tuple)):
            out.extend(int(i) for i in unit)
        else:
            out.append(int(unit))
    return out, count


def _rest(factory: Any, state: dict[str, Any], rank: int, world_size: int) -> tuple[list[int], int, int]:
    """Build, load ``state``, iterate the rest of its epoch: ``(samples, units, largest unit)`` of this rank."""
    sampler = _sampler_of(call_factory(factory, rank, world_size))
    if world_size == 1:
        sampler.rank, sampler.num_replicas = 0, 1  # the whole plan, whatever world the factory pinned
    sampler.load_state_dict(state)
    units = list(sampler)
    samples, count = _flat(units)
    largest = max((len(u) if isinstance(u, (list, tuple)) else 1 for u in units), default=1)
    return samples, count, largest


def _resume_rank(rank: int, world_size: int, ref: FactoryRef, state: dict[str, Any]) -> tuple[list[int], int, int]:
    """What one real rank trains after loading ``state`` (run in a spawned gloo process)."""
    return _rest(ref.load(), state, rank, world_size)


def check_ledger(ref: FactoryRef, state: object, world_size: int, *, timeout: float = 120.0) -> CheckResult:
    """The ``skip_ledger`` check of a saved ``state`` resumed on ``world_size`` real ranks (see the module)."""
    from ..launch import run_distributed

    saved = read_state(state)
    ranges = [list(map(int, r)) for r in saved.get("skip", [])]
    id_ranges = [list(map(int, r)) for r in saved.get("skip_ids", [])]
    epoch, consumed = int(saved["epoch"]), int(saved["consumed"])
    factory = ref.load()
    plain = {key: value for key, value in saved.items() if key not in ("skip", "skip_ids")}  # both ledgers out
    whole, _, _ = _rest(factory, {**plain, "consumed": 0}, 0, 1)  # the epoch's plan without the ledger
    kept, _, _ = _rest(factory, {**saved, "consumed": 0}, 0, 1)  # with it
    rest, _, _ = _rest(factory, saved, 0, 1)  # what is left to train after the saved position
    skipped = Counter(whole) - Counter(kept)
    ranks = run_distributed(_resume_rank, world_size, ref, saved, timeout=timeout)
    trained = Counter(i for samples, _, _ in ranks for i in samples)
    allowance = (world_size - 1) * max(largest for _, _, largest in ranks)
    extra, lost = trained - Counter(rest), Counter(rest) - trained
    leaked = sum((extra & skipped).values())
    units = [count for _, count, _ in ranks]
    where = f"epoch {epoch} from position {consumed}, {len(ranges)} skipped range(s) {ranges[:4]}"
    if id_ranges:  # [epoch, from position, first id, stop id]
        where += f", {len(id_ranges)} skipped id range(s) {id_ranges[:4]}"
    evidence = (
        f"{where}: {sum(skipped.values())} skipped samples never trained on {world_size} ranks, "
        f"{sum(lost.values())} lost, {sum(extra.values())} repeated (padding allows {allowance}), "
        f"{units[0]} units a rank"
    )
    problems = []
    if leaked:
        problems.append(f"{leaked} skipped samples were trained")
    if sum(extra.values()) > allowance or sum(lost.values()) > allowance:
        problems.append(f"{sum(lost.values())} samples lost and {sum(extra.values())} repeated")
    if len(set(units)) > 1:
        problems.append(f"ranks train different numbers of units {units}")
    if not problems:
        return CheckResult(LEDGER, PASS, evidence)
    finding = Finding(
        LEDGER, ERROR, f"resuming the state with its skip ledger: {'; '.join(problems)} ({where}).",
        "add skips with shardwise.skip_steps or `shardwise skip` on a state of this factory's sampler, and resume "
        "through load_state_dict",
        {"ranges": ranges, "id_ranges": id_ranges, "leaked": leaked, "lost": sum(lost.values()),
         "repeated": sum(extra.values()), "units": units},
    )  # fmt: skip
    return CheckResult(LEDGER, ERROR, evidence, finding)
