"""The ``shardwise`` command: ``demo`` (a real multi-process run), ``check`` (what this process resolves), ``verify``.

Each sub-command is added to the app by one function (``_add_verify`` is the pattern for a new one).

Needs the ``cli`` extra (typer, rich); imported only when the command runs. A command-line error
(a bad option value, an unknown option, a bad launcher environment) is one line on stderr naming
the option or variable and what it accepts, with exit status 2: never a traceback.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path  # at module level: typer resolves the verify command's annotations here
from typing import Any, NoReturn

INSTALL_HINT = "the shardwise command needs 'typer' and 'rich'; install them with: pip install 'shardwise[cli]'"


USAGE_ERROR = 2  # what click, argparse and POSIX utilities exit with on a command-line error


class CommandLineError(Exception):
    """A command-line error: printed as one line, exit status 2."""


def _cell(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _positive_seconds(value: float) -> float:
    import typer

    if not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"should be a positive, finite number of seconds, but got {value!r}")
    return value


def check_environment(*, launcher: bool) -> None:
    """Refuse a bad ``SHARDWISE_SEED`` (and, with ``launcher``, bad ``RANK``/``WORLD_SIZE``-style variables) now.

    Samplers resolve both lazily, at the first ``len()`` or iteration; a command resolves them
    before doing anything, so a bad variable is a one-line error naming it.
    """
    from .._core.seeds import SEED_ENV, resolve_seed
    from .._core.world import resolve_world

    try:
        world_size = resolve_world(None, None, dist=None, env=os.environ).world_size if launcher else 1
        if SEED_ENV in os.environ:
            resolve_seed(None, world_size=world_size, env=os.environ)
    except ValueError as error:
        raise CommandLineError(str(error)) from None


def _app() -> Any:
    import typer
    from rich.console import Console
    from rich.table import Table

    # rich_markup_mode=None: click's plain help, where a flag shows no "<bool>" after it as typer's panels did.
    app = typer.Typer(add_completion=False, no_args_is_help=True, help="shardwise: distributed data sampling.",
                      rich_markup_mode=None)
    # Piped output (CI logs) gets a wide table instead of rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 140)

    @app.callback()
    def root(
        version: bool = typer.Option(
            False, "--version", callback=_print_version, is_eager=True, help="Print the shardwise version and exit."
        ),
    ) -> None:
        """shardwise: distributed data sampling."""

    @app.command(short_help="Run a real gloo job and show what every rank drew.")
    def demo(
        world_size: int = typer.Option(2, "--world-size", "-w", min=1, max=16, help="Processes to spawn (gloo)."),
        size: int = typer.Option(9_600, "--size", "-n", min=0, help="Samples in the demo dataset."),
        epochs: int = typer.Option(2, "--epochs", "-e", min=1, help="Epochs each rank iterates."),
        timeout: float = typer.Option(
            300.0, callback=_positive_seconds, help="Seconds before every rank is killed and the demo fails."
        ),
    ) -> None:
        """Spawn a real torch.distributed (gloo, CPU) job; every rank iterates each sampler with an
        all_reduce per step; print what every rank drew."""
        check_environment(launcher=False)  # the demo sets its ranks' RANK/WORLD_SIZE itself
        from .demo import LEGEND, epoch_notes, epochs_differ, orders_line, run_demo, run_verify, size_notes, wrap
        from .scenarios import SCENARIOS

        def say(text: str, indent: int = 0, hanging: int = 2) -> None:
            # Wrapped here at word boundaries, not by rich (soft_wrap): rich's width is 140 in a pipe.
            console.print(wrap(text, console.width, indent, hanging), markup=False, highlight=False, soft_wrap=True)

        say(f"spawning {world_size} gloo ranks; {len(SCENARIOS)} samplers over a dataset of {size:,} samples; "
            f"{epochs} epochs")
        rows, reports = run_demo(world_size=world_size, size=size, epochs=epochs, timeout=timeout)
        say("What every rank drew, by sampler, epoch and rank (notes below the table where a sampler holds or draws "
            "another number, or its batches or padding change between epochs):")
        for line in LEGEND:
            say(line, indent=2)
        table = Table()
        columns = ("sampler", "epoch", "rank", "batches", "samples", "epoch total", "data", "overlap", "padding",
                   "coverage", "seed", "check")  # fmt: skip
        for column in columns:
            table.add_column(column, justify="left" if column in ("sampler", "check") else "right")
        for row in rows:
            table.add_row(
                row.scenario, str(row.epoch), str(row.rank), str(row.batches), f"{row.samples:,}", f"{row.drawn:,}",
                f"{row.data:,}", _cell(row.overlap), _cell(row.padding),
                "n/a" if row.coverage is None else f"{row.coverage:.1%}", str(row.seed), "ok" if row.ok else "FAIL",
            )
        console.print(table)
        for note in size_notes(rows, size) + epoch_notes(rows, size):
            say(note, indent=2, hanging=4)
        steps_equal = all(
            len({tuple(report[name]["steps"]) for report in reports}) == 1 for name in reports[0]
        )
        say(f"equal steps on every rank: {steps_equal}; {orders_line(epochs_differ(reports))}")
        ranks = max(world_size, 2)  # one rank cannot overlap with another
        console.print()
        say(f"shardwise verify, before training ({ranks} simulated ranks, 2 epochs):")
        verified = run_verify(world_size=ranks, timeout=timeout)
        for what, _, report in verified:
            say(f"{what}: {'safe, no finding' if report.ok else 'UNSAFE'}", indent=2)
            for finding in report.findings:
                say(f"{finding.check}: {finding.message.split('. ')[0]}", indent=4)
                say(f"fix: {finding.fix.split('. ')[0]}", indent=6)
        expected = all(report.ok == should_pass for _, should_pass, report in verified)
        say(f"verify caught the broken loader and passed the shardwise one: {expected}")
        if not (all(row.ok for row in rows) and steps_equal and expected):
            raise typer.Exit(1)

    @app.command(short_help="Show how this process resolves rank, world size and seed.")
    def check(
        size: int = typer.Option(1000, "--size", "-n", min=0, help="Dataset size for the example sampler."),
    ) -> None:
        """Show how this process resolves rank, world size and seed (run it under a launcher).

        Under torchrun: torchrun --nproc-per-node 2 -m shardwise check (torchrun runs a module with -m,
        or the installed command with --no-python shardwise check); under Slurm: srun shardwise check.
        """
        check_environment(launcher=True)
        from ..samplers.sharded import ShardedSampler
        from ..samplers.worker_seeds import fork_advice

        sampler = ShardedSampler(size, seed=None)
        for key, value in sampler.describe().items():
            console.print(f"{key:>14}: {value}")
        console.print(f"{'python':>14}: {fork_advice()}", markup=False, highlight=False, soft_wrap=True)

    _add_verify(app, console)
    from .which import add_which  # shardwise which: provenance (tools/which.py)

    add_which(app, console)
    return app


def _print_version(value: bool) -> None:
    import typer

    if value:
        from .._core.version import __version__

        print(f"shardwise {__version__}")
        raise typer.Exit(0)


def _click_exceptions() -> Any:
    """The module of the click exceptions typer raises (typer may ship its own copy of click)."""
    import typer

    return sys.modules[typer.BadParameter.__module__]


def _given(opts: list[str], argv: list[str]) -> str | None:
    """The value given on the command line to the option spelled ``opts`` (its last occurrence), if any."""
    found = None
    for i, token in enumerate(argv):
        for opt in opts:
            if token == opt and i + 1 < len(argv):
                found = f"{opt} {argv[i + 1]}"
            elif opt.startswith("--") and token.startswith(opt + "="):
                found = token
    return found


def _usage_line(error: Any, argv: list[str]) -> str:
    """One line for a click usage error, with the value given and the accepted options or commands."""
    message: str = error.format_message().rstrip(".")
    context = error.ctx
    param = getattr(error, "param", None)
    given = None if param is None else _given(list(param.opts), argv)
    if given is not None and given.split(" ", 1)[-1].split("=", 1)[-1] not in message:
        message += f", but got {given}"
    if isinstance(error, _click_exceptions().NoSuchOption) and context is not None:
        options = sorted({o for p in context.command.params for o in p.opts if o.startswith("--")} | {"--help"})
        message += f"; options: {', '.join(options)}"
    elif message.startswith("No such command") and context is not None and hasattr(context.command, "list_commands"):
        message += f"; commands: {', '.join(context.command.list_commands(context))}"
    where = context.command_path if context is not None else "shardwise"
    return f"{where}: error: {message}".replace("\n", " ")


def _fail(line: str) -> NoReturn:
    print(line, file=sys.stderr)
    raise SystemExit(USAGE_ERROR)


def _verify_exit(message: str, code: int) -> Any:
    """Print one line to stderr and exit with ``code`` (no traceback)."""
    import typer

    print(f"shardwise verify: error: {message}", file=sys.stderr)
    return typer.Exit(code)


VERIFY_EPILOG = (
    "The factory: a module-level function that returns a Sampler, a batch sampler or a map-style DataLoader. "
    "It is called once per rank in fresh processes, with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR... set "
    "and rank=/world_size= keywords if it names them; a script without an if __name__ == '__main__': guard "
    "is imported only up to its own verify() call.\n\n"
    "Exit status: 0 safe (warnings allowed); 1 a finding would break training, the sampler raised, or "
    "verify timed out; 2 a usage error (bad option, target that cannot be imported or called, or that "
    "returns something else than a sampler; --json-file/--plot into a folder that does not exist).\n\n"
    "--json prints the report as JSON on stdout (nothing else), as in shardwise which; --json-file PATH writes "
    "it to a file (--json PATH, the older spelling, still works)."
)


def _writable(option: str, path: Path | None) -> None:
    """Refuse, before any work, an output path whose folder does not exist."""
    if path is None:
        return
    folder = path.resolve().parent
    if not folder.is_dir():
        raise _verify_exit(
            f"{option} {str(path)!r}: the folder {str(folder)!r} does not exist; create it first (mkdir -p)", 2
        )
    if path.is_dir():
        raise _verify_exit(f"{option} {str(path)!r} is a folder; give a file name, e.g. {path / 'report'}", 2)


def _read_lengths(path: Path | None) -> Any:
    """``verify --lengths``: the ``.npy`` array, or a usage error naming the file."""
    if path is None:
        return None
    import numpy as np

    try:
        return np.load(path)
    except (OSError, ValueError) as error:
        raise _verify_exit(f"cannot read --lengths {str(path)!r}: {error}", 2) from None


def _write_report(report: Any, as_json: bool, json_path: Path | None, plot_path: Path | None) -> None:
    """``verify``'s outputs: the JSON on stdout (``--json``), into ``--json-file``, the PNG (``--plot``)."""
    if as_json:
        print(report.to_json(indent=2))
    if json_path is not None:
        json_path.write_text(report.to_json(indent=2))
    if plot_path is not None:
        from .verify.plot import plot_report

        plot_report(report, plot_path)


def _add_verify(app: Any, console: Any) -> None:
    """The ``verify`` command: exit 0 when safe, 1 when a finding breaks training, 2 on usage errors."""
    import typer

    @app.command("verify", epilog=VERIFY_EPILOG, short_help="Prove a sampler or DataLoader safe before training.")  # type: ignore[untyped-decorator]
    def verify_command(
        target: str = typer.Argument(..., help="path/to/file.py:make_loader or package.module:make_loader."),
        world_size: int = typer.Option(4, "--world-size", "-w", min=1, max=256, help="Ranks to verify."),
        epochs: int = typer.Option(2, "--epochs", "-e", min=1, help="Epochs every rank iterates."),
        spawn: bool = typer.Option(False, "--spawn", help="Run a real gloo group of --world-size processes."),
        size: int | None = typer.Option(None, "--size", "-n", min=0, help="Dataset size, for coverage."),
        # B008: typer declares options as call defaults; these are evaluated once, read-only.
        lengths: Path | None = typer.Option(None, "--lengths", help=".npy of per-sample lengths."),  # noqa: B008
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of a table."),
        json_path: Path | None = typer.Option(None, "--json-file", help="Also write the report as JSON here."),  # noqa: B008
        plot_path: Path | None = typer.Option(None, "--plot", help="Write a PNG (needs matplotlib)."),  # noqa: B008
        timeout: float = typer.Option(300.0, "--timeout", min=1.0, help="Seconds before verify gives up."),
        state: Path | None = typer.Option(None, "--state", help="Saved state or checkpoint: check its skip ledger."),  # noqa: B008
    ) -> None:
        """Prove a sampler, batch sampler or DataLoader safe for distributed training, before the run."""
        from rich.table import Table

        _writable("--json-file", json_path)
        _writable("--plot", plot_path)
        from .verify import TargetError, verify
        from .verify.report import ERROR, PASS, SKIPPED, WARNING

        if plot_path is not None:
            from .verify.plot import require_matplotlib

            try:
                require_matplotlib()
            except ImportError as error:
                raise _verify_exit(str(error), 2) from None
        lengths_array = _read_lengths(lengths)
        try:
            report = verify(
                target, world_size=world_size, epochs=epochs, dataset_size=size, lengths=lengths_array,
                spawn=spawn, timeout=timeout, state=state,
            )
        except (TargetError, ValueError, TypeError) as error:
            raise _verify_exit(str(error).splitlines()[0], 2) from None
        except (TimeoutError, RuntimeError) as error:
            raise _verify_exit(str(error).splitlines()[0], 1) from None
        _write_report(report, as_json, json_path, plot_path)
        if as_json:  # stdout holds the JSON only, for a pipe
            raise typer.Exit(0 if report.ok else 1)
        styles = {PASS: "green", WARNING: "yellow", ERROR: "bold red", SKIPPED: "dim"}
        table = Table(title=f"shardwise verify {report.target} ({report.mode}, {report.world_size} ranks, "
                      f"{report.epochs} epochs)")
        for column in ("check", "verdict", "evidence", "fix"):
            table.add_column(column, overflow="fold")
        for check in report.checks:
            fix = check.finding.fix if check.finding else ""
            table.add_row(check.name, f"[{styles[check.verdict]}]{check.verdict}[/]", check.evidence, fix)
        console.print(table)
        for finding in report.findings:
            console.print(f"[{styles[finding.severity]}]{finding.severity}[/] {finding.check}: {finding.message}")
        if json_path is not None:
            console.print(f"report written to {json_path}")
        if plot_path is not None:
            console.print(f"plot written to {plot_path}")
        console.print("[green]safe for distributed training[/]" if report.ok else
                      "[bold red]NOT safe: a finding above would break training[/]")
        if not report.ok:
            raise typer.Exit(1)


def legacy_json(args: list[str], command: Any) -> list[str]:
    """``--json PATH`` (and ``--json=PATH``), the older spelling of ``--json-file PATH``, as ``--json-file``.

    ``--json`` is a flag in every command (JSON on stdout); ``verify --json report.json`` wrote a file
    before, and still does: the token after ``--json`` is taken as its path when the command would
    otherwise get one positional argument too many.
    """
    name = next((token for token in args if not token.startswith("-")), None)
    sub = getattr(command, "commands", {}).get(name) if name is not None else None
    if name is None or sub is None or not any("--json-file" in p.opts for p in sub.params):
        return args
    out = [f"--json-file={t.split('=', 1)[1]}" if t.startswith("--json=") else t for t in args]
    if "--json" not in out:
        return out
    takes_value = {o for p in sub.params if not getattr(p, "is_flag", False) and p.param_type_name == "option"
                   for o in p.opts}  # fmt: skip
    positional, skip = [], False
    for i, token in enumerate(out[out.index(name) + 1 :], start=out.index(name) + 1):
        if skip:
            skip = False
        elif token in takes_value:
            skip = True
        elif not token.startswith("-"):
            positional.append(i)
    wanted = sum(1 for p in sub.params if p.param_type_name == "argument")
    at = out.index("--json")
    if len(positional) > wanted and at + 1 in positional:
        out[at] = "--json-file"
    return out


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``shardwise`` console script and ``python -m shardwise``."""
    try:
        app = _app()
        import typer
    except ImportError:
        _fail(INSTALL_HINT)
    command = typer.main.get_command(app)
    click = _click_exceptions()
    args = legacy_json(sys.argv[1:] if argv is None else list(argv), command)
    try:
        # standalone_mode=False: click hands errors to us instead of printing a multi-line box.
        code = command.main(args=args, prog_name="shardwise", standalone_mode=False)
    except click.NoArgsIsHelpError as error:
        print(error.format_message(), file=sys.stderr)
        raise SystemExit(USAGE_ERROR) from None
    except click.UsageError as error:
        _fail(_usage_line(error, args))
    except CommandLineError as error:
        _fail(f"shardwise: error: {error}")
    except typer.Abort:
        _fail("shardwise: aborted")
    raise SystemExit(code if isinstance(code, int) else 0)
