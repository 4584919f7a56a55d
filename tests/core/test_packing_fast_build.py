"""The compiled build of the packing index (``_core.packing.fast_build``, the ``fast`` extra) writes the numpy build's bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardwise._core.packing import Balance, fast_build, fill_pieces, piece_counts
from shardwise._core.packing import compiled as compiled_module
from shardwise._core.packing.compiled import ENV_NUMBA, kernels
from shardwise._core.threads import ENV_WORKERS
from shardwise.index import packing
from tests.core.test_packing_build import random_histogram


@pytest.fixture
def needs_numba() -> None:
    """Skip (with the reason) where numba, the ``fast`` extra, is not installed."""
    pytest.importorskip("numba", reason="numba (the fast extra) is not installed: the compiled path is not tested")


@pytest.mark.parametrize(("chunk", "threads"), [(7, 1), (1000, 2)])
@pytest.mark.usefixtures("needs_numba")
def test_compiled_piece_index_equals_the_numpy_one(chunk: int, threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts per chunk summed, samples and starts: those of ``piece_counts`` and ``fill_pieces``, chunks on threads."""
    monkeypatch.setattr(fast_build, "CHUNK", chunk)
    jit = kernels(compiled_module.AUTO_FROM)
    assert jit is not None
    rng = np.random.default_rng(chunk)
    for max_len, dtype in ((1, np.int64), (5, np.int32), (64, np.int32), (64, ">i4")):  # samples uint32, starts uint16
        lengths = rng.integers(0, 4 * max_len + 2, size=int(rng.integers(1, 3000))).astype(dtype)
        expected_counts = piece_counts(lengths, max_len)
        expected = np.zeros(int(expected_counts.sum()), dtype=np.uint32), np.zeros(int(expected_counts.sum()), np.uint16)
        fill_pieces(lengths, max_len, expected_counts, *expected)
        counts = fast_build.piece_counts(jit, lengths, max_len, threads)
        np.testing.assert_array_equal(counts.sum(axis=0), expected_counts)
        got = np.zeros_like(expected[0]), np.zeros_like(expected[1])
        fast_build.fill_pieces(jit, lengths, max_len, counts, *got, threads)
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])


OPTIONS = [
    {"rows_per_batch": 3, "tokens_per_batch": None, "balance": Balance.TOKENS, "drop_short": False},
    {"rows_per_batch": 4, "tokens_per_batch": None, "balance": Balance.ATTENTION, "drop_short": True},
    {"rows_per_batch": 1, "tokens_per_batch": None, "balance": Balance.TOKENS, "drop_short": True},
    {"rows_per_batch": None, "tokens_per_batch": 2, "balance": Balance.TOKENS, "drop_short": False},
    {"rows_per_batch": None, "tokens_per_batch": 3, "balance": Balance.ATTENTION, "drop_short": True},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"{o['rows_per_batch']}-{o['tokens_per_batch']}-"
                                                         f"{o['balance'].value}-{o['drop_short']}")  # fmt: skip
@pytest.mark.usefixtures("needs_numba")
def test_compiled_layouts_are_the_numpy_layouts_byte_for_byte(
    options: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random histograms, row sizes and strata counts, strata packed on threads in small tasks: the same files."""
    monkeypatch.setattr(fast_build, "TASK", 3)
    monkeypatch.setattr(fast_build, "DEAL", 5)
    monkeypatch.setattr(packing, "PARALLEL_FROM", 4)
    monkeypatch.setenv(ENV_WORKERS, "1")
    rng = np.random.default_rng(len(str(options)))
    for trial in range(12):
        max_len = int(rng.integers(1, 8)) if trial % 4 == 0 else int(rng.integers(8, 300))
        counts = random_histogram(rng, max_len, int(rng.integers(1, 4000)), kinds=5)
        strata = int(rng.integers(1, 20))
        scaled = {**options}
        if options["tokens_per_batch"] is not None:
            scaled["tokens_per_batch"] = options["tokens_per_batch"] * max_len
        built = {}
        for mode in ("0", "1"):
            monkeypatch.setenv(ENV_NUMBA, mode)
            monkeypatch.setenv(ENV_WORKERS, "0" if mode == "0" else "1")  # the numpy path in this process
            directory = tmp_path / f"{trial}-{mode}"
            directory.mkdir()
            packing.write_layouts(directory, counts, strata, max_len, **scaled)
            built[mode] = {path.name: path.read_bytes() for path in sorted(directory.iterdir())}
        assert list(built["1"]) == list(built["0"])
        for name, data in built["0"].items():
            assert built["1"][name] == data, f"{name} differs (trial {trial}, max_len={max_len}, {strata} strata)"


@pytest.mark.usefixtures("needs_numba")
def test_kernels_follow_the_variable_and_the_build_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """``0``: numpy; ``auto``: compiled from AUTO_FROM items on (a small build never loads numba); ``1``: compiled."""
    monkeypatch.setattr(compiled_module, "_python_items", [0])
    monkeypatch.setenv(ENV_NUMBA, "0")
    assert kernels(compiled_module.AUTO_FROM) is None
    monkeypatch.setenv(ENV_NUMBA, "auto")
    assert kernels(compiled_module.AUTO_FROM - 1) is None
    assert kernels(compiled_module.AUTO_FROM) is not None
    monkeypatch.setenv(ENV_NUMBA, "1")
    assert kernels(1) is not None
    monkeypatch.setattr(compiled_module, "_compiled", lambda: None)  # as without numba
    with pytest.raises(ImportError, match=r"shardwise\[fast\]"):
        kernels(1)
    monkeypatch.setenv(ENV_NUMBA, "auto")
    assert kernels(compiled_module.AUTO_FROM) is None


def test_allocate_keeps_a_new_maps_size_and_values(tmp_path: Path) -> None:
    """Reserving a sparse map's blocks changes neither its size nor what was written; the map stays writable."""
    path = tmp_path / "values.npy"
    values = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint32, shape=(1 << 20,))
    values[12_345] = 7
    size = path.stat().st_size
    fast_build.allocate(path)
    values[-1] = 9
    assert path.stat().st_size == size
    del values
    back = np.load(path)
    assert back[12_345] == 7 and back[-1] == 9 and int(back.sum()) == 16
