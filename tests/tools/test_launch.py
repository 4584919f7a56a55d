"""``run_distributed`` leaves nothing behind: what a rank started goes with it, also when the rank was killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from shardwise.tools.launch import run_distributed

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups")]


def _start_and_die(rank: int, world_size: int, directory: str) -> int:
    """Start a long-lived child (as a rank starts DataLoader workers or a fork server); rank 1 is then SIGKILLed."""
    child = subprocess.Popen(["sleep", "300"])
    (Path(directory) / f"child{rank}").write_text(str(child.pid))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return child.pid


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` has ended (exited, or a zombie no one reaps) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_what_ranks_started_ends_with_them_when_one_is_killed(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="rank 1 exited with code -9"):
        run_distributed(_start_and_die, 2, str(tmp_path), timeout=60)
    children = [int((tmp_path / f"child{rank}").read_text()) for rank in (0, 1)]
    try:
        # the killed rank's child, and the child the returning rank left running
        assert [_gone(pid) for pid in children] == [True, True]
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
