"""Every code block of README.md and docs/*.md runs as written, on CPU, with nothing hidden.

Each page is one script: its ```python blocks, in order, each at its own line number (a traceback's
``page.md.py, line 57`` is line 57 of the page), run as ``__main__`` in a fresh process in a temporary
folder (``examples/`` and ``bench/`` linked in) with a timeout. The process is a fork of one
interpreter that has imported torch and nothing else (``ZYGOTE``): a page starts as a fresh
``python page.md.py`` would, with empty globals (a page that forgets ``import torch`` still fails),
and exits as it would (its exit code, threads joined, ``atexit`` run, output flushed), without
paying torch's import (2 to 3 s on a loaded 2-core machine) and the teardown of its modules (~0.6 s)
once a page; what the page starts itself (``verify``'s processes, ``torchrun``, ``sh`` commands) are
new interpreters as for a reader. A page is one test; every block that is not run is a test of
its own that is skipped with the reason the page gives. Blocks fenced with
```bash run where marked, as shell commands at their place in the page's script; blocks fenced
with a bare ``` are text (usage lines, file layouts) and are not code.

What runs is exactly what a reader sees. A page whose examples need data, a model or a file shows
that setup itself, in a visible block (say, a short "To run these examples" block at the top),
small enough to run in seconds: write the example small rather than hide a smaller one. The test
adds no code of its own; its environment only keeps a run off the launcher variables of the
calling process, off CUDA, and keeps shardwise's index cache (``SHARDWISE_CACHE_DIR``) in the
temporary folder.

Which blocks are not run is chosen in the markdown, by an HTML comment (invisible when rendered)
on the lines right before a fence (only other markers between them and the fence):

    <!-- doc-test: skip REASON -->        the next block is not run; its test is skipped with REASON,
                                          which is required (say what runs it instead)
    <!-- doc-test: requires PKG ... -->   the next block is skipped, naming the module, if one is missing
    <!-- doc-test: gpu -->                the next block is skipped unless CUDA is available
    <!-- doc-test: run -->                the next ```bash block runs (every bash block needs run or skip)

A ```python block runs unless it is marked; a ```bash block without ``run`` or ``skip`` fails the
page's test, so that nothing is left out silently, with one rule of its own: a ```bash block that
starts with ``python3 -m venv`` (README's two set-up commands, for a fresh machine) is skipped with
``FRESH_MACHINE_REASON``: CI runs the test command itself (``.ci/run``), and ``tests/tools/test_demo.py``
the demo. New pages under docs/ are picked up as they are.

A ``<!-- doc-test: setup ... -->`` comment (hidden code run before a block) fails the page's test,
saying to make that code visible; so do an unknown marker, a ``skip`` without a reason, and a
marker that is not right before a ```python or ```bash fence.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
TIMEOUT = 240.0  # seconds per page (a loaded 2-core machine); the pages together take well under this
LINKED = ("examples", "bench")  # folders the pages' commands name, linked into the temporary folder
LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SHARDWISE_SEED")  # fmt: skip

FRESH_MACHINE = "python3 -m venv "
FRESH_MACHINE_REASON = ("sets up a fresh machine (a virtual environment, installs from the network); .ci/run runs "
                        "the test command, tests/tools/test_demo.py the demo")  # fmt: skip

# Pages another branch owns, whose snippet needs a fix there: run, and expected to fail until it lands.
NOT_YET: dict[str, str] = {}

HIDDEN_SETUP = ("runs code the reader never sees; show it in a visible block instead (e.g. a short "
                "'To run these examples' block at the top of the page, small and fast)")  # fmt: skip

FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(\w+)\s*(.*?)\s*(-->)?\s*$")
HELPER = (
    "import subprocess as _s, sys as _y\n"
    "def sh(command, line):\n"
    "    print(f'$ {command}', flush=True)\n"
    "    done = _s.run(command, shell=True, executable='/bin/bash')\n"
    "    if done.returncode:\n"
    "        raise SystemExit(f'line {line}: the command exited with status {done.returncode}: {command}')\n"
)
# The interpreter every page's process is forked from. It reads one request a line (the page's folder,
# script and environment), forks, writes the child's pid, waits for it and writes its exit code. The
# child ends as `python script` ends (an uncaught exception printed: exit code 1; sys.exit's code or
# message; non-daemon threads joined, atexit callbacks run, stdout and stderr flushed), less the
# teardown of every module's objects, ~0.6 s a page with torch loaded, which nothing reads.
ZYGOTE = """
import atexit, json, multiprocessing.process, os, runpy, sys, threading
import torch  # the import a page pays again and again; no name of it reaches the page


def exit_code(stop):
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


for request in sys.stdin:
    request = json.loads(request)
    pid = os.fork()
    if pid == 0:
        os.setsid()  # the page and what it starts are one process group, killed together on a timeout
        os.chdir(request["folder"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, name in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
            opened = os.open(name, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv, sys.path[0] = [request["script"]], request["folder"]
        # as at a fresh start: multiprocessing's spawned children start in the page's folder
        multiprocessing.process.ORIGINAL_DIR = request["folder"]
        code = 0
        try:
            runpy.run_path(os.path.join(request["folder"], request["script"]), run_name="__main__")  # __file__ absolute
        except SystemExit as stop:
            code = exit_code(stop)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        threading._shutdown()  # what Python's own exit does, in its order
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@dataclass
class Block:
    """One fenced block of a page, and what its markers say."""

    line: int  # 1-based line of the opening fence
    language: str
    code: list[str]
    skip: str | None = None
    requires: list[str] = field(default_factory=list)
    gpu: bool = False
    run: bool = False

    def why_not_run(self) -> str | None:
        """The reason this block is not run here, or None."""
        if self.skip is not None:
            return self.skip
        missing = [name for name in self.requires if importlib.util.find_spec(name) is None]
        if missing:
            return f"needs {', '.join(missing)}, which is not installed"
        if self.gpu:
            import torch

            if not torch.cuda.is_available():
                return "needs a CUDA GPU"
        return None  # an unmarked bash block is the page's error, reported by its test


def _mark(block: Block, kind: str, rest: str, where: str) -> None:
    if kind == "skip":
        if not rest:
            raise ValueError(f"{where}: doc-test skip needs a reason: <!-- doc-test: skip REASON --> (what runs it instead)")
        block.skip = rest
    elif kind == "requires":
        block.requires += rest.split()
    elif kind == "gpu":
        block.gpu = True
    elif kind == "run":
        block.run = True
    else:
        raise ValueError(f"{where}: unknown doc-test marker {kind!r} (skip, requires, gpu, run)")


def _fenced(lines: list[str], start: int, language: str, pending: Block) -> tuple[int, Block | None]:
    """The fenced block opening at line ``start`` (0-based): (its closing line, the block if it is code)."""
    i = start + 1
    while i < len(lines) and not lines[i].startswith("```"):
        i += 1
    if language not in ("python", "bash", "sh"):
        return i, None
    pending.line, pending.language, pending.code = start + 1, "bash" if language == "sh" else language, \
        lines[start + 1:i]  # fmt: skip
    if pending.language == "bash" and pending.skip is None and not pending.run and pending.code and \
            pending.code[0].startswith(FRESH_MACHINE):  # fmt: skip
        pending.skip = FRESH_MACHINE_REASON
    return i, pending


def parse(page: Path) -> list[Block]:
    """The page's ```python and ```bash blocks with their markers.

    Raises ValueError for a marker the page may not have: unknown, ``skip`` without a reason, not
    right before a fence, or hidden ``setup`` code.
    """
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    pending = Block(0, "", [])
    marked_at: int | None = None  # 1-based line of the first marker waiting for its fence
    i = 0
    while i < len(lines):
        marker, fence = MARKER.match(lines[i]), FENCE.match(lines[i])
        if marked_at is not None and not marker and not fence:
            raise ValueError(f"{page.name}:{marked_at}: a doc-test marker must be right before a code fence "
                             f"(only other markers between them); line {i + 1} comes first")  # fmt: skip
        if marker:
            kind, rest = marker.group(1), marker.group(2)
            marked_at = i + 1 if marked_at is None else marked_at
            if kind == "setup":
                raise ValueError(f"{page.name}:{i + 1}: a hidden <!-- doc-test: setup --> comment {HIDDEN_SETUP}")
            _mark(pending, kind, rest, f"{page.name}:{i + 1}")
        elif fence:
            i, block = _fenced(lines, i, fence.group(1), pending)
            if block is None and marked_at is not None:  # a text block: the markers would fall on the next code
                raise ValueError(f"{page.name}:{marked_at}: a doc-test marker is right before a text block (a bare ```), "
                                 "which never runs; mark a ```python or ```bash block")  # fmt: skip
            marked_at = None
            if block is not None:
                blocks.append(block)
                pending = Block(0, "", [])
        i += 1
    if marked_at is not None:
        raise ValueError(f"{page.name}:{marked_at}: a doc-test marker must be right before a code fence; the page ends")
    return blocks


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def script(page: Path, blocks: list[Block]) -> str:
    """The page as one Python script whose line numbers are the page's."""
    out = [""] * (len(page.read_text().splitlines()) + 2)
    out[0] = "from _doc_test_helper import sh as _doc_test_sh  # noqa"
    for block in blocks:
        if block.why_not_run() is not None:
            continue
        if block.language == "python":
            for k, text in enumerate(block.code):
                out[block.line + k] = text
        elif block.language == "bash" and block.run and block.code:
            command = "\n".join(block.code)
            out[block.line] = f"_doc_test_sh({command!r}, {block.line + 1})"
    return "\n".join(out) + "\n"


def _cases() -> list[object]:
    cases: list[object] = []
    for page in PAGES:
        name = _name(page)
        try:
            blocks = parse(page)
        except ValueError:  # a marker the page may not have: its page test fails, saying which
            blocks = []
        marks = [pytest.mark.xfail(reason=NOT_YET[name], strict=False)] if name in NOT_YET else []
        cases.append(pytest.param(page, None, id=name, marks=marks))
        for block in blocks:
            if block.code and block.why_not_run() is not None:
                cases.append(pytest.param(page, block.line, id=f"{name}:{block.line}"))
    return cases


def _environment() -> dict[str, str]:
    """A page's environment, less its own index cache folder."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    # The commands' python and shardwise are this interpreter's, activated or not.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(PYTHONPATH=str(ROOT / "src"), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", MPLBACKEND="Agg",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", SHARDWISE_VERIFY_PROCESSES="1",
               PYTHONWARNINGS="ignore")  # fmt: skip
    return env


class Interpreter:
    """The ``ZYGOTE`` process: runs each page in a fork of itself, one page at a time."""

    def __init__(self, folder: Path) -> None:
        # Started with the pages' environment: torch and the warnings filters read it at start-up.
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE], cwd=folder, env=_environment(),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)  # fmt: skip

    def _line(self, deadline: float) -> str | None:
        """The next line the interpreter writes, or None at the deadline."""
        assert self.process.stdout is not None
        fd, data = self.process.stdout.fileno(), b""
        while not data.endswith(b"\n"):
            if not select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))[0]:
                return None
            byte = os.read(fd, 1)  # a byte at a time: nothing is read ahead of the line
            if not byte:
                raise RuntimeError(f"the interpreter the pages fork from exited ({self.process.wait()})")
            data += byte
        return data.decode()

    def run(self, folder: Path, script: str, env: dict[str, str], stdout: Path, stderr: Path) -> int | None:
        """Run ``script`` in ``folder`` as ``python script`` would; its exit code, or None after ``TIMEOUT``."""
        assert self.process.stdin is not None
        request = {"folder": str(folder), "script": script, "env": env, "stdout": str(stdout), "stderr": str(stderr)}
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        deadline = time.monotonic() + TIMEOUT
        pid = self._line(deadline)
        if pid is None:
            raise RuntimeError("the interpreter the pages fork from did not fork within the page's timeout")
        code = None
        try:
            code = self._line(deadline)
        finally:
            if code is None:  # past the timeout, or the test was interrupted: end the page, stay in step
                os.killpg(int(pid), signal.SIGKILL)  # the page's group: it and whatever it started
                self._line(time.monotonic() + 60)
        return int(code) if code is not None else None

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()  # the interpreter's loop ends
        self.process.wait(timeout=60)
        self.process.stdout.close()


@pytest.fixture(scope="module")
def interpreter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Interpreter]:
    """One interpreter with torch imported, for every page of this module."""
    started = Interpreter(tmp_path_factory.mktemp("interpreter"))
    yield started
    started.close()


@pytest.mark.parametrize(("page", "line"), _cases())
def test_page_runs_as_written(page: Path, line: int | None, tmp_path: Path, interpreter: Interpreter) -> None:
    """The page's blocks, run in order as one script on CPU, exit 0; a block not run says why."""
    blocks = parse(page)
    if line is not None:
        block = next(b for b in blocks if b.line == line)
        pytest.skip(f"{page.name}:{line} ({block.language}): {block.why_not_run()}")
    unmarked = [b.line for b in blocks if b.language == "bash" and not b.run and b.skip is None]
    assert not unmarked, (
        f"{page.name}: bash blocks at lines {unmarked} have no doc-test marker; put <!-- doc-test: run --> or "
        "<!-- doc-test: skip REASON --> right before each"
    )
    if not any(b.why_not_run() is None and (b.language == "python" or b.run) for b in blocks):
        pytest.skip(f"{page.name}: no block to run")
    (tmp_path / "_doc_test_helper.py").write_text(HELPER)
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    path = tmp_path / f"{page.name}.py"
    path.write_text(script(page, blocks))
    env = {**_environment(), "SHARDWISE_CACHE_DIR": str(tmp_path / "shardwise-cache")}
    out, err = tmp_path.parent / f"{tmp_path.name}.stdout", tmp_path.parent / f"{tmp_path.name}.stderr"
    code = interpreter.run(tmp_path, path.name, env, out, err)
    if code is None:
        pytest.fail(f"{page.name} did not finish within {TIMEOUT:.0f} s")
    assert code == 0, (
        f"{page.name} failed (line numbers are the page's):\n{out.read_text(errors='replace')[-2000:]}\n"
        f"{err.read_text(errors='replace')[-4000:]}"
    )


def test_markers_choose_what_runs_and_keep_the_page_line_numbers(tmp_path: Path) -> None:
    """skip/requires/gpu give reasons, code keeps its page line, and nothing runs that the page does not show."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"  # 1
        "To run this page: `x = 40`.\n"  # 2
        "```python\n"  # 3
        "x = 40\n"  # 4
        "y = x + 2\n"  # 5
        "```\n"  # 6
        "<!-- doc-test: skip needs a cluster -->\n"  # 7
        "```python\n"  # 8
        "raise SystemExit(1)\n"  # 9
        "```\n"  # 10
        "<!-- doc-test: requires no_such_module_here -->\n"  # 11
        "```python\n"  # 12
        "import no_such_module_here\n"  # 13
        "```\n"  # 14
        "```bash\n"  # 15
        "echo unmarked\n"  # 16
        "```\n"  # 17
        "```\n"  # 18
        "plain text, not code\n"  # 19
        "```\n"  # 20
    )
    blocks = parse(page)
    assert [(b.line, b.language) for b in blocks] == [(3, "python"), (8, "python"), (12, "python"), (15, "bash")]
    assert [b.why_not_run() for b in blocks] == [
        None, "needs a cluster", "needs no_such_module_here, which is not installed", None,
    ]
    assert not blocks[3].run and blocks[3].skip is None  # the page's test fails on this unmarked bash block
    lines = script(page, blocks).splitlines()
    assert lines[3] == "x = 40" and lines[4] == "y = x + 2"  # 0-based: page lines 4 and 5
    assert "SystemExit" not in "\n".join(lines) and "no_such_module_here" not in "\n".join(lines)
    assert [text for text in lines[1:] if text] == ["x = 40", "y = x + 2"]  # the script is what the page shows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- doc-test: setup\nx = 40\n-->\n```python\ny = x + 2\n```\n",
         r"page.md:1: a hidden <!-- doc-test: setup --> comment runs code the reader never sees; show it in a visible"),
        ("<!-- doc-test: setup x = 40 -->\n```python\ny = x + 2\n```\n", "page.md:1: a hidden"),
        ("```python\npass\n```\n<!-- doc-test: setup\nassert True\n-->\n", "page.md:4: a hidden"),
        ("<!-- doc-test: skip -->\n```python\npass\n```\n", "page.md:1: doc-test skip needs a reason"),
        ("<!-- doc-test: skipp typo -->\n```python\npass\n```\n", "unknown doc-test marker 'skipp'"),
        ("<!-- doc-test: gpu -->\n\n```python\npass\n```\n", "page.md:1: a doc-test marker must be right before"),
        ("<!-- doc-test: skip far away -->\nSome text.\n```python\npass\n```\n", "line 2 comes first"),
        ("```python\npass\n```\n<!-- doc-test: requires numpy -->\n", "page.md:4: .* the page ends"),
        ("<!-- doc-test: skip a usage line -->\n```\nusage\n```\n```python\npass\n```\n", "page.md:1: .* text block"),
    ],
    ids=["setup", "setup-one-line", "setup-at-end", "skip-no-reason", "unknown", "blank-line", "text-between", "at-end",
         "before-text"],
)
def test_hidden_setup_and_stray_markers_fail_the_page(tmp_path: Path, text: str, message: str) -> None:
    """What a reader would not see run, or a marker that would land on another block, is refused by name."""
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError, match=message):
        parse(page)
