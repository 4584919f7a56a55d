"""The benchmarks run from a fresh clone: every one answers ``--help`` and offers ``--quick``; no path of one machine.

``python -m bench.<name> --help`` from the repository root, for every benchmark script of ``bench/``
(``bench/_lib/`` holds their helpers, not benchmarks). To keep this fast, the scripts run one after
the other in one fresh interpreter at the repository root (numpy and torch imported once): each runs
as ``__main__`` through ``runpy.run_module("bench.<name>", alter_sys=True)`` with ``--help`` as its
argument, which is what ``python -m bench.<name> --help`` gives a module; one script also runs as its
own process, to check that equivalence. Each script is a test of its own.

Paths: the benchmarks, the docs and the two front pages name no absolute path of a machine (a user's
home, a scratch or temporary folder, one machine's install): data comes from the repository
(``bench/data/``) or :mod:`sysconfig`, scratch space from :mod:`tempfile` or an option.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(path.name for path in (ROOT / "bench").glob("*.py") if not path.name.startswith("_"))
"""The benchmark scripts: the modules of ``bench/`` a user runs (``__init__.py`` and the ``_lib`` helpers are not)."""
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "CUDA_VISIBLE_DEVICES": ""}
PAGES = sorted(
    [
        *(ROOT / "bench").rglob("*.py"),
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / name for name in ("README.md", "BENCHMARKS.md") if (ROOT / name).exists()),
    ]
)
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|home|root|tmp|Users|mnt|scratch)/[\w.-]*")
"""An absolute path into a machine's own folders (not a URL's path, not ``bench/data/``, not ``~/``)."""

HELP_ALL = """
import contextlib, io, json, runpy, sys
names = sys.argv[1:]
results = {}
for name in names:
    sys.argv = [sys.argv[0], "--help"]  # run_module(alter_sys=True) puts the module's file first, as -m does
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(f"bench.{name.removesuffix('.py')}", run_name="__main__", alter_sys=True)
        results[name] = {"code": None, "out": out.getvalue()}
    except SystemExit as done:
        results[name] = {"code": done.code, "out": out.getvalue()}
    except BaseException as error:
        results[name] = {"code": "raised", "out": f"{type(error).__name__}: {error}"}
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, dict[str, object]]:
    """Every benchmark's ``--help`` exit code and output, from one fresh interpreter at the repository root."""
    done = subprocess.run([sys.executable, "-c", HELP_ALL, *BENCHES], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, f"the --help run died (exit {done.returncode}): {done.stderr[-3000:]}"
    results: dict[str, dict[str, object]] = json.loads(lines[-1].removeprefix("RESULTS "))
    return results


def test_there_are_benchmarks() -> None:
    """bench/ holds the benchmark scripts this file checks (a moved folder would pass every case vacuously)."""
    assert len(BENCHES) >= 10, BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_help_and_quick(name: str, helps: dict[str, dict[str, object]]) -> None:
    """``python -m bench.<name> --help`` exits 0 with a usage text that offers ``--quick``."""
    result = helps[name]
    assert result["code"] == 0, f"bench/{name} --help: exit {result['code']!r}: {str(result['out'])[-2000:]}"
    assert "usage:" in str(result["out"]), result["out"]
    assert "--quick" in str(result["out"]), f"bench/{name} has no --quick mode (a smoke-sized run)"


def test_help_as_its_own_process() -> None:
    """One benchmark run the way a user runs it, as a module in its own process, prints the same help."""
    done = subprocess.run([sys.executable, "-m", "bench.bench_bucket", "--help"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--quick" in done.stdout and "--data DIR" in done.stdout, done.stdout


def test_bench_is_a_package_without_path_edits() -> None:
    """bench/ holds the scripts a user runs; its helpers are the package bench._lib; nothing edits ``sys.path``."""
    stray = sorted(path.name for path in (ROOT / "bench").glob("_*.py") if path.name != "__init__.py")
    assert not stray, f"helpers belong in bench/_lib/, imported as bench._lib.<name>: {stray}"
    edits = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "bench").rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"sys\.path\.(insert|append)|sys\.path\s*[+]?=", line)]  # fmt: skip
    assert not edits, f"run benchmarks as python -m bench.<name> from the repository root instead: {edits}"


@pytest.mark.parametrize("page", [str(page.relative_to(ROOT)) for page in PAGES])
def test_no_machine_path(page: str) -> None:
    """The file names no absolute path of one machine (home, scratch, temporary folder)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    found = [(text.count("\n", 0, hit.start()) + 1, hit.group()) for hit in MACHINE_PATH.finditer(text)]
    assert not found, f"{page}: machine paths at (line, path): {found[:10]}"


def test_machine_path_pattern() -> None:
    """The pattern finds a machine's paths and leaves repository paths, URLs and home-relative paths alone."""
    top = "/"  # the examples are built from parts, so that this file names no machine path itself
    hits = [f"open('{top}work/shared/data/x')", f"flock {top}tmp/x.lock", f"--out {top}tmp/run",
            f"{top}root/.pyenv/versions/3.11.7", f"{top}home/me/data", f"`{top}Users/me`"]  # fmt: skip
    misses = ["bench/data/wikitext-2", "https://github.com/pytorch/examples/tree/main/tmp/x", "~/.cache/shardwise",
              "s3://bucket/tmp/x", "a/tmp/b", "../scratch-venv", "tempfile.gettempdir()"]  # fmt: skip
    assert [bool(MACHINE_PATH.search(text)) for text in hits] == [True] * len(hits)
    assert [bool(MACHINE_PATH.search(text)) for text in misses] == [False] * len(misses)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_front_page_is_short_and_readme_figures_point_into_it() -> None:
    """BENCHMARKS.md fits a few screens; every figure of README's table links to one of its sections."""
    front = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert len(front) < 20_000, f"BENCHMARKS.md is {len(front):,} characters: history goes to docs/benchmarks/"
    anchors = {_anchor(line.lstrip("#")) for line in front.splitlines() if line.startswith("## ")}
    rows = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `") and line.count(" | ") >= 2]  # fmt: skip
    measured = [row.strip().strip("|").split("|")[-1] for row in rows]  # the last column: what was measured
    assert len(measured) >= 10, rows
    for cell in filter(None, (cell.strip() for cell in measured)):
        targets = re.findall(r"\]\(BENCHMARKS\.md#([\w-]+)\)", cell)
        assert targets, f"a README figure with no link into BENCHMARKS.md: {cell}"
        assert set(targets) <= anchors, f"{cell}: no such section in BENCHMARKS.md ({sorted(anchors)})"


@pytest.mark.parametrize("page", ["BENCHMARKS.md", *(f"docs/benchmarks/{p.name}" for p in
                                                     sorted((ROOT / "docs" / "benchmarks").glob("*.md")))])  # fmt: skip
def test_benchmark_pages_link_to_files_that_exist(page: str) -> None:
    """Every relative link of the front page and of the history pages names a file of the repository."""
    path = ROOT / page
    links = re.findall(r"\]\(([^)#:\s]+)(?:#[\w-]*)?\)", path.read_text(encoding="utf-8"))
    missing = [link for link in links if not (path.parent / link).exists()]
    assert not missing, f"{page}: links to nothing: {missing}"
