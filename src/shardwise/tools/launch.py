"""Run a function on W real ``torch.distributed`` (gloo) ranks on this machine, with a deadline.

Used by ``shardwise demo`` and by the test suite. Nothing here may hang: the group's collective
timeout makes a rank that waits on a missing peer raise, and the parent kills every rank that is
still running when the deadline passes and raises ``TimeoutError``. Nothing outlives the call:
each rank leads a process group of its own, killed once the rank is gone.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

_POLL = 0.05


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    init_file: str,
    collective_timeout: float,
    args: tuple[Any, ...],
    results: Any,
) -> None:
    import torch.distributed as dist

    if hasattr(os, "setsid"):
        # A process group of its own, which the parent kills once the rank is gone: what the rank
        # started (DataLoader workers, a fork server, a resource tracker) goes with it, also when the
        # rank was killed (a fork server's workers keep it alive, and it them, past their rank).
        os.setsid()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=collective_timeout),
        )
        try:
            value = fn(rank, world_size, *args)
        finally:
            # What ``fn`` left in reference cycles (a DDP model holds the group) is freed while the
            # interpreter is alive: gloo work released during interpreter shutdown aborts the process.
            gc.collect()
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        raise SystemExit(1) from None


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    collective_timeout: float = 30.0,
) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes joined in a gloo group.

    Args:
        fn: a module-level function (spawned processes import it by name).
        world_size: number of ranks to start.
        timeout: seconds for the whole run; past it every rank is killed.
        collective_timeout: seconds any one collective may wait for its peers before it raises.

    Returns:
        What ``fn`` returned on each rank, by rank.

    Raises:
        TimeoutError: the run passed ``timeout`` (a rank hung, for instance on a length mismatch).
        RuntimeError: a rank raised; the message carries its traceback.
    """
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="shardwise-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        processes = [
            ctx.Process(
                target=_child,
                args=(fn, rank, world_size, init_file, collective_timeout, args, results),
                # Not daemonic: a rank, like a torchrun rank, may start DataLoader workers. The
                # finally block below kills any rank still alive, so none outlives the call.
                daemon=False,
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout
        values: dict[int, Any] = {}
        failures: dict[int, str] = {}
        try:
            while len(values) + len(failures) < world_size:
                try:
                    rank, ok, value = results.get(timeout=_POLL)
                except queue.Empty:
                    dead = [r for r, p in enumerate(processes) if p.exitcode not in (None, 0)]
                    silent = [r for r in dead if r not in values and r not in failures]
                    if silent and not _drain(results, values, failures):
                        for r in silent:
                            failures[r] = f"rank {r} exited with code {processes[r].exitcode} and no result"
                    if time.monotonic() > deadline:
                        missing = sorted(set(range(world_size)) - set(values) - set(failures))
                        raise TimeoutError(
                            f"distributed run of {fn.__name__} passed its {timeout:.0f} s deadline; "
                            f"ranks {missing} never finished"
                        ) from None
                    continue
                (values if ok else failures)[rank] = value
        finally:
            for process in processes:
                process.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            for process in processes:
                if process.is_alive():
                    process.kill()
                    process.join()
                _kill_group(process.pid)
            results.close()
    if failures:
        # A rank that died without a result (killed, crashed) is usually why the others failed in a
        # collective: name it first, and list every failed rank.
        first = min(failures, key=lambda r: ("no result" not in failures[r], r))
        others = "".join(f"\nrank {r}: {failures[r].strip().splitlines()[-1]}" for r in sorted(failures) if r != first)
        also = f"\nother ranks that failed (last line of each):{others}" if others else ""
        raise RuntimeError(f"rank {first} of {world_size} failed in {fn.__name__}:\n{failures[first]}{also}")
    return [values[rank] for rank in range(world_size)]


def _kill_group(pid: int | None) -> None:
    """Kill what is left of a finished rank's process group (its leader, the rank, has exited)."""
    if pid is None or not hasattr(os, "killpg"):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _drain(results: Any, values: dict[int, Any], failures: dict[int, str]) -> bool:
    """Collect results already sent by processes that have exited; True if any arrived."""
    got = False
    while True:
        try:
            rank, ok, value = results.get(timeout=_POLL)
        except queue.Empty:
            return got
        (values if ok else failures)[rank] = value
        got = True
