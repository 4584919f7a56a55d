"""``shardwise which``: the samples a step trained, or the steps a sample trained at, from the command line.

The target is the factory ``verify`` takes (``path/to/file.py:make_loader`` or ``package.module:fn``,
returning a shardwise sampler, batch sampler or a DataLoader over one); ``--state`` loads a saved
sampler state (a ``torch.save``'d or JSON file: the state itself or a checkpoint holding it) whose
epoch and position number the steps, so step 0 is the first step after that checkpoint.

Registered by ``shardwise.tools.cli`` through :func:`add_which`. Bad input is one line on stderr,
exit status 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

USAGE_ERROR = 2


class WhichError(ValueError):
    """Bad input to ``shardwise which``: printed as one line, exit status 2."""


def state_path(saved: object, depth: int = 8) -> list[Any]:
    """The keys leading to the shardwise sampler state in ``saved`` (``[]``: ``saved`` is the state).

    Searched breadth first through dicts and lists, as deep as a Lightning checkpoint nests it
    (``loops/fit_loop/state_dict/combined_loader/0/...``).
    """
    from .._core.state import KEYS  # here: the command line builds without numpy (shardwise --version)

    level: list[tuple[list[Any], object]] = [([], saved)]
    for _ in range(depth):
        nested: list[tuple[list[Any], object]] = []
        for path, item in level:
            if isinstance(item, Mapping):
                if all(key in item for key in KEYS):
                    return path
                nested.extend(([*path, key], value) for key, value in item.items())
            elif isinstance(item, (list, tuple)):
                nested.extend(([*path, key], value) for key, value in enumerate(item))
        level = nested
    raise WhichError(
        f"no shardwise sampler state (a dict with keys {', '.join(KEYS)}) found in the --state file; "
        "save sampler.state_dict() (or a checkpoint dict holding it)"
    )


def find_state(saved: object) -> dict[str, Any]:
    """The shardwise sampler state in ``saved``: the state itself, or the first one nested in a checkpoint dict."""
    item: Any = saved
    for key in state_path(saved):
        item = item[key]
    return dict(item)


def read_file(path: Path) -> tuple[object, bool]:
    """``(contents, is_json)`` of a state or checkpoint saved as JSON or with ``torch.save`` (weights only)."""
    if path.is_dir():
        from .checkpoints import folder_message

        raise WhichError(folder_message(path))
    if not path.is_file():
        raise WhichError(f"--state {str(path)!r} does not exist")
    try:
        return json.loads(path.read_text()), True
    except (UnicodeDecodeError, ValueError):
        import torch

        try:
            return torch.load(path, map_location="cpu", weights_only=True), False
        except Exception as error:  # any unpickling failure is bad input here
            raise WhichError(f"cannot read --state {str(path)!r} as JSON or torch.save output: {error}") from None


def load_state_file(path: Path) -> dict[str, Any]:
    """Read a state saved with ``torch.save`` (weights only) or as JSON, and find the sampler state in it."""
    return find_state(read_file(path)[0])


def parse_epochs(text: str, option: str = "--epochs") -> range:
    """``"3"`` -> ``range(3, 4)``; ``"0:5"`` -> ``range(0, 5)`` (the stop excluded); errors name ``option``."""
    first, sep, stop = text.partition(":")
    try:
        low = int(first)
        high = int(stop) if sep else low + 1
    except ValueError:
        raise WhichError(f"{option} should be a number or a range 'first:stop', but got {option} {text!r}") from None
    if low < 0 or high <= low:
        raise WhichError(
            f"{option} should be a non-empty range 'first:stop' of numbers >= 0, but got {option} {text!r}"
        )
    return range(low, high)


def build(target: str, world_size: int) -> Any:
    """Call the factory as ``verify`` does (``rank=0``, ``world_size=``), returning what it builds.

    Raises:
        WhichError: the target cannot be imported, or calling it raised (any exception: the
            factory is the user's input, and ``verify`` treats a factory that raises as bad input too).
    """
    from .verify.target import TargetError, call_factory, load_spec

    try:
        factory = load_spec(target)
    except TargetError as error:
        raise WhichError(str(error)) from None
    try:
        return call_factory(factory, 0, world_size)
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise WhichError(
            f"calling {target} as rank 0 of {world_size} raised {type(error).__name__}: {first}"
        ) from None


def run(
    target: str,
    *,
    world_size: int,
    epoch: int | None,
    step: int | None,
    rank: int | None,
    sample: int | None,
    epochs: str | None,
    batch_size: int | None,
    start: int | None,
    state: Path | None,
) -> tuple[str, list[dict[str, Any]]]:
    """The rows to print: ``("batches", ...)`` for ``--step``, ``("trained", ...)`` for ``--sample``."""
    from .._core.state import CONSUMED, EPOCH
    from ..samplers.provenance import resolve, when, which

    if (step is None) == (sample is None):
        raise WhichError("pass either --step (which samples a step trained) or --sample (when a sample trained)")
    span = parse_epochs(epochs) if epochs is not None else None  # checked whatever it is for: never ignored
    if span is not None and step is not None:
        raise WhichError(
            f"--epochs applies to --sample (the epochs to search), but got --epochs {epochs!r} with --step; "
            "pass --epoch N for the epoch of --step"
        )
    obj = build(target, world_size)
    try:
        sampler, per_step, _ = resolve(obj, batch_size)
    except (TypeError, ValueError) as error:
        message = (
            str(error).replace("pass batch_size=...", "pass --batch-size").replace("leave it out", "drop --batch-size")
        )
        raise WhichError(f"{target} built {type(obj).__name__}: {message}") from None
    if state is not None:
        saved = load_state_file(state)
        sampler.load_state_dict(saved)
        epoch = saved[EPOCH] if epoch is None else epoch
        start = saved[CONSUMED] if start is None and epoch == saved[EPOCH] else start
    common: dict[str, Any] = {"batch_size": batch_size, "world_size": world_size, "start": start or 0}
    if step is not None:
        batches = which(obj, epoch=0 if epoch is None else epoch, step=step, rank=rank, **common)
        rows = [b.to_dict() for b in batches]
        weights_at = getattr(sampler, "weights_at", None)  # a mixture: the weights in force at the step
        if rows and weights_at is not None:
            first = (start or 0) + step * world_size * per_step
            shares = weights_at(rows[0]["epoch"], min(first, sampler.plan.size(rows[0]["epoch"]) - 1))
            names = getattr(sampler, "source_names", range(len(shares)))
            in_force = {str(name): round(w, 6) for name, w in zip(names, shares, strict=True)}
            rows = [{**row, "weights": in_force} for row in rows]
        return "batches", rows
    if span is None:
        span = range(epoch or 0, (epoch or 0) + 1)
    return "trained", [t.to_dict() for t in when(obj, sample or 0, epochs=span, **common)]


def add_which(app: Any, console: Any) -> None:
    """Register ``shardwise which`` (and ``shardwise skip``) on the typer ``app``."""
    import typer

    add_skip(app, console)

    @app.command("which", short_help="Which samples a step trained, or when a sample trained.")  # type: ignore[untyped-decorator]
    def which_command(
        target: str = typer.Argument(..., help="path/to/file.py:make_loader or package.module:make_loader."),
        world_size: int = typer.Option(..., "--world-size", "-w", min=1, help="Ranks of the run."),
        step: int | None = typer.Option(None, "--step", "-s", min=0, help="Step within the pass (from 0)."),
        rank: int | None = typer.Option(None, "--rank", "-r", min=0, help="One rank (default: every rank)."),
        sample: int | None = typer.Option(None, "--sample", min=0, help="Sample id: when was it trained?"),
        epoch: int | None = typer.Option(None, "--epoch", "-e", min=0, help="Epoch (default: 0, or the state's)."),
        epochs: str | None = typer.Option(None, "--epochs", help="Epochs for --sample: 'first:stop'."),
        batch_size: int | None = typer.Option(None, "--batch-size", "-b", min=1, help="Per-rank batch size."),
        start: int | None = typer.Option(None, "--start", min=0, help="Plan position the pass began at."),
        # B008: typer declares options as call defaults; evaluated once, read-only.
        state: Path | None = typer.Option(None, "--state", help="Saved sampler state or checkpoint."),  # noqa: B008
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
        json_path: Path | None = typer.Option(None, "--json-file", help="Also write the JSON here."),  # noqa: B008
    ) -> None:
        """Which samples a step trained on each rank, or at which (epoch, step, rank) a sample trained."""
        from rich.table import Table

        from .._core.errors import MalformedStateError, StateMismatchError
        from .._core.mixture import PendingWeightsError
        from ..samplers.provenance import ProvenanceUnsupported

        try:
            kind, rows = run(
                target, world_size=world_size, epoch=epoch, step=step, rank=rank, sample=sample, epochs=epochs,
                batch_size=batch_size, start=start, state=state,
            )  # fmt: skip
        except (WhichError, ValueError, TypeError, ProvenanceUnsupported, MalformedStateError, StateMismatchError,
                PendingWeightsError) as error:  # fmt: skip
            print(f"shardwise which: error: {str(error).splitlines()[0]}", file=sys.stderr)
            raise typer.Exit(USAGE_ERROR) from None
        if json_path is not None:
            try:
                json_path.write_text(json.dumps({kind: rows}))
            except OSError as error:
                print(f"shardwise which: error: --json-file {str(json_path)!r}: {error.strerror}", file=sys.stderr)
                raise typer.Exit(USAGE_ERROR) from None
        if as_json:
            print(json.dumps({kind: rows}))
            return
        table = Table(title=f"shardwise which {target} ({world_size} ranks)")
        columns = ["epoch", "step", "rank"] + (["samples"] if kind == "batches" else ["plan position"])
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            if kind == "batches":
                if row["sources"] is None:
                    cell = ", ".join(map(str, row["indices"]))
                else:
                    cell = ", ".join(
                        f"{i} ({name}[{k}])"
                        for i, name, k in zip(row["indices"], row["sources"], row["source_indices"], strict=True)
                    )
                table.add_row(str(row["epoch"]), str(row["step"]), str(row["rank"]), cell)
            else:
                table.add_row(str(row["epoch"]), str(row["step"]), str(row["rank"]), str(row["position"]))
        console.print(table)
        if rows and "weights" in rows[0]:
            console.print("weights in force: " + ", ".join(f"{k} {v:.4f}" for k, v in rows[0]["weights"].items()))
        if not rows:
            console.print("not trained in these epochs")


def parse_ids(texts: list[str]) -> list[tuple[int, int]]:
    """``["10-19", "42", "7-8,30"]`` -> ``[(10, 20), (42, 43), (7, 9), (30, 31)]``: ``A-B`` includes both ends."""
    spans = []
    for text in (part.strip() for joined in texts for part in joined.split(",")):
        first, sep, last = text.partition("-")
        try:
            low, high = int(first), int(last) if sep else int(first)
        except ValueError:
            raise WhichError(f"--ids should be ids 'A' or ranges 'A-B' (ends included), but got {text!r}") from None
        if low < 0 or high < low:
            raise WhichError(f"--ids should be ranges 'A-B' with 0 <= A <= B, but got --ids {text!r}")
        spans.append((low, high + 1))
    return spans


def skip(target: str, *, world_size: int, state: Path, steps: str | None, epoch: int | None, batch_size: int | None,
         out: Path, ids: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Add steps ``first:stop`` after the checkpoint in ``state``, or sample ``ids``, to its ledger; write ``out``."""
    from .._core.state import CONSUMED, EPOCH
    from ..samplers.provenance import resolve, skip_steps

    if (steps is None) == (not ids):
        raise WhichError("pass exactly one of --steps (steps after the checkpoint) and --ids (sample ids)")
    saved, is_json = read_file(state)
    path = state_path(saved)
    current = find_state(saved)
    obj = build(target, world_size)
    try:
        sampler, _, _ = resolve(obj, batch_size)
    except (TypeError, ValueError) as error:
        raise WhichError(f"{target} built {type(obj).__name__}: {error}") from None
    sampler.load_state_dict(current)
    done: dict[str, Any]
    if ids:
        spans = parse_ids(ids)
        try:
            sampler.skip_id_ranges(spans, epoch=epoch)
        except ValueError as error:  # the rows are what --ids gave
            raise WhichError(str(error).replace("ranges should", "--ids should", 1)) from None
        done = {"ids": [list(span) for span in spans]}
    else:
        span = parse_epochs(steps or "", "--steps")
        epoch = current[EPOCH] if epoch is None else epoch
        start = current[CONSUMED] if epoch == current[EPOCH] else 0
        positions = skip_steps(obj, epoch=epoch, steps=span, batch_size=batch_size, world_size=world_size, start=start)
        done = {"epoch": epoch, "steps": [span.start, span.stop], "positions": list(positions)}
    edited = sampler.state_dict()
    if path:
        holder: Any = saved
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = edited
    else:
        saved = edited
    if is_json:
        out.write_text(json.dumps(saved))
    else:
        import torch

        torch.save(saved, out)
    return {**done, "ranges": len(edited.get("skip", ())), "id_ranges": len(edited.get("skip_ids", ()))}


def add_skip(app: Any, console: Any) -> None:
    """Register ``shardwise skip`` on the typer ``app``."""
    import typer

    @app.command("skip", short_help="Never train some steps or sample ids again: edit a saved state.")  # type: ignore[untyped-decorator]
    def skip_command(
        target: str = typer.Argument(..., help="path/to/file.py:make_loader or package.module:make_loader."),
        world_size: int = typer.Option(..., "--world-size", "-w", min=1, help="Ranks of the run that trains next."),
        # B008: typer declares options as call defaults; evaluated once, read-only.
        state: Path = typer.Option(..., "--state", help="Saved sampler state or checkpoint."),  # noqa: B008
        steps: str | None = typer.Option(None, "--steps", help="Steps after the checkpoint to skip: 'first:stop'."),
        ids: list[str] | None = typer.Option(  # noqa: B008
            None, "--ids", help="Sample ids never to train again: 'A-B' (both included), 'A', comma-separated."
        ),
        out: Path = typer.Option(..., "--out", help="Where to write the edited state or checkpoint."),  # noqa: B008
        epoch: int | None = typer.Option(None, "--epoch", "-e", min=0, help="Epoch (default: the state's)."),
        batch_size: int | None = typer.Option(None, "--batch-size", "-b", min=1, help="Per-rank batch size."),
    ) -> None:
        """Never train the samples of some steps (--steps) or some sample ids (--ids): edit a saved state."""
        from .._core.errors import MalformedStateError, StateMismatchError

        try:
            done = skip(target, world_size=world_size, state=state, steps=steps, epoch=epoch, batch_size=batch_size,
                        out=out, ids=ids)  # fmt: skip
        except (WhichError, ValueError, TypeError, MalformedStateError, StateMismatchError,
                NotImplementedError) as error:  # fmt: skip
            print(f"shardwise skip: error: {str(error).splitlines()[0]}", file=sys.stderr)
            raise typer.Exit(USAGE_ERROR) from None
        if "ids" in done:
            shown = ", ".join(f"{a}-{b - 1}" for a, b in done["ids"])
            console.print(f"sample ids {shown} are never trained again (every later epoch, any world size); the state "
                          f"holds {done['id_ranges']} id range(s). Written to {out}")  # fmt: skip
            return
        console.print(
            f"epoch {done['epoch']}: steps {done['steps'][0]}-{done['steps'][1] - 1} after the checkpoint are plan "
            f"positions [{done['positions'][0]}, {done['positions'][1]}), never trained; the ledger holds "
            f"{done['ranges']} range(s). Written to {out}"
        )
