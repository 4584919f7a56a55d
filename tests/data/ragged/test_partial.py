"""A writer's .partial directory: a crash never leaves a store that opens; dead writers' leftovers are removed."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardwise import RaggedArray, RaggedStoreError, RaggedWriter
from shardwise.data.ragged import VALUES
from tests.data.ragged.stores import _leftovers

_CRASH = """
import os, sys
import numpy as np
from shardwise import RaggedWriter
writer = RaggedWriter(sys.argv[1])
for i in range(100):
    writer.append(np.full((i, 4), i, np.float32))
writer._values.flush()
os._exit(3)  # killed mid-write: no close, no cleanup
"""


def test_crash_mid_write_never_leaves_a_store_that_opens(tmp_path: Path) -> None:
    """A process killed while writing leaves no store at the path, and its partial directory does not open."""
    result = subprocess.run([sys.executable, "-c", _CRASH, str(tmp_path / "s")], check=False)
    assert result.returncode == 3
    assert not (tmp_path / "s").exists()
    (partial,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert partial.name.startswith(".s.") and partial.name.endswith(".partial")
    assert (partial / VALUES).stat().st_size > 0
    with pytest.raises(RaggedStoreError, match=r"is not a finished ragged store: manifest.json is missing"):
        RaggedArray(partial)


def _write_until_killed(path: str, ready: Any) -> None:
    writer = RaggedWriter(path, overwrite=True)
    for i in range(50):
        writer.append(np.full((i, 4), i, np.float32))
    writer._values.flush()
    ready.set()
    time.sleep(60)  # killed long before


def _partials(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.endswith(".partial"))


def test_writer_killed_by_sigkill_leaves_a_partial_the_next_writer_removes(tmp_path: Path) -> None:
    """A writer killed by SIGKILL leaves its .partial directory; the next writer to that path removes it."""
    context = multiprocessing.get_context("fork")  # no re-import of torch: the child only writes
    ready = context.Event()
    child = context.Process(target=_write_until_killed, args=(str(tmp_path / "s"), ready))
    child.start()
    try:
        assert ready.wait(60)
        (stale,) = _partials(tmp_path)
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    finally:
        child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert (tmp_path / stale / VALUES).stat().st_size > 0  # nearly the size of the store, and nobody owns it
    with RaggedWriter(tmp_path / "s") as writer:
        assert stale not in _partials(tmp_path)  # gone as soon as the next writer starts
        writer.append(np.ones((2, 4), np.float32))
    assert RaggedArray(tmp_path / "s").lengths.tolist() == [2]
    assert _leftovers(tmp_path) == []


def test_a_live_writers_partial_is_never_removed(tmp_path: Path) -> None:
    """A second writer to the same path leaves the first's directory alone; each publishes, the last one wins."""
    first = RaggedWriter(tmp_path / "s", overwrite=True)
    first.append(np.zeros((1, 2), np.float32))
    second = RaggedWriter(tmp_path / "s", overwrite=True)
    assert first._tmp.is_dir() and len(_partials(tmp_path)) == 2
    second.append(np.zeros((3, 2), np.float32))
    second.close()
    first.close()
    assert RaggedArray(tmp_path / "s").lengths.tolist() == [1]
    assert _leftovers(tmp_path) == []


def _race(path: str, start: Any, worker: int) -> None:
    start.wait(60)
    for round_ in range(3):
        RaggedArray.write(path, [np.full((worker + 1, 2), round_, np.int16)] * 20, overwrite=True)


def test_racing_writers_remove_stale_partials_once_and_both_publish(tmp_path: Path) -> None:
    """Two writers racing over 30 dead writers' leftovers remove every one, never each other's, and both publish."""
    for k in range(30):
        stem = tmp_path / f".s.dead{k:02d}"
        (tmp_path / f"{stem.name}.partial").mkdir()
        (tmp_path / f"{stem.name}.partial" / VALUES).write_bytes(b"x" * 1000)
        if k % 3:  # a dead writer's lock file, unlocked; every third has none, as an older release left them
            (tmp_path / f"{stem.name}.partial.lock").touch()
    (tmp_path / ".s.dead99.old").mkdir()  # a finished replace's copy of the previous store, owner gone
    context = multiprocessing.get_context("fork")
    start = context.Event()
    racers = [context.Process(target=_race, args=(str(tmp_path / "s"), start, w)) for w in range(2)]
    for racer in racers:
        racer.start()
    start.set()
    for racer in racers:
        racer.join(120)
    assert [racer.exitcode for racer in racers] == [0, 0]
    store = RaggedArray(tmp_path / "s")
    store.verify()
    assert store.lengths.tolist() in ([1] * 20, [2] * 20)
    assert _leftovers(tmp_path) == []


def _overwrite(path: str, start: Any, rounds: int) -> None:
    start.wait(60)
    for round_ in range(rounds):
        RaggedArray.write(path, [np.full((1, 2), round_, np.int16)] * 4, overwrite=True)


def test_an_overwrite_never_leaves_the_path_missing_for_a_reader(tmp_path: Path) -> None:
    """A reader polling the store while another process overwrites it 200 times always finds a store there."""
    path = tmp_path / "s"
    RaggedArray.write(path, [np.zeros((1, 2), np.int16)] * 4)
    context = multiprocessing.get_context("fork")
    start = context.Event()
    writer = context.Process(target=_overwrite, args=(str(path), start, 200))
    writer.start()
    start.set()
    missing, polls, deadline = 0, 0, time.monotonic() + 120
    while writer.is_alive() and time.monotonic() < deadline:
        polls += 1
        missing += not os.path.isdir(path)
    writer.join(60)
    assert writer.exitcode == 0 and polls > 0
    assert missing == 0, f"the store was missing at {missing} of {polls} polls during overwrites"
    assert RaggedArray(path).lengths.tolist() == [1] * 4
