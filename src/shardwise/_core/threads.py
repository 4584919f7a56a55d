"""Threads that never start or end across an ``os.fork()``, and locks a forked child gets back unheld.

shardwise starts a few daemon threads in the training process (the index's background check, the
build heartbeat, the sharded cache's prefetch), and that process forks: DataLoader workers under
the ``fork`` start method (the default on Linux). Two things can go wrong in a child forked while
such a thread works, and this module is the one place that prevents both.

**A thread's start or end during the fork.** The child copies the interpreter's runtime locks
as they were at the instant of ``fork()``. CPython before the fix of gh-112275 (3.11 before 3.11.8,
3.10 before 3.10.15) takes one of them (``HEAD_LOCK``, the lock of the interpreter's list of thread
states) in the child before resetting it, so a child forked while another thread held it hangs
inside ``os.fork()`` forever. A thread takes that lock when its thread state is created
(``Thread.start``) and deleted (the thread's end). So:

- :func:`start` starts a thread while holding the fence's gate, the lock a ``before`` fork hook
  holds across every ``os.fork()`` of the process (``os.register_at_fork``): a fork waits until
  ``Thread.start()`` has returned, which is once the new thread runs its Python code, that is
  once its thread state exists.
- a thread's end is fenced the same way: when its target returns, the thread takes the gate
  (waiting for a fork in progress to finish) and records that it is ending; the ``before`` hook
  joins every such thread, so it is wholly gone (thread state deleted, GIL and interpreter locks
  released) before ``fork()`` runs.

Between those two points the thread runs its target, which creates and deletes no thread state.
On CPython 3.11 a thread started by ``threading`` takes ``HEAD_LOCK`` only while holding the GIL,
which ``os.fork()`` also holds, so these threads do not hit gh-112275 there even unfenced (0 hangs
in 5,000 forks on 3.11.7 beside two threads starting and ending threads in a loop); native threads
entering Python through ``PyGILState_Ensure`` create their thread state without the GIL, and do
(5 forks in 1,000 hung on 3.11.7 beside two such threads). The fence makes it hold by construction,
on builds and versions that create or delete thread states without the GIL too, rather than by
that detail of CPython's implementation.

**A lock a thread held at the fork.** A child inherits a ``threading.Lock`` held by a parent's
thread that does not exist in the child: the child's first ``with lock:`` hangs. A DataLoader
worker forked while a prefetch thread held the cache's mutex hung at its first download
(tests/data/test_sharded_fork.py). :func:`reset_in_child` registers an object whose thread-owned
state (locks, queues, thread lists) is made anew in a forked child, before ``os.fork()`` returns.

The ``before`` hook waits at most ``FORK_WAIT`` seconds for ``_gate`` and for ending threads: a
fork is never blocked for good by this module (past it, the fork goes on as it would without it).

On these threads: :class:`Pool`, and :class:`KernelThreads`, the one way the compiled builds (the
class index's passes, the packing index) run their kernels on threads, as many as
:func:`build_threads` says.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger("shardwise")

FORK_WAIT = 10.0
"""Seconds a fork waits for a starting thread of ours to run, or an ending one to be gone."""


class _Fence:
    """The fork fence: ``gate`` is held by :func:`start`, by an ending thread while it records itself,
    and across a fork (``held``: by the before hook, which gives up after ``FORK_WAIT``)."""

    def __init__(self) -> None:
        self.gate = threading.Lock()
        self.held = False
        self.ending: set[threading.Thread] = set()  # threads whose target returned, not known to be gone yet
        self.resets: list[tuple[weakref.ref[Any], Callable[[Any], None]]] = []  # reset_in_child's registry


_fence = _Fence()


def start(target: Callable[..., object], *args: Any, name: str) -> threading.Thread:
    """Start a daemon thread running ``target(*args)`` that never starts or ends while the process forks.

    Every thread shardwise starts goes through here.
    """
    thread = threading.Thread(target=_run, args=(target, args), name=name, daemon=True)
    with _fence.gate:
        _fence.ending.difference_update([gone for gone in _fence.ending if not gone.is_alive()])  # forget the gone
        thread.start()  # returns once the thread runs: its creation is complete before any fork
    return thread


def _run(target: Callable[..., object], args: tuple[Any, ...]) -> None:
    try:
        target(*args)
    finally:
        with _fence.gate:  # never while a fork is in progress; a fork from now on first waits for this end
            _fence.ending.add(threading.current_thread())


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity where the platform tells it, else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


ENV_WORKERS = "SHARDWISE_BUILD_WORKERS"
"""How many workers a build adds to the building process or thread (``index.workers`` reads it too)."""


def build_threads(default: int) -> int:
    """Threads a compiled build step runs its kernels on: ``SHARDWISE_BUILD_WORKERS`` + 1 where it is set
    (the building thread and that many more; ``0``: the building thread alone), else ``default``.

    ``default`` is the step's own count, the one its measured times were taken with: the class
    index's two passes use ``min(2, usable_cpus())`` (``class_buckets.THREADS``: pass 1 splits the
    labels in two); the packing build is given ``index.workers.build_workers() + 1`` threads by its
    caller, which reads the same variable (unset: usable CPUs, at most 8).

    Raises:
        ValueError: ``SHARDWISE_BUILD_WORKERS`` is not a non-negative integer.
    """
    value = os.environ.get(ENV_WORKERS, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ValueError(f"{ENV_WORKERS} should be a non-negative integer, but got {ENV_WORKERS}={value!r}")
    return int(value) + 1


class Pool:
    """``threads`` fenced daemon threads (:func:`start`) running submitted calls in order: a small
    ``concurrent.futures.ThreadPoolExecutor`` for builds whose work releases the GIL.

    Example:
        >>> pool = Pool(2, name="shardwise-example")
        >>> [future.result() for future in [pool.submit(pow, 2, k) for k in range(4)]]
        [1, 2, 4, 8]
        >>> pool.shutdown()
    """

    def __init__(self, threads: int, *, name: str) -> None:
        self._tasks: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]
        self._tasks = queue.SimpleQueue()
        self._threads = [start(self._work, name=f"{name}-{i}") for i in range(threads)]

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``function(*args)`` on one of the threads; its future."""
        future: Future[Any] = Future()
        self._tasks.put((future, function, args))
        return future

    def shutdown(self, *, cancel: bool = False) -> None:
        """Wait for the threads to finish the tasks (``cancel``: the tasks not started are dropped)."""
        while cancel:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                task[0].cancel()
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, function, args = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = function(*args)
            except BaseException as error:  # handed to the caller through the future
                future.set_exception(error)
            else:
                future.set_result(result)


class KernelThreads:
    """``threads`` threads running calls that release the GIL (compiled kernels, reads from storage); a context manager.

    One thread (or fewer): no pool is started and every call runs at once on the calling thread.
    More: a :class:`Pool` of ``threads`` threads, or ``threads - 1`` with ``with_caller`` (the
    calling thread is one of them: it runs the first call of each :meth:`run`). Leaving the block
    waits for the calls handed out; on an error or an interrupt, those not started are dropped.

    Two ways to hand out calls: :meth:`submit`, whose futures the caller collects while it works
    on (the packing build deals packed strata into batches meanwhile; the sharded index reads shard
    footers, ``data.sharded.metadata``), and :meth:`run`, a few calls at once (the class index's
    passes). The threads change where a call runs, never what it writes.

    Example:
        >>> with KernelThreads(2, name="shardwise-example") as kernel_threads:
        ...     futures = [kernel_threads.submit(pow, 2, k) for k in range(4)]
        >>> [future.result() for future in futures]
        [1, 2, 4, 8]
    """

    def __init__(self, threads: int, *, name: str, with_caller: bool = False) -> None:
        self._pool = Pool(threads - 1 if with_caller else threads, name=name) if threads > 1 else None

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``function(*args)`` on one of the threads (no pool: here, now); its future."""
        if self._pool is not None:
            return self._pool.submit(function, *args)
        done: Future[Any] = Future()
        done.set_result(function(*args))
        return done

    def run(self, calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        """Run ``calls``: the first here, the others on the threads (no pool: here, in turn); raise what any raised."""
        pool = self._pool
        futures = [pool.submit(function, *args) for function, args in calls[1:]] if pool is not None else []
        try:
            function, args = calls[0]
            function(*args)
            if pool is None:
                for function, args in calls[1:]:
                    function(*args)
        finally:
            for future in futures:
                future.result()

    def __enter__(self) -> KernelThreads:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel=kind is not None)


def reset_in_child(owner: object, reset: Callable[[Any], None]) -> None:
    """Call ``reset(owner)`` in every child forked from now on while ``owner`` lives (held weakly).

    ``reset`` makes the state the owner's threads use anew (locks, queues, the thread list): the
    parent's threads do not exist in the child, and a lock one of them held at the fork stays held
    there. It runs before ``os.fork()`` returns in the child: keep it to assignments (no I/O,
    no logging, no locks of other threads).
    """
    with _fence.gate:
        resets = _fence.resets
        resets.append((weakref.ref(owner), reset))
        if len(resets) & (len(resets) - 1) == 0:  # at powers of two, forget the owners gone: amortised O(1)
            resets[:] = [(ref, call) for ref, call in resets if ref() is not None]


def ending() -> int:
    """Threads of ours whose target returned and whose end no fork has waited for yet (for tests)."""
    return len(_fence.ending)


def _before_fork() -> None:
    _fence.held = _fence.gate.acquire(timeout=FORK_WAIT)
    if not _fence.held:  # pragma: no cover - a thread start that never ran
        logger.warning("shardwise: a thread of ours did not start within %g s; forking regardless", FORK_WAIT)
        return
    for thread in list(_fence.ending):
        thread.join(FORK_WAIT)  # only its end is left (its target returned): moments
        if not thread.is_alive():
            _fence.ending.discard(thread)


def _after_fork_in_parent() -> None:
    if _fence.held:
        _fence.held = False
        _fence.gate.release()


def _after_fork_in_child() -> None:
    # The parent's gate is held (by the forking thread, which is this one), its threads are not copied.
    _fence.gate, _fence.held = threading.Lock(), False
    _fence.ending.clear()
    _fence.resets[:] = [(ref, reset) for ref, reset in _fence.resets if ref() is not None]
    for ref, reset in _fence.resets:
        owner = ref()
        if owner is not None:
            reset(owner)


if hasattr(os, "register_at_fork"):  # POSIX; Windows does not fork
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)  # fmt: skip
