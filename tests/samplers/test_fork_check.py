"""CPython's gh-112275 (a worker forked while another thread starts or ends can hang): which interpreters, and the
warning a process running torch.distributed gets, once, when it forks on one."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from shardwise.samplers.worker_seeds import fork_advice, fork_may_hang
from shardwise.tools.launch import run_distributed


@pytest.mark.parametrize(
    ("version", "hangs"),
    [((3, 10, 14), True), ((3, 10, 15), False), ((3, 11, 0), True), ((3, 11, 7), True), ((3, 11, 8), False),
     ((3, 11, 12), False), ((3, 12, 0), True), ((3, 12, 1), False), ((3, 13, 0), False), ((3, 14, 2), False),
     ((3, 9, 18), True)],
)
def test_which_interpreters_can_hang_a_forked_worker(version: tuple[int, int, int], hangs: bool) -> None:
    """3.10 before 3.10.15, 3.11 before 3.11.8 and 3.12.0 (CPython only); the advice names the fix where it applies."""
    assert fork_may_hang(version) is hangs
    assert fork_may_hang(version, "pypy") is False
    assert ("forkserver" in fork_advice(version)) is hangs


def _fork_twice(rank: int, world_size: int) -> list[str]:
    """A rank (torch.distributed running) that forks twice, as a DataLoader starting two workers does."""
    import shardwise.samplers  # noqa: F401  # what a training script imports

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
    return [str(w.message) for w in caught]


@pytest.mark.multiprocess
def test_a_process_running_torch_distributed_is_warned_once_when_it_forks() -> None:
    """On an affected interpreter the first fork of a rank warns (naming gh-112275 and forkserver), the second not;
    on a fixed one, nothing."""
    messages = run_distributed(_fork_twice, 1, timeout=120)[0]
    if fork_may_hang(sys.version_info[:3], sys.implementation.name):
        assert len(messages) == 1 and "gh-112275" in messages[0] and "forkserver" in messages[0], messages
        assert messages[0].startswith("shardwise: this process runs torch.distributed and forks: Python ")
    else:
        assert messages == []


def test_a_process_without_torch_distributed_forks_without_a_warning() -> None:
    """No process group, no warning: a plain script's DataLoader workers are not what gh-112275 hangs here."""
    code = ("import os, warnings; warnings.simplefilter('error'); import shardwise.samplers\n"
            "pid = os.fork()\nif pid == 0: os._exit(0)\nos.waitpid(pid, 0); print('forked')")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "forked" and done.stderr == "", done.stderr
