"""shardwise._core.threads: no thread of ours starts or ends across a fork; a forked child gets its locks back.

The fork hooks are called here as ``os.fork()`` calls them (``_before_fork`` ... ``_after_fork_in_parent``)
to hold a fork "in progress" for as long as a test needs, and real forks check the rest.
"""

from __future__ import annotations

import ast
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import shardwise
from shardwise._core import threads

pytestmark = [
    pytest.mark.timeout(60),
    # Python 3.12+ warns on every fork of a process with threads; these tests fork one on purpose.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _wait_for(condition: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _exit_status(pid: int, seconds: float = 10.0) -> int | None:
    """The child's exit code, or None if it did not exit in time (killed then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def test_a_thread_does_not_start_while_a_fork_is_in_progress() -> None:
    """``threads.start`` called during a fork returns, and the thread runs, only once the fork is done."""
    ran = threading.Event()
    started: list[threading.Thread] = []
    threads._before_fork()
    try:
        caller = threading.Thread(target=lambda: started.append(threads.start(ran.set, name="shardwise-test")))
        caller.start()
        time.sleep(0.2)
        assert not ran.is_set() and not started, "a thread started while the process was forking"
    finally:
        threads._after_fork_in_parent()
    caller.join(5)
    assert ran.wait(5) and started and started[0].name == "shardwise-test"


def test_a_thread_whose_target_returns_during_a_fork_ends_only_after_it() -> None:
    """A target that returns mid-fork leaves its thread alive (not ending) until the fork is done."""
    release = threading.Event()
    thread = threads.start(release.wait, name="shardwise-test")
    threads._before_fork()
    try:
        release.set()
        time.sleep(0.2)
        assert thread.is_alive(), "a thread ended while the process was forking"
    finally:
        threads._after_fork_in_parent()
    thread.join(5)
    assert not thread.is_alive()


@fork_only
def test_a_fork_waits_until_the_threads_that_are_ending_are_gone() -> None:
    """A thread whose target returned before the fork is wholly gone (joined) when ``fork()`` runs."""
    thread = threads.start(lambda: None, name="shardwise-test")
    assert _wait_for(lambda: threads.ending() >= 1)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0)
    assert not thread.is_alive()  # the before hook joined it
    assert threads.ending() == 0
    assert _exit_status(pid) == 0


class _Owner:
    """State a thread of ours holds a lock of, reset in a forked child like ShardCache's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        threads.reset_in_child(self, _Owner._forked)

    def _forked(self) -> None:
        self.lock = threading.Lock()


@fork_only
def test_a_lock_held_by_one_of_our_threads_at_the_fork_is_free_in_the_child() -> None:
    """Without ``reset_in_child`` the child's first ``with lock:`` would hang (the holder was not copied)."""
    owner, holding, release = _Owner(), threading.Event(), threading.Event()

    def hold() -> None:
        with owner.lock:
            holding.set()
            release.wait(10)

    thread = threads.start(hold, name="shardwise-test")
    assert holding.wait(5)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os._exit(0 if owner.lock.acquire(timeout=2) else 1)
        assert owner.lock.locked()  # the parent's lock is still the holder's
        assert _exit_status(pid) == 0
    finally:
        release.set()
        thread.join(5)


def test_reset_in_child_holds_its_owner_weakly() -> None:
    """A registered owner is not kept alive by the registry (a ShardCache per source, an EntryCheck per open)."""
    import gc
    import weakref

    owner = _Owner()
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is None


def _thread_starts(path: Path) -> list[str]:
    """Calls in ``path`` that start a thread without ``shardwise._core.threads.start``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in {"Thread", "Timer", "start_new_thread", "start_new", "ThreadPoolExecutor", "ThreadPool"}:
                found.append(f"{path.name}:{node.lineno}: {name}(...)")
    return found


def test_every_thread_shardwise_starts_goes_through_threads_start() -> None:
    """One place starts threads: a new one that bypasses it would again start or end across a fork."""
    package = Path(shardwise.__file__).parent
    own = package / "_core" / "threads.py"
    found = [hit for path in sorted(package.rglob("*.py")) if path != own for hit in _thread_starts(path)]
    assert not found, f"start threads with shardwise._core.threads.start: {found}"


def test_a_pool_runs_calls_on_fenced_threads_hands_errors_back_and_drops_what_a_cancel_leaves() -> None:
    from concurrent.futures import CancelledError

    from shardwise._core.threads import Pool

    pool = Pool(2, name="shardwise-test-pool")
    assert [f.result(timeout=10) for f in [pool.submit(pow, 3, k) for k in range(5)]] == [1, 3, 9, 27, 81]
    with pytest.raises(ZeroDivisionError):
        pool.submit(divmod, 1, 0).result(timeout=10)
    gate, started = threading.Event(), [threading.Event(), threading.Event()]

    def hold(running: threading.Event) -> bool:
        running.set()
        return gate.wait(10)

    held = [pool.submit(hold, running) for running in started]
    assert all(running.wait(10) for running in started)  # both threads busy
    waiting = [pool.submit(pow, 2, k) for k in range(3)]
    releaser = threading.Timer(0.2, gate.set)
    releaser.start()
    pool.shutdown(cancel=True)
    releaser.join()
    assert all(f.result(timeout=10) for f in held)
    for future in waiting:
        with pytest.raises(CancelledError):
            future.result(timeout=10)


def test_build_threads_is_the_variable_plus_one_where_set_else_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SHARDWISE_BUILD_WORKERS=k``: ``k + 1`` threads (``0``: the building one); unset or blank: the default."""
    monkeypatch.delenv(threads.ENV_WORKERS, raising=False)
    assert threads.build_threads(2) == 2
    for value, expected in (("0", 1), ("3", 4), (" 5 ", 6), ("", 7)):
        monkeypatch.setenv(threads.ENV_WORKERS, value)
        assert threads.build_threads(7) == expected, value
    for bad in ("-1", "two", "1.5"):
        monkeypatch.setenv(threads.ENV_WORKERS, bad)
        with pytest.raises(ValueError, match=rf"SHARDWISE_BUILD_WORKERS should be a non-negative integer.*{bad!r}"):
            threads.build_threads(2)


@pytest.mark.parametrize(("count", "with_caller", "pooled"), [(0, False, 0), (1, False, 0), (1, True, 0), (2, False, 2),
                                                              (2, True, 1), (4, True, 3)])  # fmt: skip
def test_kernel_threads_start_the_pool_they_say_and_run_the_first_call_here(
    count: int, with_caller: bool, pooled: int
) -> None:
    """A pool of ``threads`` (``- 1`` with the caller), none for one thread; ``run``'s first call on the caller."""
    here = threading.get_ident()
    seen: list[int] = []
    before = {t for t in threading.enumerate() if t.name.startswith("shardwise-test-kernels")}
    assert not before
    with threads.KernelThreads(count, name="shardwise-test-kernels", with_caller=with_caller) as kernel_threads:
        started = [t for t in threading.enumerate() if t.name.startswith("shardwise-test-kernels")]
        assert len(started) == pooled
        kernel_threads.run([(lambda: seen.append(threading.get_ident()), ()) for _ in range(3)])
        assert seen[0] == here and len(seen) == 3
        if not pooled:
            assert set(seen) == {here}
            future = kernel_threads.submit(threading.get_ident)
            assert future.done() and future.result() == here  # run at once, here
        else:
            assert kernel_threads.submit(threading.get_ident).result(timeout=10) != here
    assert not any(t.is_alive() for t in started)


def test_kernel_threads_raise_what_a_call_raised_after_the_others_finished() -> None:
    """``run`` raises a call's error once every call is done; leaving on an error drops the calls not started."""
    from concurrent.futures import CancelledError

    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.05)
        finished.set()

    with threads.KernelThreads(2, name="shardwise-test-kernels", with_caller=True) as kernel_threads:
        with pytest.raises(ZeroDivisionError):
            kernel_threads.run([(divmod, (1, 0)), (slow, ())])
        assert finished.is_set()
        with pytest.raises(ZeroDivisionError):
            kernel_threads.run([(slow, ()), (divmod, (1, 0))])
    gate, started = threading.Event(), [threading.Event(), threading.Event()]

    def hold(running: threading.Event) -> bool:
        running.set()
        return gate.wait(10)

    releaser = threading.Timer(0.2, gate.set)
    with pytest.raises(KeyError), threads.KernelThreads(2, name="shardwise-test-kernels") as kernel_threads:
        held = [kernel_threads.submit(hold, running) for running in started]
        assert all(running.wait(10) for running in started)  # both threads busy
        waiting = kernel_threads.submit(pow, 2, 3)
        releaser.start()
        raise KeyError("interrupted")
    releaser.join()
    assert all(future.result(timeout=10) for future in held)
    with pytest.raises(CancelledError):
        waiting.result(timeout=10)


@pytest.mark.parametrize("workers", ["0", "1", "3"])
def test_the_class_index_is_the_same_bytes_on_any_number_of_threads(
    workers: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``SHARDWISE_BUILD_WORKERS`` moves the class index's passes onto 1, 2 or 4 threads, never a byte of it."""
    pytest.importorskip("numba", reason="numba (the fast extra) is not installed: the compiled passes are not run")
    import numpy as np

    from shardwise._core.class_buckets import bucket_plan, group_by_class
    from shardwise._core.class_index import count_classes
    from shardwise._core.packing.compiled import ENV_NUMBA

    monkeypatch.setenv(ENV_NUMBA, "1")
    monkeypatch.setenv(threads.ENV_WORKERS, workers)
    labels = np.random.default_rng(8).integers(0, 50_000, 3_000_000).astype(np.int32) * 3
    classes, counts = count_classes(labels)
    plan = bucket_plan(counts, len(labels), np.dtype(np.uint32))
    assert plan is not None and len(plan.firsts) > 4  # the two passes, buckets enough for every thread
    members = np.lib.format.open_memmap(tmp_path / "members.npy", mode="w+", dtype=np.uint32, shape=(len(labels),))
    group_by_class(labels, classes, counts, members)
    assert np.array_equal(members, np.argsort(labels, kind="stable"))
