"""RaggedWriter: tensors and lists, many offsets, progress, samples that do not fit, closing, aborting, memory."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from shardwise import RaggedArray, RaggedWriter
from tests.data.ragged.stores import _leftovers, _run_limited


def test_writer_accepts_tensors_and_lists(tmp_path: Path) -> None:
    """CPU tensors and nested lists are samples too; their dtype must still match."""
    with RaggedWriter(tmp_path / "s") as writer:
        writer.append(torch.ones(2, 3, dtype=torch.float64))
        writer.append([[1.0, 2.0, 3.0]])
        assert (writer.num_samples, writer.total_rows) == (2, 3)
    store = RaggedArray(tmp_path / "s")
    assert store.dtype == np.float64
    assert store[1].tolist() == [[1.0, 2.0, 3.0]]


def test_writer_keeps_offsets_beyond_its_buffer(tmp_path: Path) -> None:
    """More samples than the writer buffers offsets for: every offset reaches the file."""
    n = (1 << 16) + 5
    store = RaggedArray.write(tmp_path / "s", (np.full((i % 3, 1), i, np.int32) for i in range(n)))
    assert len(store) == n
    assert store.lengths.tolist() == [i % 3 for i in range(n)]
    assert store[n - 1].tolist() == [[n - 1]] * ((n - 1) % 3)


def test_progress_bar_shows_samples_written(tmp_path: Path, arrays: list, capsys: pytest.CaptureFixture) -> None:
    """progress=True draws a tqdm bar counting samples."""
    RaggedArray.write(tmp_path / "s", arrays, progress=True)
    assert f"{len(arrays)}/{len(arrays)}" in capsys.readouterr().err


def test_progress_without_tqdm_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tqdm installed, progress=True names the extra to install and leaves nothing behind."""
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match=r"pip install 'shardwise\[progress\]'"):
        RaggedArray.write(tmp_path / "s", [np.zeros((1, 1))], progress=True)
    assert not (tmp_path / "s").exists()
    assert _leftovers(tmp_path) == []


def test_dtype_that_differs_names_the_sample(tmp_path: Path) -> None:
    """A sample whose dtype differs from the store's fails naming its index and where the dtype came from."""
    samples = [np.zeros((2, 3), np.float32), np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float64)]
    with pytest.raises(TypeError, match=r"sample 2 has dtype float64, but the store holds float32 \(set by sample 0\)"):
        RaggedArray.write(tmp_path / "s", samples)
    with pytest.raises(TypeError, match=r"sample 0 has dtype float32, but the store holds float16 \(set by the dtype"):
        RaggedArray.write(tmp_path / "s", samples, dtype=np.float16)
    assert not (tmp_path / "s").exists()
    assert _leftovers(tmp_path) == []


def test_feature_shape_that_differs_names_the_sample(tmp_path: Path) -> None:
    """A sample whose row shape differs fails naming its index, its shape and the store's."""
    samples = [np.zeros((2, 3)), np.zeros((0, 3)), np.zeros((4, 2))]
    with pytest.raises(ValueError, match=r"sample 2 has shape \(4, 2\), so feature shape \(2,\), but the store holds "
                       r"rows of shape \(3,\) \(set by sample 0\)"):  # fmt: skip
        RaggedArray.write(tmp_path / "s", samples)
    with pytest.raises(ValueError, match=r"sample 0 .* \(set by the feature_shape argument\)"):
        RaggedArray.write(tmp_path / "s", samples, feature_shape=(4,))
    with pytest.raises(ValueError, match=r"sample 1 is a scalar, but every sample needs a rows axis"):
        RaggedArray.write(tmp_path / "s", [np.zeros(2), np.float64(1.0)])
    assert _leftovers(tmp_path) == []


def test_sample_of_unsupported_dtype_is_refused(tmp_path: Path) -> None:
    """A first sample of strings or objects names itself."""
    with pytest.raises(TypeError, match=r"sample 0's dtype should be a numeric numpy dtype"):
        RaggedArray.write(tmp_path / "s", [np.array(["a", "b"])])


def test_failure_in_the_iterable_leaves_nothing(tmp_path: Path) -> None:
    """An exception raised by the samples' iterable leaves no store and no temporary directory."""

    def broken():
        yield np.zeros((3, 2))
        raise OSError("disk of the source went away")

    with pytest.raises(OSError, match="went away"):
        RaggedArray.write(tmp_path / "s", broken())
    assert list(tmp_path.iterdir()) == []


def test_closed_writer_refuses_more_samples(tmp_path: Path) -> None:
    """append after close raises instead of corrupting the finished store."""
    writer = RaggedWriter(tmp_path / "s")
    writer.append(np.zeros((1, 1)))
    writer.close()
    with pytest.raises(ValueError, match="is closed"):
        writer.append(np.zeros((1, 1)))
    assert len(RaggedArray(tmp_path / "s")) == 1


def test_abort_leaves_nothing(tmp_path: Path) -> None:
    """abort() deletes everything written so far."""
    writer = RaggedWriter(tmp_path / "s")
    writer.append(np.zeros((5, 1)))
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_writer_memory_stays_bounded(tmp_path: Path) -> None:
    """Writing more data than the process may allocate streams it: RLIMIT_DATA at current + 48 MB, 200 MB written."""
    _run_limited("write", 48 << 20, 192 << 20, tmp_path / "w")
    assert RaggedArray(tmp_path / "w").nbytes > 192 << 20
    shutil.rmtree(tmp_path / "w")  # 200 MB of real data: do not leave it in pytest's kept directories
