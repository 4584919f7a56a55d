"""The shared index layer: cache entries, keys, the chunked counting sort, keyed shuffles within groups."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from shardwise import index
from shardwise.index import (
    GroupedIndex,
    IndexCacheError,
    IndexCacheTimeout,
    build_or_open,
    group_keys,
    key_of,
    length_index,
    order_by_key,
    permute_within,
    progress,
)
from shardwise.index import cache as cache_module


def _builder(values: np.ndarray, calls: list[int] | None = None):  # type: ignore[no-untyped-def]
    def build(directory: Path) -> None:
        if calls is not None:
            calls.append(1)
        np.save(directory / "values.npy", values)
        np.save(directory / "twice.npy", values * 2)

    return build


def test_build_then_open_returns_read_only_memmaps(tmp_path: Path) -> None:
    """The first call builds and the second opens the same entry: read-only memory maps, no rebuild."""
    calls: list[int] = []
    values = np.arange(100_000, dtype=np.int64)
    first = build_or_open("test-kind", "k1", _builder(values, calls), cache_dir=tmp_path)
    second = build_or_open("test-kind", "k1", _builder(values, calls), cache_dir=tmp_path)
    assert calls == [1]
    assert set(second) == {"values", "twice"}
    assert isinstance(second["values"], np.memmap) and not second["values"].flags.writeable
    np.testing.assert_array_equal(first["twice"], values * 2)
    np.testing.assert_array_equal(second["values"], values)
    entries = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert [p.name for p in entries] == [index.entry_name("test-kind", "k1")]


def test_other_key_or_kind_is_another_entry(tmp_path: Path) -> None:
    """Entries are addressed by (kind, key): another key or kind builds its own."""
    calls: list[int] = []
    for kind, key in (("a", "k"), ("a", "k2"), ("b", "k"), ("a", "k")):
        build_or_open(kind, key, _builder(np.arange(3), calls), cache_dir=tmp_path)
    assert len(calls) == 3


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "foreign", "no-manifest"])
def test_damaged_entry_is_rebuilt(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """A truncated, corrupted, unreadable or foreign entry is detected at open and rebuilt."""
    values = np.arange(1_000_000, dtype=np.int64)
    build_or_open("kind", "key", _builder(values), cache_dir=tmp_path)
    entry = tmp_path / index.entry_name("kind", "key")
    target = entry / "values.npy"
    if damage == "truncate":
        with open(target, "r+b") as file:
            file.truncate(target.stat().st_size - 8)
    elif damage == "flip":
        with open(target, "r+b") as file:
            file.seek(target.stat().st_size - 100)  # inside the last sampled block
            byte = file.read(1)
            file.seek(-1, os.SEEK_CUR)
            file.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "manifest":
        (entry / "manifest.json").write_text("{not json")
    elif damage == "foreign":
        manifest = json.loads((entry / "manifest.json").read_text())
        manifest["key"] = "someone else's"
        (entry / "manifest.json").write_text(json.dumps(manifest))
    else:
        (entry / "manifest.json").unlink()
    calls: list[int] = []
    with caplog.at_level("WARNING", logger="shardwise"):
        arrays = build_or_open("kind", "key", _builder(values, calls), cache_dir=tmp_path)
    assert calls == [1]
    assert "rebuilding" in caplog.text
    np.testing.assert_array_equal(arrays["values"], values)


def _entries(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if not p.name.startswith(".")}


def test_remove_entries_matches_the_manifest_key_of_one_kind(tmp_path: Path) -> None:
    """remove_entries removes the entries of one kind whose recorded key is stale: not other kinds, not others' keys."""
    for kind, key in (("plan", "a e=0"), ("plan", "a e=1"), ("plan", "b e=0"), ("other", "a e=0")):
        build_or_open(kind, key, _builder(np.arange(3)), cache_dir=tmp_path)
    mapped = build_or_open("plan", "a e=0", _builder(np.arange(3)), cache_dir=tmp_path)["values"]
    assert index.remove_entries(tmp_path, "plan", lambda key: key.startswith("a ")) == 2
    assert _entries(tmp_path) == {index.entry_name("plan", "b e=0"), index.entry_name("other", "a e=0")}
    np.testing.assert_array_equal(mapped, np.arange(3))  # a reader that mapped it keeps its data
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".old", ".partial"))]
    assert index.remove_entries(tmp_path, "plan", lambda key: key.startswith("a ")) == 0
    assert index.remove_entries(tmp_path / "missing", "plan", lambda key: True) == 0


def test_remove_entries_skips_vanished_or_unreadable_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry removed by another process meanwhile, or with an unreadable manifest, is skipped, not an error."""
    for key in ("k0", "k1", "k2"):
        build_or_open("plan", key, _builder(np.arange(3)), cache_dir=tmp_path)
    (tmp_path / index.entry_name("plan", "k2") / "manifest.json").write_text("{not json")
    real_remove, real_rename = cache_module._remove, os.rename

    def gone_before(entry: Path, root: Path) -> bool:  # another process removed it after we read its manifest
        if entry.name == index.entry_name("plan", "k0"):
            shutil.rmtree(entry)
        return real_remove(entry, root)

    def gone_during(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        if Path(source).name == index.entry_name("plan", "k1"):  # ... or between its exists() and its rename
            shutil.rmtree(source)
        real_rename(source, target)

    monkeypatch.setattr(cache_module, "_remove", gone_before)
    monkeypatch.setattr(os, "rename", gone_during)
    assert index.remove_entries(tmp_path, "plan", lambda key: True) == 0
    monkeypatch.undo()
    assert _entries(tmp_path) == {index.entry_name("plan", "k2")}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".old")]


def test_a_new_entry_removes_the_entries_it_replaces(tmp_path: Path) -> None:
    """build_or_open(replaces=...) removes superseded entries only when it builds: never itself, not on open."""
    for epoch in range(3):
        previous = f"e{epoch - 1}"
        build_or_open(
            "plan", f"e{epoch}", _builder(np.arange(3)), cache_dir=tmp_path, replaces=lambda key: key != previous
        )
    assert _entries(tmp_path) == {index.entry_name("plan", "e1"), index.entry_name("plan", "e2")}
    build_or_open("plan", "e1", _builder(np.arange(3)), cache_dir=tmp_path, replaces=lambda key: True)  # opened
    assert len(_entries(tmp_path)) == 2
    build_or_open("plan", "e3", _builder(np.arange(3)), cache_dir=tmp_path, replaces=lambda key: True)
    assert _entries(tmp_path) == {index.entry_name("plan", "e3")}


def test_disabled_cache_builds_in_memory_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SHARDWISE_CACHE=off or cache_dir=False builds in memory and warns once, stating the cost."""
    monkeypatch.setattr(cache_module, "_warned", set())
    values = np.arange(10, dtype=np.int64)
    with pytest.warns(RuntimeWarning, match=r"cache_dir=False.*MiB per process"):
        arrays = build_or_open("kind", "key", _builder(values), cache_dir=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = build_or_open("kind", "key", _builder(values), cache_dir=False)
    assert not isinstance(arrays["values"], np.memmap) and not again["values"].flags.writeable
    np.testing.assert_array_equal(again["twice"], values * 2)
    monkeypatch.setenv("SHARDWISE_CACHE", "off")
    with pytest.warns(RuntimeWarning, match="SHARDWISE_CACHE=off"):
        build_or_open("kind", "key", _builder(values), cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


_READ_ONLY_SCRIPT = """
import sys, warnings
import numpy as np
from shardwise.index import build_or_open
calls = []
def build(directory):
    calls.append(1)
    np.save(directory / "values.npy", np.arange(50))
held = build_or_open("kind", "held", build, cache_dir=sys.argv[1])
assert calls == [] and isinstance(held["values"], np.memmap), calls
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fresh = build_or_open("kind", "new", build, cache_dir=sys.argv[1])
    build_or_open("kind", "new", build, cache_dir=sys.argv[1])
assert calls == [1, 1] and fresh["values"].tolist() == list(range(50)), calls
print(len(caught), caught[0].message)
"""


def test_read_only_cache_dir_works_with_a_warning(tmp_path: Path) -> None:
    """A read-only cache directory opens what it holds and builds the rest in memory, warning once."""
    build_or_open("kind", "held", lambda d: np.save(d / "values.npy", np.arange(50)), cache_dir=tmp_path)
    prefix: list[str] = []
    if os.geteuid() == 0:  # root ignores permission bits unless it drops CAP_DAC_OVERRIDE
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner"]
    tmp_path.chmod(0o555)
    try:
        out = subprocess.run(
            [*prefix, sys.executable, "-c", _READ_ONLY_SCRIPT, str(tmp_path)],
            check=False, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": ""},
        )  # fmt: skip
    finally:
        tmp_path.chmod(0o755)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1 ") and "read-only" in out.stdout and "MiB per process" in out.stdout


def test_bad_cache_dir_errors_name_the_parameter(tmp_path: Path) -> None:
    """A cache_dir that is a file or cannot be created raises, naming cache_dir; bad kind/timeout too."""
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(IndexCacheError, match="cache_dir should be a directory"):
        build_or_open("kind", "key", _builder(np.arange(3)), cache_dir=a_file)
    with pytest.raises(IndexCacheError, match=r"cache_dir=.*cannot be created"):
        build_or_open("kind", "key", _builder(np.arange(3)), cache_dir=a_file / "below")
    with pytest.raises(ValueError, match="kind should be"):
        build_or_open("a/b", "key", _builder(np.arange(3)), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="timeout should be"):
        build_or_open("kind", "key", _builder(np.arange(3)), cache_dir=tmp_path, timeout=-1)
    with pytest.raises(TypeError, match="cache_dir should be"):
        build_or_open("kind", "key", _builder(np.arange(3)), cache_dir=True)


def test_lock_timeout_is_a_clear_error(tmp_path: Path) -> None:
    """While another holder keeps the build lock, a builder gives up after timeout with a clear error."""
    from filelock import FileLock

    name = index.entry_name("kind", "key")
    with FileLock(str(tmp_path / f".{name}.lock")), pytest.raises(IndexCacheTimeout, match=r"timeout=0\.2"):
        build_or_open("kind", "key", _builder(np.arange(3)), cache_dir=tmp_path, timeout=0.2)


@pytest.mark.parametrize(("n", "chunk", "high"), [(10_001, 1000, 70_000), (150_001, 1 << 16, 70_000), (20_001, 1000, 9_000)])
def test_order_by_key_is_a_stable_counting_sort(tmp_path: Path, n: int, chunk: int, high: int) -> None:
    """order_by_key equals a stable argsort, in chunks smaller than the input, with per-key offsets (keys of 16
    bits: numpy's radix argsort; wider: one sort of 32- or 64-bit (key, position) integers)."""
    keys = np.random.default_rng(1).integers(0, high, n).astype(np.uint32)
    order_by_key(keys, tmp_path, chunk=chunk)
    order, offsets = np.load(tmp_path / "order.npy"), np.load(tmp_path / "order_offsets.npy")
    assert order.dtype == np.uint32
    np.testing.assert_array_equal(order, np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(np.diff(offsets), np.bincount(keys, minlength=offsets.size - 1))


@pytest.mark.parametrize(
    ("keys", "error", "match"),
    [
        (np.array([1.5, 2.0]), TypeError, "lengths should hold integers"),
        (np.array([3, -1]), ValueError, r"lengths\[1\]=-1"),
        (np.array([[1, 2]]), ValueError, "1-D"),
        (np.array([2**40]), ValueError, "below 2\\*\\*27"),
    ],
)
def test_order_by_key_bad_keys_name_the_parameter(tmp_path: Path, keys: np.ndarray, error: type, match: str) -> None:
    """Keys that are not small non-negative integers raise, naming the parameter and the first bad entry."""
    with pytest.raises(error, match=match):
        order_by_key(keys, tmp_path, param="lengths")


def test_permute_within_is_a_bijection_per_group() -> None:
    """Every group's ranks map onto [0, size) exactly once; another key gives another order."""
    sizes = [1, 2, 3, 7, 64, 1000, 4097]
    groups = np.repeat(np.arange(len(sizes)), sizes)
    ranks = np.concatenate([np.arange(s) for s in sizes])
    size_of = np.repeat(sizes, sizes)
    one = permute_within(ranks, size_of, group_keys(1, groups))
    two = permute_within(ranks, size_of, group_keys(2, groups))
    for g, s in enumerate(sizes):
        assert sorted(one[groups == g].tolist()) == list(range(s))
    assert not np.array_equal(one[groups == 6], two[groups == 6])


def test_grouped_index_members() -> None:
    """members() picks the t-th sample of a group, in index order without a key, shuffled with one."""
    lengths = np.array([3, 1, 3, 0, 3, 1])
    order = np.argsort(lengths, kind="stable")
    grouped = GroupedIndex(order, np.concatenate([[0], np.cumsum(np.bincount(lengths))]))
    assert grouped.members(np.full(3, 3), np.arange(3), key=None).tolist() == [0, 2, 4]
    assert sorted(grouped.members(np.full(3, 3), np.arange(3), key=11).tolist()) == [0, 2, 4]
    assert grouped.sizes().tolist() == [1, 2, 0, 3]


def test_key_of_is_cheap_for_memmaps_and_tracks_content(tmp_path: Path) -> None:
    """A memmap's key follows its file, slice and content; an in-memory array's follows its bytes."""
    values = np.arange(1000, dtype=np.int32)
    np.save(tmp_path / "a.npy", values)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert key_of(mapped) == key_of(np.load(tmp_path / "a.npy", mmap_mode="r"))
    assert key_of(mapped[10:]) != key_of(mapped[:-10])
    assert key_of(values) == key_of(values.copy()) != key_of(values[::-1].copy())
    before = key_of(mapped)
    changed = values.copy()
    changed[0] = 7
    np.save(tmp_path / "a.npy", changed)
    os.utime(tmp_path / "a.npy", ns=(1, 2))
    assert key_of(np.load(tmp_path / "a.npy", mmap_mode="r")) != before


def test_length_index_same_with_and_without_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached index and the in-memory one hold the same order and offsets."""
    monkeypatch.setattr(cache_module, "_warned", set())
    lengths = np.random.default_rng(3).integers(0, 300, 50_000)
    cached = length_index(lengths, cache_dir=tmp_path)
    with pytest.warns(RuntimeWarning):
        memory = length_index(lengths, cache_dir=False)
    np.testing.assert_array_equal(cached.order, memory.order)
    np.testing.assert_array_equal(cached.offsets, memory.offsets)


def test_default_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SHARDWISE_CACHE_DIR wins over XDG_CACHE_HOME, which wins over ~/.cache."""
    monkeypatch.delenv("SHARDWISE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert index.default_cache_dir() == tmp_path / "xdg" / "shardwise"
    monkeypatch.setenv("SHARDWISE_CACHE_DIR", str(tmp_path / "mine"))
    assert index.default_cache_dir() == tmp_path / "mine"


# -- progress: build lines, the waiting line, one switch ------------------------------------------
_SLOW_BUILDER = """
import sys, time
import numpy as np
from shardwise.index import build_or_open

def build(directory):
    print("building", flush=True)
    time.sleep(3)
    np.save(directory / "values.npy", np.arange(10))

build_or_open("slow", sys.argv[2], build, cache_dir=sys.argv[1])
"""


def _wait_for_other_builder(tmp_path: Path, key: str) -> int:
    """Start a process that builds (kind "slow", key) for 3 s, wait until it holds the lock, open the entry here."""
    builder = subprocess.Popen(
        [sys.executable, "-c", _SLOW_BUILDER, str(tmp_path), key], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    try:
        assert builder.stdout is not None and builder.stdout.readline().strip() == "building"
        arrays = build_or_open("slow", key, _builder(np.arange(1)), cache_dir=tmp_path, timeout=60)
        np.testing.assert_array_equal(arrays["values"], np.arange(10))  # the other process's entry
        assert builder.wait(timeout=60) == 0
    finally:
        builder.kill()
        builder.wait()
        if builder.stdout is not None:
            builder.stdout.close()
    return builder.pid


def test_a_waiting_process_says_once_what_it_waits_for_and_who_builds_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line names the entry, the lock file and the building host/pid; SHARDWISE_PROGRESS=off silences it."""
    with caplog.at_level(logging.INFO, logger="shardwise"):
        pid = _wait_for_other_builder(tmp_path, "k1")
    waiting = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert len(waiting) == 1, waiting
    assert f"{socket.gethostname()}/pid {pid}" in waiting[0] and "lock file" in waiting[0]
    caplog.clear()
    monkeypatch.setenv("SHARDWISE_PROGRESS", "off")
    with caplog.at_level(logging.INFO, logger="shardwise"):
        _wait_for_other_builder(tmp_path, "k2")
    assert not [r for r in caplog.records if "waiting for" in r.getMessage()]


def test_builder_progress_lines_are_rate_limited_and_switched_off_in_one_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off a terminal the counting sort logs at most one line per LOG_EVERY seconds; set_progress(False) silences it."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(progress, "clock", lambda: float(next(ticks)))  # one second per chunk
    keys = np.arange(1000) % 7
    with caplog.at_level(logging.INFO, logger="shardwise"):
        order_by_key(keys, tmp_path, chunk=10)  # 2 passes of 100 chunks: 200 s of fake time
    lines = [r.getMessage() for r in caplog.records if "indexing keys" in r.getMessage()]
    assert len(lines) == 200 // int(progress.LOG_EVERY), lines
    assert "100% (2000 of 2000 keys)" in lines[-1]
    caplog.clear()
    progress.set_progress(False)
    try:
        with caplog.at_level(logging.INFO, logger="shardwise"):
            order_by_key(keys, tmp_path, chunk=10)
    finally:
        progress.set_progress(None)
    assert not caplog.records


def test_a_builder_that_reports_nothing_still_shows_it_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build with no progress of its own logs a 'still running' line every LOG_EVERY seconds; the switch silences it."""
    monkeypatch.setattr(progress, "LOG_EVERY", 0.2)

    def slow(directory: Path) -> None:
        time.sleep(1.1)
        np.save(directory / "values.npy", np.arange(3))

    with caplog.at_level(logging.INFO, logger="shardwise"):
        build_or_open("slow", "k1", slow, cache_dir=tmp_path)
    lines = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
    assert 3 <= len(lines) <= 6, lines
    assert "building the slow index slow-" in lines[0]
    caplog.clear()
    monkeypatch.setenv("SHARDWISE_PROGRESS", "off")
    with caplog.at_level(logging.INFO, logger="shardwise"):
        build_or_open("slow", "k2", slow, cache_dir=tmp_path)
    assert not caplog.records

