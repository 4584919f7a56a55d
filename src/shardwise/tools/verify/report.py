"""The verdict of ``verify``: every check with its evidence, the findings, and per-rank data for plots."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ERROR = "error"
"""A finding that breaks training: a hang, samples trained twice or never, a run that cannot be reproduced."""
WARNING = "warning"
"""A finding that costs speed or quality without breaking the run."""
PASS = "pass"
SKIPPED = "skipped"


class VerificationError(AssertionError):
    """Raised by :meth:`VerifyReport.raise_for_findings`; an ``AssertionError`` so pytest reports it as a failure."""


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into JSON types."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


@dataclass(frozen=True)
class Finding:
    """One problem: which check found it, how bad, what happens in training, the fix, and the evidence."""

    check: str
    severity: str
    message: str
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check, "severity": self.severity, "message": self.message, "fix": self.fix,
            "evidence": plain(self.evidence),
        }

    def __str__(self) -> str:
        return f"[{self.severity}] {self.check}: {self.message} Fix: {self.fix}"


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict (``pass``, ``warning``, ``error`` or ``skipped``) and a one-line evidence."""

    name: str
    verdict: str
    evidence: str
    finding: Finding | None = None


@dataclass
class VerifyReport:
    """What ``shardwise.verify`` found, check by check.

    Attributes:
        target: the factory verified.
        world_size: ranks simulated (or spawned).
        epochs: epochs every rank iterated.
        kind: ``"batch"`` (steps are batches) or ``"index"`` (steps are single indices).
        checks: every check with its verdict, in a fixed order.
        data: per-epoch, per-rank (and per-step) figures for plots: ``steps[e][r]``, ``lengths[e][r]``
            (``len()`` before the epoch), ``batch_sizes[e][r][k]``, ``tokens[e][r][k]`` (None without
            lengths), ``overlap[e][r][r2]`` (indices shared by two ranks; the diagonal is each rank's
            distinct indices) and ``coverage[e]`` (None when the dataset size is unknown).

    Example:
        >>> from shardwise.tools.verify import VerifyReport
        >>> VerifyReport("m:f", 2, 1, "batch", []).ok
        True
    """

    target: str
    world_size: int
    epochs: int
    kind: str
    checks: list[CheckResult]
    data: dict[str, Any] = field(default_factory=dict)
    mode: str = "simulated"

    @property
    def findings(self) -> list[Finding]:
        """Every warning and error, errors first."""
        found = [c.finding for c in self.checks if c.finding is not None]
        return sorted(found, key=lambda f: f.severity != ERROR)

    @property
    def ok(self) -> bool:
        """True when no finding would break training (warnings allowed)."""
        return not any(f.severity == ERROR for f in self.findings)

    def check(self, name: str) -> CheckResult:
        """The result of the check called ``name``."""
        for result in self.checks:
            if result.name == name:
                return result
        raise KeyError(f"no check named {name!r}; checks: {[c.name for c in self.checks]}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: configuration, verdicts, findings and the per-rank data."""
        return {
            "target": self.target,
            "ok": self.ok,
            "mode": self.mode,
            "world_size": self.world_size,
            "epochs": self.epochs,
            "kind": self.kind,
            "checks": [{"name": c.name, "verdict": c.verdict, "evidence": c.evidence} for c in self.checks],
            "findings": [f.to_dict() for f in self.findings],
            "data": plain(self.data),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def raise_for_findings(self, severity: str = ERROR) -> None:
        """Raise :class:`VerificationError` listing the findings at ``severity`` or worse (for a user's own tests).

        Args:
            severity: ``"error"`` (default) ignores warnings; ``"warning"`` raises on those too.
        """
        if severity not in (ERROR, WARNING):
            raise ValueError(f"severity should be 'error' or 'warning', but got severity={severity!r}")
        found = [f for f in self.findings if f.severity == ERROR or severity == WARNING]
        if found:
            lines = "\n".join(f"- {f}" for f in found)
            raise VerificationError(f"{self.target} is not safe for distributed training:\n{lines}")

    def summary(self) -> str:
        """A plain-text table of the checks (the CLI prints a richer one)."""
        width = max(len(c.name) for c in self.checks) if self.checks else 0
        lines = [f"verify {self.target} ({self.mode}, {self.world_size} ranks, {self.epochs} epochs): "
                 + ("safe" if self.ok else "NOT SAFE")]
        lines += [f"  {c.name:<{width}}  {c.verdict:<7}  {c.evidence}" for c in self.checks]
        return "\n".join(lines)

    def __repr__(self) -> str:
        verdicts = {c.name: c.verdict for c in self.checks}
        return f"VerifyReport(target={self.target!r}, ok={self.ok}, world_size={self.world_size}, checks={verdicts})"
