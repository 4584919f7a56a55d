"""The ``shardwise`` command: ``demo`` (a real multi-process run) and ``check`` (what this process resolves).

Needs the ``cli`` extra (typer, rich); imported only when the command runs.
"""

from __future__ import annotations

import sys
from typing import Any

INSTALL_HINT = "the shardwise command needs 'typer' and 'rich'; install them with: pip install 'shardwise[cli]'"


def _cell(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _app() -> Any:
    import typer
    from rich.console import Console
    from rich.table import Table

    app = typer.Typer(add_completion=False, no_args_is_help=True, help="shardwise: distributed data sampling.")
    # Piped output (CI logs) gets a wide table instead of rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 140)

    @app.command()
    def demo(
        world_size: int = typer.Option(2, "--world-size", "-w", min=1, max=16, help="Processes to spawn (gloo)."),
        size: int = typer.Option(9_600, "--size", "-n", min=0, help="Samples in the demo dataset."),
        epochs: int = typer.Option(2, "--epochs", "-e", min=1, help="Epochs each rank iterates."),
        timeout: float = typer.Option(300.0, help="Seconds before every rank is killed and the demo fails."),
    ) -> None:
        """Spawn a real torch.distributed (gloo, CPU) job; every rank iterates each sampler with an
        all_reduce per step; print what every rank drew."""
        from ._demo import SCENARIOS, epochs_differ, run_demo

        console.print(f"spawning {world_size} gloo ranks; {len(SCENARIOS)} samplers; {size} samples; {epochs} epochs")
        rows, reports = run_demo(world_size=world_size, size=size, epochs=epochs, timeout=timeout)
        table = Table(title="What every rank drew (overlap must not exceed padding; coverage must be 100%; n/a: draws)")
        for column in ("sampler", "epoch", "rank", "batches", "samples", "overlap", "padding", "coverage", "seed", ""):
            table.add_column(column, justify="left" if column in ("sampler", "") else "right")
        for row in rows:
            table.add_row(
                row.scenario, str(row.epoch), str(row.rank), str(row.batches), str(row.samples), _cell(row.overlap),
                _cell(row.padding), "n/a" if row.coverage is None else f"{row.coverage:.1%}", str(row.seed),
                "ok" if row.ok else "FAIL",
            )
        console.print(table)
        differ = epochs_differ(reports)
        steps_equal = all(
            len({tuple(report[name]["steps"]) for report in reports}) == 1 for name in reports[0]
        )
        console.print(f"equal steps on every rank: {steps_equal}; epoch orders differ: {differ}")
        if not (all(row.ok for row in rows) and steps_equal):
            raise typer.Exit(1)

    @app.command()
    def check(
        size: int = typer.Option(1000, "--size", "-n", min=0, help="Dataset size for the example sampler."),
    ) -> None:
        """Show how this process resolves rank, world size and seed (run it under torchrun or srun)."""
        from ._sharded import ShardedSampler

        sampler = ShardedSampler(size, seed=None)
        for key, value in sampler.describe().items():
            console.print(f"{key:>14}: {value}")

    return app


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``shardwise`` console script and ``python -m shardwise``."""
    try:
        app = _app()
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        raise SystemExit(2) from None
    app(args=argv, prog_name="shardwise")
