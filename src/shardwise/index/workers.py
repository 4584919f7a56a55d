"""Index builds on more than one core: a function mapped over tasks by the building process and fresh workers.

A build is done by one process per node (under the entry's lock), so a pure-Python step of it
(packing the strata of ``PackedBatchSampler``) would use one core while the others wait. :func:`map_tasks`
spreads such a step over ``workers`` extra processes and the building process itself.

Workers are fresh interpreters (``python -c``), not ``multiprocessing`` children: nothing of the
caller is re-imported (a training script without a ``__main__`` guard is safe), nothing is
forked (no lock or thread of the caller is copied), and they import only the module of the
function (the package's numpy layers load in ~0.2 s; torch is never imported). Each worker gets
its share of the tasks in one message and answers once; a worker that fails or dies raises in
the caller with its error. Results should be small: bulk output goes to files (the build's
memory maps), which workers open by path.

``SHARDWISE_BUILD_WORKERS`` sets the number of extra processes (``0``: the building process
alone); the default is one per CPU this process may use, less one, at most :data:`MAX_WORKERS`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, cast

from .._core.errors import check_int
from .._core.threads import build_threads, usable_cpus

MAX_WORKERS = 7
"""Extra processes at most by default (a build's pure-Python step scales to about 8 cores)."""
_SRC = str(Path(__file__).resolve().parents[2])  # the directory holding the shardwise package
_SERVE = "from shardwise.index.workers import serve; serve()"


def build_workers() -> int:
    """Extra processes for a parallel build step: ``SHARDWISE_BUILD_WORKERS``, else usable CPUs - 1 (at most 7).

    Raises:
        ValueError: ``SHARDWISE_BUILD_WORKERS`` is not a non-negative integer.
    """
    return build_threads(max(1, min(usable_cpus(), MAX_WORKERS + 1))) - 1


def serve() -> None:
    """A worker's main: read ``(function, tasks)`` from stdin, answer ``("ok", results)`` or ``("error", text)``."""
    try:
        function, tasks = pickle.load(sys.stdin.buffer)
        answer: tuple[str, Any] = ("ok", [function(task) for task in tasks])
    except BaseException:  # reported to the caller, which raises
        answer = ("error", traceback.format_exc())
    pickle.dump(answer, sys.stdout.buffer)
    sys.stdout.buffer.flush()


def map_tasks(
    function: Callable[[Any], Any],
    tasks: Sequence[Any],
    *,
    workers: int,
    what: str,
    on_done: Callable[[int], None] | None = None,
) -> list[Any]:
    """``[function(task) for task in tasks]``, computed by this process and ``workers`` fresh ones.

    Task ``i`` goes to process ``i % (workers + 1)`` (0: this one), so tasks of about equal cost
    spread evenly. ``function`` must be importable by name (a module-level function of a module
    that does not import torch) and ``tasks`` picklable.

    Args:
        what: the step, for error messages.
        on_done: told after each task this process computes how many tasks are done about
            then in all (``workers + 1``: the others run alongside), for a progress bar.

    Raises:
        RuntimeError: a worker failed (its traceback in the message) or died.
    """
    workers = min(check_int("workers", workers, minimum=0), max(len(tasks) - 1, 0))
    if not sys.executable:  # an embedded interpreter that cannot start another: this process alone
        workers = 0

    def local(task: Any) -> Any:
        result = function(task)
        if on_done is not None:
            on_done(workers + 1)
        return result

    if not workers:
        return [local(task) for task in tasks]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_SRC, os.environ.get("PYTHONPATH")]))}
    with contextlib.ExitStack() as stack:
        started: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
        stack.callback(_stop, started)
        for k in range(1, workers + 1):
            errors = stack.enter_context(tempfile.TemporaryFile())
            child = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=errors, env=env)  # fmt: skip
            started.append((child, errors))
            stdin = cast(IO[bytes], child.stdin)  # stdin=PIPE
            stdin.write(pickle.dumps((function, list(tasks[k :: workers + 1]))))
            stdin.close()
        results: list[Any] = [None] * len(tasks)
        results[:: workers + 1] = [local(task) for task in tasks[:: workers + 1]]
        for k, (worker, output) in enumerate(started, start=1):
            results[k :: workers + 1] = _answer(worker, output, what)
        return results


def _stop(started: list[tuple[subprocess.Popen[bytes], IO[bytes]]]) -> None:
    """Kill the workers still running (the caller failed or was interrupted) and reap them all."""
    for child, _ in started:
        if child.poll() is None:
            child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _answer(child: subprocess.Popen[bytes], errors: IO[bytes], what: str) -> list[Any]:
    with cast(IO[bytes], child.stdout) as stdout:  # stdout=PIPE
        data = stdout.read()
    child.wait()
    try:
        status, value = pickle.loads(data)
    except Exception:
        errors.seek(0)
        tail = errors.read()[-2000:].decode(errors="replace")
        raise RuntimeError(f"a worker process of {what} died (exit code {child.returncode}): {tail}") from None
    if status != "ok":
        raise RuntimeError(f"a worker process of {what} failed:\n{value}")
    result: list[Any] = value
    return result
