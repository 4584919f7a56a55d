"""The numba-compiled ``pack_histogram`` (the ``fast`` extra) makes the plain-Python placements, placement for placement."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from shardwise._core.packing import class_phases, stratum_histogram
from shardwise._core.packing import compiled as compiled_module
from shardwise._core.packing.compiled import ENV_NUMBA, numba_mode, placements
from shardwise._core.packing.rows import _placements, pack_histogram
from tests.core.test_packing_build import random_histogram


def _both(histogram: np.ndarray, max_len: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled and the Python placements, then ``pack_histogram``'s ``(item_rows, num_rows)``, are equal."""
    histogram = np.asarray(histogram, dtype=np.int64)
    monkeypatch.setenv(ENV_NUMBA, "1")
    fast = placements(histogram, max_len)
    assert fast is not None
    slow = _placements(histogram, max_len)
    for got, expected in zip(fast[:4], slow[:4], strict=True):
        np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.int64))
    assert fast[4] == slow[4]
    fast_rows, fast_num = pack_histogram(histogram, max_len)
    monkeypatch.setenv(ENV_NUMBA, "0")
    slow_rows, slow_num = pack_histogram(histogram, max_len)
    assert fast_num == slow_num
    assert fast_rows.dtype == slow_rows.dtype == np.int64
    np.testing.assert_array_equal(fast_rows, slow_rows)


@pytest.fixture
def needs_numba() -> None:
    """Skip (with the reason) where numba, the ``fast`` extra, is not installed."""
    pytest.importorskip("numba", reason="numba (the fast extra) is not installed: the compiled path is not tested")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.usefixtures("needs_numba")
def test_compiled_equals_python_on_random_histograms(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random histograms and row sizes (tiny to 5000, zeros, one length, max_len-sized items): identical placements."""
    rng = np.random.default_rng(seed)
    for trial in range(200):
        max_len = int(rng.integers(1, 8)) if trial % 5 == 0 else int(rng.integers(1, 300 if trial % 7 else 5000))
        _both(random_histogram(rng, max_len, int(rng.integers(0, 3000)), kinds=5), max_len, monkeypatch)


@pytest.mark.parametrize(
    ("histogram", "max_len"),
    [
        ([0, 0], 1),  # no item
        ([5, 0], 1),  # zeros only
        ([0, 7], 1),  # max_len-sized items, max_len 1
        ([3, 0, 0, 0, 9], 4),  # zeros and max_len-sized items
        ([0, 10, 0, 0], 3),  # one length, three a row
        ([2, 1, 1, 1, 1, 1, 1, 1, 1], 8),  # one of each
    ],
)
@pytest.mark.usefixtures("needs_numba")
def test_compiled_equals_python_on_edge_histograms(
    histogram: list[int], max_len: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty, zeros only, max_len-sized items only, tiny max_len: identical placements."""
    padded = np.zeros(max_len + 1, dtype=np.int64)
    padded[: min(len(histogram), max_len + 1)] = histogram[: max_len + 1]
    _both(padded, max_len, monkeypatch)


@pytest.mark.usefixtures("needs_numba")
def test_compiled_equals_python_on_real_strata(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strata of long-tailed corpora (max_len 4096 and 8192, windows of 4096 and 32768): identical placements."""
    rng = np.random.default_rng(11)
    for max_len, window, items in ((4096, 4096, 40_000), (8192, 32_768, 200_000)):
        lengths = np.clip(rng.lognormal(5.5, 1.0, items), 0, max_len).astype(np.int64)
        counts = np.bincount(lengths, minlength=max_len + 1)
        strata = -(-lengths.size // window)
        phases = class_phases(counts.size)
        for stratum in (0, 1, strata // 2, strata - 1):
            _both(stratum_histogram(counts, strata, stratum, phases), max_len, monkeypatch)


@pytest.mark.usefixtures("needs_numba")
def test_a_capacity_too_small_is_grown_and_gives_the_same_placements(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel runs again with a larger capacity when the first is too small; the placements do not change."""
    monkeypatch.setenv(ENV_NUMBA, "1")
    rng = np.random.default_rng(5)
    histogram = random_histogram(rng, 512, 5000, kinds=5).astype(np.int64)
    small = placements(histogram, 512, capacity=1)
    default = placements(histogram, 512)
    assert small is not None and default is not None
    for got, expected in zip(small, default, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_the_variable_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    """SHARDWISE_NUMBA accepts 0, 1, auto or nothing; anything else is a ValueError naming it and the accepted values."""
    for value, mode in (("", "auto"), ("auto", "auto"), ("1", "on"), ("0", "off")):
        monkeypatch.setenv(ENV_NUMBA, value)
        assert numba_mode() == mode
    monkeypatch.setenv(ENV_NUMBA, "yes")
    with pytest.raises(ValueError, match=r"SHARDWISE_NUMBA='yes'.*0 .*1 .*auto"):
        pack_histogram(np.array([0, 1]), 1)
    monkeypatch.setenv(ENV_NUMBA, "0")
    assert placements(np.array([0, 1]), 1) is None


def test_numba_missing_falls_back_or_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without numba: ``auto`` packs in plain Python (the same rows), ``1`` is an ImportError naming the extra."""
    monkeypatch.setattr(compiled_module, "_compiled", lambda: None)
    monkeypatch.setattr(compiled_module, "_python_items", [compiled_module.AUTO_FROM])  # past the small builds
    histogram = np.array([1, 2, 3, 0, 4], dtype=np.int64)
    monkeypatch.setenv(ENV_NUMBA, "auto")
    assert placements(histogram, 4) is None
    rows, num_rows = pack_histogram(histogram, 4)
    monkeypatch.setenv(ENV_NUMBA, "0")
    expected_rows, expected_num = pack_histogram(histogram, 4)
    assert num_rows == expected_num
    np.testing.assert_array_equal(rows, expected_rows)
    monkeypatch.setenv(ENV_NUMBA, "1")
    with pytest.raises(ImportError, match=r"shardwise\[fast\]"):
        pack_histogram(histogram, 4)


def test_importing_the_packing_core_does_not_import_numba() -> None:
    """numba is imported on the first packing only: ``import shardwise._core.packing`` leaves it out."""
    code = "import sys, shardwise._core.packing; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.usefixtures("needs_numba")
def test_auto_packs_small_builds_in_python_then_turns_to_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto``: plain Python until the process has packed AUTO_FROM items (a small build never imports numba)."""
    monkeypatch.setenv(ENV_NUMBA, "auto")
    monkeypatch.setattr(compiled_module, "_python_items", [0])
    histogram = np.zeros(65, dtype=np.int64)
    histogram[[3, 64]] = compiled_module.AUTO_FROM // 4  # half of AUTO_FROM items a call
    assert placements(histogram, 64) is None  # the first half: Python
    assert placements(histogram, 64) is None  # reaches AUTO_FROM
    assert placements(histogram, 64) is not None  # from here on, compiled
