"""Progress of long index work: a bar or rate-limited log lines while building, one line while waiting.

A cold index build at 1e9 samples takes minutes; the ranks that wait for it must not look hung.
The builder reports through :class:`Progress` (``tqdm`` on a terminal when it is installed, the
``progress`` extra; otherwise a log line at most every ``LOG_EVERY`` seconds), a waiting process
says once what it waits for and who builds it (:func:`note`). One switch silences both:
``SHARDWISE_PROGRESS=off`` in the environment, or :func:`set_progress` (``False``/``True``, or
``None`` to follow the environment again).

Lines go to the ``shardwise`` logger at INFO when logging is configured, else straight to stderr
(as ``tqdm`` does), so they are seen without any setup.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from .._core import threads
from .._core.errors import check_bool

logger = logging.getLogger("shardwise")

ENV_PROGRESS = "SHARDWISE_PROGRESS"
LOG_EVERY = 10.0
"""Seconds between two progress log lines of one build (when not on a terminal)."""
_OFF = {"off", "0", "false", "no", "disabled"}
_override: dict[str, bool] = {}  # "enabled": set_progress's choice, absent to follow the environment
clock = time.monotonic  # replaced by tests
_last_update = {"at": -float("inf")}  # when any Progress last advanced: a Heartbeat stays quiet meanwhile


def set_progress(enabled: bool | None) -> None:
    """Show (``True``) or silence (``False``) index progress here; ``None`` follows ``SHARDWISE_PROGRESS``."""
    if enabled is None:
        _override.pop("enabled", None)
    else:
        _override["enabled"] = check_bool("enabled", enabled)


def progress_enabled() -> bool:
    """Whether index progress is shown: :func:`set_progress`, else ``SHARDWISE_PROGRESS`` is not ``off``."""
    if "enabled" in _override:
        return _override["enabled"]
    return os.environ.get(ENV_PROGRESS, "").strip().lower() not in _OFF


def note(message: str, *args: Any) -> None:
    """One progress line (unless silenced): to the ``shardwise`` logger if logging is set up, else stderr."""
    if not progress_enabled():
        return
    if logger.hasHandlers():
        logger.info(message, *args)
    else:
        print(message % args if args else message, file=sys.stderr, flush=True)


def _tqdm() -> Any:
    stream = sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """Progress of one build step over ``total`` units (e.g. keys); ``update(count)`` after each chunk.

    Args:
        total: units of the whole step.
        what: what is being done, for the bar or the log lines (e.g. ``"length index: counting"``).
        unit: the unit's name.
    """

    def __init__(self, total: int, what: str, unit: str = "keys") -> None:
        self.total, self.what, self.unit = max(int(total), 0), what, unit
        self.done = 0
        self.enabled = progress_enabled()
        self._start = self._last = clock()
        self._bar: Any = None
        if self.enabled:
            tqdm = _tqdm()
            if tqdm is not None:  # delay: no bar at all for builds under a second
                self._bar = tqdm(total=self.total, desc=f"shardwise: {what}", unit=f" {unit}", unit_scale=True,
                                 leave=False, delay=1.0)  # fmt: skip

    def update(self, count: int) -> None:
        self.done += count
        now = _last_update["at"] = clock()
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(count)
            return
        if now - self._last >= LOG_EVERY:
            self._last = now
            elapsed = now - self._start
            share = self.done / self.total if self.total else 1.0
            left = elapsed * (1 - share) / share if share > 0 else float("nan")
            note("shardwise: %s: %.0f%% (%d of %d %s) after %.0f s, about %.0f s left",
                 self.what, 100 * share, self.done, self.total, self.unit, elapsed, left)  # fmt: skip

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Heartbeat:
    """While a build runs, a line every ``LOG_EVERY`` seconds that it still runs, unless a :class:`Progress` reports.

    For builders that report nothing themselves (a sampler's table filled chunk by chunk): a
    daemon thread, stopped when the ``with`` block ends.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        start = clock()
        while not self._stop.wait(LOG_EVERY):
            if clock() - _last_update["at"] >= LOG_EVERY:
                note("shardwise: %s: still running after %.0f s", self.what, clock() - start)

    def __enter__(self) -> Heartbeat:
        if progress_enabled():
            self._thread = threads.start(self._run, name="shardwise-heartbeat")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
