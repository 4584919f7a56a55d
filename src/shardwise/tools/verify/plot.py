"""One PNG of a :class:`VerifyReport` that a person reads at a glance (the ``plot`` extra: matplotlib).

Panels: steps per rank and epoch with ``len()`` marked (unequal bars are the hang); the rank x rank
matrix of indices two ranks share in epoch 0 (off the diagonal, 0 but for padding) with each
rank's distinct indices on the diagonal; batch size (and tokens, with lengths) per step and rank
in epoch 0; and every check's verdict. Uses matplotlib's object API (no pyplot, no global state).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from .report import ERROR, PASS, SKIPPED, WARNING, VerifyReport

INSTALL_HINT = "shardwise.tools.verify.plot needs 'matplotlib'; install it with: pip install 'shardwise[plot]'"
COLORS = {PASS: "#2e7d32", WARNING: "#ef6c00", ERROR: "#c62828", SKIPPED: "#757575"}


def require_matplotlib() -> None:
    """Raise ImportError with the install hint when matplotlib is missing (check before a long run)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(INSTALL_HINT) from None


def _steps(ax: Any, report: VerifyReport) -> None:
    from matplotlib.ticker import MaxNLocator

    steps = np.array(report.data["steps"], dtype=float)  # steps: (epochs, world_size)
    lengths = report.data["lengths"]
    epochs, world = steps.shape
    width = 0.8 / epochs
    ranks = np.arange(world)
    bad = report.check("equal_steps").verdict == ERROR
    for e in range(epochs):
        x = ranks - 0.4 + width * (e + 0.5)
        ax.bar(x, steps[e], width=width * 0.9, color=f"C{e}", label=f"epoch {e}")
        for xi, length in zip(x, lengths[e], strict=False):
            if length is not None:
                ax.plot([xi - width * 0.45, xi + width * 0.45], [length, length], color="black", lw=2)
    low, high = steps.min(), steps.max()
    known = [v for row in lengths for v in row if v is not None]
    top = max([high, *known])
    # Unequal steps: zoom on the difference (it is often one step in hundreds); equal: from 0.
    bottom = max(0.0, low - 0.3 * max(top - low, 1.0) - 1) if low != top else 0.0
    ax.set_ylim(bottom, top + 0.15 * max(top - bottom, 1.0) + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xticks(ranks)
    ax.set_xlabel("rank")
    ax.set_ylabel("steps in the epoch")
    title = "Steps per rank (bars) and len() (black)"
    if bad:
        finding = report.check("equal_steps").finding
        hang = finding.evidence.get("hang_step") if finding else None
        epoch = finding.evidence.get("epoch", 0) if finding else 0
        title += f"\nUNEQUAL: the run hangs at step {hang} of epoch {epoch}"
        if hang is not None:
            # Ranks whose bar rises above this line wait there for ranks that have finished.
            ax.axhline(hang + 0.5, color=COLORS[ERROR], ls="--", lw=1.5)
            ax.text(world - 0.5, hang + 0.5, f" hang at step {hang}", color=COLORS[ERROR], va="bottom", ha="right",
                    fontsize=9)
    ax.set_title(title, color=COLORS[ERROR] if bad else "black", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")


def _overlap(ax: Any, fig: Any, report: VerifyReport) -> None:
    matrix = np.array(report.data["overlap"][0], dtype=float)
    world = matrix.shape[0]
    off = matrix.copy()
    np.fill_diagonal(off, np.nan)
    image = ax.imshow(off, cmap="Reds", vmin=0, vmax=max(1.0, float(np.nanmax(off)) if world > 1 else 1.0))
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="indices shared")
    if world <= 16:
        for r in range(world):
            for r2 in range(world):
                value = int(matrix[r, r2])
                diagonal = r == r2
                size = (7 if world > 8 else 8) - (1 if value >= 10_000 else 0)
                ax.text(r2, r, f"{value}", ha="center", va="center", fontsize=size,
                        color="#555555" if diagonal else ("white" if value > np.nanmax(off) / 2 else "black"),
                        fontstyle="italic" if diagonal else "normal")
    ax.set_xticks(range(world))
    ax.set_yticks(range(world))
    ax.set_xlabel("rank")
    ax.set_ylabel("rank")
    coverage = report.data["coverage"][0]
    cover = "" if coverage is None else f"; coverage {coverage:.1%}"
    verdict = report.check("overlap").verdict
    ax.set_title(f"Indices shared by two ranks, epoch 0\n(diagonal: distinct indices on the rank{cover})",
                 fontsize=10, color=COLORS[ERROR] if verdict == ERROR else "black")


def _per_step(ax: Any, series: list[list[int]], what: str, verdict: str) -> None:
    from matplotlib.ticker import MaxNLocator

    steps = max((len(s) for s in series), default=0)
    for r, values in enumerate(series):
        ax.step(np.arange(len(values)), values, where="mid", lw=1.0 if steps < 500 else 0.6, alpha=0.8,
                label=f"rank {r}")
    ax.set_xlabel("step (epoch 0)")
    ax.set_ylabel(what)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.set_title(f"{what.capitalize()} per step and rank, epoch 0", fontsize=10,
                 color=COLORS[WARNING] if verdict == WARNING else "black")
    if len(series) <= 8:
        ax.legend(fontsize=7, ncol=min(len(series), 4), loc="lower left")


def _verdicts(ax: Any, report: VerifyReport) -> None:
    ax.axis("off")
    ax.set_title("Checks", fontsize=10, loc="left")
    rows = len(report.checks)
    for i, check in enumerate(report.checks):
        y = 1.0 - (i + 0.5) / max(rows, 1)
        ax.text(0.0, y, check.name, fontsize=9, va="center", transform=ax.transAxes)
        ax.text(0.45, y, check.verdict.upper(), fontsize=9, va="center", fontweight="bold",
                color=COLORS.get(check.verdict, "black"), transform=ax.transAxes)
        lines = textwrap.wrap(check.evidence, 62)
        evidence = "\n".join(lines[:2]) + (" ..." if len(lines) > 2 else "")
        ax.text(0.0, y - 0.2 / max(rows, 1), evidence, fontsize=7, va="top", color="#444444",
                transform=ax.transAxes)


def plot_report(report: VerifyReport, path: str | Path) -> Path:
    """Write the report's figure to ``path`` (PNG) and return the path.

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not report.data:
        raise ValueError("this report has no per-rank data to plot (the sampler failed before yielding)")
    tokens = report.data.get("tokens")
    fig = Figure(figsize=(17, 10), dpi=100)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 3, width_ratios=[1.0, 1.0, 0.9], hspace=0.38, wspace=0.3)
    _steps(fig.add_subplot(grid[0, 0]), report)
    _overlap(fig.add_subplot(grid[0, 1]), fig, report)
    balance = report.check("balance").verdict
    if tokens is not None:
        _per_step(fig.add_subplot(grid[1, 0]), report.data["batch_sizes"][0], "batch size", PASS)
        _per_step(fig.add_subplot(grid[1, 1]), tokens[0], "tokens", balance)
    else:
        _per_step(fig.add_subplot(grid[1, 0:2]), report.data["batch_sizes"][0],
                  "batch size" if report.kind == "batch" else "indices", balance)
    _verdicts(fig.add_subplot(grid[:, 2]), report)
    verdict = "SAFE" if report.ok else "NOT SAFE"
    fig.suptitle(
        f"shardwise verify {report.target}: {verdict} ({report.world_size} ranks, {report.epochs} epochs, "
        f"{report.mode})",
        fontsize=13, color=COLORS[PASS] if report.ok else COLORS[ERROR], fontweight="bold",
    )
    out = Path(path)
    fig.savefig(out, format="png")
    return out
