"""The checks: each turns what the ranks yielded into a verdict and, if needed, one finding.

Every check is a function of the :class:`~.facts.Facts` of an :class:`~..runner.Observed` and
returns a :class:`~..report.CheckResult`; one module per concern: ``steps`` (equal steps,
``len``), ``partition`` (overlap, index range, coverage), ``epoch_order`` (order and the
frameworks' ``set_epoch``), ``reproducibility`` (global RNG, determinism), ``balance``,
``resume`` (mid-epoch and elastic). :func:`build_report` runs them all.
"""

from __future__ import annotations

from collections.abc import Callable

from ..report import ERROR, CheckResult, Finding, VerifyReport
from ..runner import Observed
from .balance import balance
from .epoch_order import epoch_order, set_epoch_paths
from .facts import Facts, facts_of
from .partition import coverage, overlap
from .reproducibility import determinism, global_rng
from .resume import elastic_resume, resume
from .steps import equal_steps, len_matches

__all__ = ["build_report"]


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
    f = facts_of(obs)
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
