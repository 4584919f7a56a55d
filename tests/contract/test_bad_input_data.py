"""The bad-input table, second half: pad_collate, the ragged store, seeds, set_epoch and states.

Rows as in tests/contract/test_bad_input_table.py (which checks that both halves together cover every public name).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardwise import (
    MalformedStateError,
    PadCollate,
    RaggedArray,
    RaggedStoreError,
    RaggedWriter,
    ShardedSampler,
    column,
    pad_collate,
    seed_worker,
    set_epoch,
    worker_seed,
)

Call = Callable[[Path], object]
RAGGED = [[0, 1], [2]]  # nested lists of unequal lengths: numpy cannot make an array of them

def _store(tmp: Path) -> RaggedArray:
    return RaggedArray.write(tmp / "store", [np.zeros((2, 3), np.float32), np.ones((1, 3), np.float32)])


def _writer(tmp: Path) -> RaggedWriter:
    writer = RaggedWriter(tmp / "w", dtype=np.float32, feature_shape=(2,))
    writer.append(np.zeros((1, 2), np.float32))
    return writer


def _closed_writer(tmp: Path) -> RaggedWriter:
    writer = _writer(tmp)
    writer.close()
    return writer


def _file(tmp: Path) -> Path:
    (tmp / "file").write_text("x")
    return tmp / "file"


def _state(**changes: object) -> dict[str, Any]:
    return {**ShardedSampler(10).state_dict(), **changes}


def _pad(batch: Any = None, **kwargs: Any) -> Call:
    batch = [np.zeros((1, 2)), np.zeros((3, 2))] if batch is None else batch
    return lambda tmp: pad_collate(batch, **kwargs)


def _ints(dtype: Any) -> list[np.ndarray]:
    return [np.zeros((1, 2), dtype), np.zeros((2, 2), dtype)]


def _ragged_writer(**kwargs: Any) -> Call:
    return lambda tmp: RaggedWriter(kwargs.pop("path", tmp / "w"), **kwargs)


def _append(sample: Any) -> Call:
    return lambda tmp: _writer(tmp).append(sample)


V, T = ValueError, TypeError
ROWS: list[tuple[str, Call, type[BaseException], tuple[str, ...]]] = [
    # -- pad_collate / PadCollate -----------------------------------------------------------------
    ("pad-batch-empty", _pad([]), V, ("batch",)),
    ("pad-batch-int", _pad(0), T, ("batch", "0")),
    ("pad-batch-none", lambda tmp: pad_collate(None), T, ("batch", "None")),  # type: ignore[arg-type]
    ("pad-batch-of-lists", _pad([[1, 2], [3]]), T, ("batch", "list")),
    ("pad-batch-scalar", _pad([np.zeros((1, 2)), np.array(1.0)]), V, ("batch",)),
    ("pad-batch-dtypes-differ", _pad([np.zeros((1, 2)), np.zeros((1, 2), np.float32)]), T, ("batch", "float32")),
    ("pad-batch-shapes-differ", _pad([np.zeros((1, 2)), np.zeros((1, 3))]), V, ("batch", "(3,)")),
    ("pad-batch-strings", _pad([np.array(["a", "b"]), np.array(["c"])]), T, ("batch", "<U1")),
    ("pad-batch-objects", _pad([np.array([1, None]), np.array([2])]), T, ("batch", "object")),
    ("pad-value-str", _pad(padding_value="0"), T, ("padding_value", "'0'")),
    ("pad-value-none", _pad(padding_value=None), T, ("padding_value", "None")),
    ("pad-value-list", _pad(padding_value=[0]), T, ("padding_value", "[0]")),
    ("pad-value-nan-int", _pad(_ints(np.int64), padding_value=math.nan), V, ("padding_value", "nan", "int64")),
    ("pad-value-1000-int8", _pad(_ints(np.int8), padding_value=1000), V, ("padding_value", "1000", "int8")),
    ("pad-value-minus-1-uint8", _pad(_ints(np.uint8), padding_value=-1), V, ("padding_value", "-1", "uint8")),
    ("pad-value-half-int32", _pad(_ints(np.int32), padding_value=0.5), V, ("padding_value", "0.5", "int32")),
    ("pad-value-inf-int", _pad(_ints(np.int16), padding_value=math.inf), V, ("padding_value", "inf", "int16")),
    ("pad-value-2-bool", _pad(_ints(np.bool_), padding_value=2), V, ("padding_value", "2", "bool")),
    ("pad-value-bool-on-float", _pad(padding_value=True), T, ("padding_value", "True")),
    ("pad-value-complex-on-float", _pad(padding_value=1j), V, ("padding_value", "1j")),
    ("pad-value-overflows-float16", _pad(_ints(np.float16), padding_value=1e6), V, ("padding_value", "float16")),
    ("pad-value-2**64-int64", _pad(_ints(np.int64), padding_value=2**64), V, ("padding_value", "int64")),
    ("pad-multiple-zero", _pad(pad_to_multiple_of=0), V, ("pad_to_multiple_of", "0")),
    ("pad-multiple-bool", _pad(pad_to_multiple_of=True), T, ("pad_to_multiple_of", "True")),
    ("pad-multiple-float", _pad(pad_to_multiple_of=2.0), T, ("pad_to_multiple_of", "2.0")),
    ("pad-value-1e39-bfloat16", _pad([torch.zeros(2, dtype=torch.bfloat16)], padding_value=1e39), V, ("padding_value", "bfloat16")),
    ("pad-tensors-minus-1-uint8", _pad([torch.zeros(2, dtype=torch.uint8)], padding_value=-1), V, ("padding_value", "uint8")),
    ("collate-class-value-str", lambda tmp: PadCollate(padding_value="x"), T, ("padding_value", "'x'")),  # type: ignore[arg-type]
    ("collate-class-value-bool-on-int", lambda tmp: PadCollate(padding_value=False)(_ints(np.int32)), T, ("padding_value", "False")),
    ("collate-class-multiple-negative", lambda tmp: PadCollate(pad_to_multiple_of=-2), V, ("pad_to_multiple_of", "-2")),
    ("collate-class-value-1000-int8", lambda tmp: PadCollate(padding_value=1000)(_ints(np.int8)), V, ("padding_value", "int8")),
    # -- RaggedWriter -----------------------------------------------------------------------------
    ("writer-path-none", _ragged_writer(path=None), T, ("path", "None")),
    ("writer-path-int", _ragged_writer(path=0), T, ("path", "0")),
    ("writer-path-list", _ragged_writer(path=["a"]), T, ("path", "['a']")),
    ("writer-path-no-parent", lambda tmp: RaggedWriter(tmp / "missing" / "store"), FileNotFoundError, ("path", "missing")),
    ("writer-path-exists", RaggedWriter, FileExistsError, ("overwrite",)),
    ("writer-path-not-a-store", lambda tmp: RaggedWriter(_file(tmp), overwrite=True), FileExistsError, ("overwrite",)),
    ("writer-dtype-str", _ragged_writer(dtype="U5"), T, ("dtype", "'U5'")),
    ("writer-dtype-object", _ragged_writer(dtype=object), T, ("dtype", "object")),
    ("writer-dtype-big-endian", _ragged_writer(dtype=">f4"), T, ("dtype", ">f4")),
    ("writer-dtype-unknown", _ragged_writer(dtype="nope"), T, ("dtype", "'nope'")),
    ("writer-feature-shape-negative", _ragged_writer(feature_shape=[-1]), T, ("feature_shape", "-1")),
    ("writer-feature-shape-int", _ragged_writer(feature_shape=3), T, ("feature_shape", "3")),
    ("writer-feature-shape-float", _ragged_writer(feature_shape=[1.5]), T, ("feature_shape", "1.5")),
    ("writer-feature-shape-bool", _ragged_writer(feature_shape=[True]), T, ("feature_shape", "True")),
    ("writer-overwrite-int", _ragged_writer(overwrite=1), T, ("overwrite", "1")),
    ("writer-overwrite-none", _ragged_writer(overwrite=None), T, ("overwrite", "None")),
    ("writer-append-ragged-sample", _append([[1.0, 2.0], [3.0]]), T, ("sample",)),
    ("writer-append-scalar", _append(np.float32(1)), V, ("sample",)),
    ("writer-append-dtype-differs", _append(np.zeros((1, 2))), T, ("sample", "float64", "float32")),
    ("writer-append-shape-differs", _append(np.zeros((1, 3), np.float32)), V, ("sample", "(3,)")),
    ("writer-append-strings", lambda tmp: RaggedWriter(tmp / "w").append(np.array(["a"])), T, ("sample", "<U1")),
    ("writer-append-none", _append(None), T, ("sample", "None")),
    ("writer-append-meta-tensor", _append(torch.zeros(1, 2, device="meta")), T, ("sample", "meta")),
    ("writer-append-after-close", lambda tmp: _closed_writer(tmp).append(np.zeros((1, 2), np.float32)), V, ("closed",)),
    ("writer-extend-progress-int", lambda tmp: _writer(tmp).extend([], progress=1), T, ("progress", "1")),
    ("writer-extend-none", lambda tmp: _writer(tmp).extend(None), T, ("samples", "None")),  # type: ignore[arg-type]
    # -- RaggedArray ------------------------------------------------------------------------------
    ("array-path-none", lambda tmp: RaggedArray(None), T, ("path", "None")),  # type: ignore[arg-type]
    ("array-path-int", lambda tmp: RaggedArray(5), T, ("path", "5")),  # type: ignore[arg-type]
    ("array-path-missing", lambda tmp: RaggedArray(tmp / "nothing"), FileNotFoundError, ("path", "nothing")),
    ("array-path-file", lambda tmp: RaggedArray(_file(tmp)), NotADirectoryError, ("path", "file")),
    ("array-path-no-manifest", RaggedArray, RaggedStoreError, ("manifest.json",)),
    ("array-dtype-str", lambda tmp: RaggedArray(_store(tmp).path, dtype="U3"), T, ("dtype", "'U3'")),
    ("array-dtype-other", lambda tmp: RaggedArray(_store(tmp).path, dtype=np.int8), RaggedStoreError, ("dtype", "int8")),
    ("array-feature-shape-str", lambda tmp: RaggedArray(_store(tmp).path, feature_shape="x"), T, ("feature_shape", "'x'")),  # type: ignore[arg-type]
    ("array-feature-shape-other", lambda tmp: RaggedArray(_store(tmp).path, feature_shape=(4,)), RaggedStoreError, ("feature_shape", "(4,)")),
    ("array-index-str", lambda tmp: _store(tmp)["a"], T, ("index", "'a'")),  # type: ignore[index]
    ("array-index-float", lambda tmp: _store(tmp)[1.0], T, ("index", "1.0")),  # type: ignore[index]
    ("array-index-past-end", lambda tmp: _store(tmp)[5], IndexError, ("index", "5")),
    ("array-index-negative", lambda tmp: _store(tmp).tensor(-1), IndexError, ("index", "-1")),
    ("array-indices-ragged", lambda tmp: _store(tmp).__getitems__(RAGGED), T, ("indices",)),
    ("array-indices-float", lambda tmp: _store(tmp).__getitems__([0.5]), T, ("indices", "0.5")),
    ("array-indices-2d", lambda tmp: _store(tmp).__getitems__([[0]]), T, ("indices", "[[0]]")),
    ("array-index-numpy-bool", lambda tmp: _store(tmp)[np.True_], T, ("index", "True")),
    ("array-indices-past-end", lambda tmp: _store(tmp).tensors([0, 9]), IndexError, ("index", "9")),
    ("array-write-samples-none", lambda tmp: RaggedArray.write(tmp / "s", None), T, ("samples", "None")),  # type: ignore[arg-type]
    ("array-write-progress-str", lambda tmp: RaggedArray.write(tmp / "s", [], progress="y"), T, ("progress", "'y'")),
    ("array-write-path-none", lambda tmp: RaggedArray.write(None, []), T, ("path", "None")),  # type: ignore[arg-type]
    # -- set_epoch, seeds, state ------------------------------------------------------------------
    ("set-epoch-negative", lambda tmp: set_epoch(ShardedSampler(10), -1), V, ("epoch", "-1")),
    ("set-epoch-bool", lambda tmp: set_epoch(ShardedSampler(10), True), T, ("epoch", "True")),
    ("set-epoch-float", lambda tmp: set_epoch(ShardedSampler(10), 1.5), T, ("epoch", "1.5")),
    ("sampler-set-epoch-str", lambda tmp: ShardedSampler(10).set_epoch("1"), T, ("epoch", "'1'")),  # type: ignore[arg-type]
    ("worker-seed-none", lambda tmp: worker_seed(None), T, ("seed", "None")),  # type: ignore[arg-type]
    ("worker-seed-negative", lambda tmp: worker_seed(-1), V, ("seed", "-1")),
    ("worker-seed-float", lambda tmp: worker_seed(1.5), T, ("seed", "1.5")),  # type: ignore[arg-type]
    ("worker-seed-2**64", lambda tmp: worker_seed(2**64), V, ("seed", str(2**64))),
    ("worker-seed-rank-negative", lambda tmp: worker_seed(1, rank=-1), V, ("rank", "-1")),
    ("worker-seed-rank-bool", lambda tmp: worker_seed(1, rank=True), T, ("rank", "True")),
    ("worker-seed-worker-negative", lambda tmp: worker_seed(1, worker_id=-1), V, ("worker_id", "-1")),
    ("worker-seed-worker-str", lambda tmp: worker_seed(1, worker_id="0"), T, ("worker_id", "'0'")),  # type: ignore[arg-type]
    ("worker-seed-epoch-negative", lambda tmp: worker_seed(1, epoch=-1), V, ("epoch", "-1")),
    ("worker-seed-epoch-none", lambda tmp: worker_seed(1, epoch=None), T, ("epoch", "None")),  # type: ignore[arg-type]
    ("seed-worker-id-negative", lambda tmp: seed_worker(-1), V, ("worker_id", "-1")),
    ("seed-worker-id-str", lambda tmp: seed_worker("0"), T, ("worker_id", "'0'")),  # type: ignore[arg-type]
    ("seed-worker-id-bool", lambda tmp: seed_worker(True), T, ("worker_id", "True")),
    ("seed-worker-seed-negative", lambda tmp: seed_worker(0, seed=-1), V, ("seed", "-1")),
    ("seed-worker-seed-str", lambda tmp: seed_worker(0, seed="x"), T, ("seed", "'x'")),  # type: ignore[arg-type]
    ("state-none", lambda tmp: ShardedSampler(10).load_state_dict(None), MalformedStateError, ("state",)),  # type: ignore[arg-type]
    ("state-consumed-negative", lambda tmp: ShardedSampler(10).load_state_dict(_state(consumed=-1)), MalformedStateError, ("consumed",)),
    ("state-epoch-str", lambda tmp: ShardedSampler(10).load_state_dict(_state(epoch="1")), MalformedStateError, ("epoch",)),
    ("state-epoch-bool", lambda tmp: ShardedSampler(10).load_state_dict(_state(epoch=True)), MalformedStateError, ("epoch",)),
    # -- column (Arrow inputs; the source rows need pyarrow, installed with the dev extra) ----------
    ("column-kind-bad", lambda tmp: column([1], "x", kind="rows"), V, ("kind", "'rows'", "'length'")),
    ("column-name-int", lambda tmp: column([1], 3), T, ("name", "3")),  # type: ignore[arg-type]
    ("column-source-int", lambda tmp: column(5, "x"), T, ("source", "int")),
    ("column-parquet-missing", lambda tmp: column(tmp / "none.parquet", "x"), V, ("source", "none.parquet")),
]


def check_row(tmp_path: Path, call: Call, error: type, names: tuple[str, ...]) -> None:
    """``call(tmp_path)`` raises ``error`` whose message names every string of ``names`` (the parameter, the value)."""
    with pytest.raises(error) as caught:
        call(tmp_path)
    message = str(caught.value)
    for name in names:
        assert name in message, f"{name!r} not in {message!r}"
    assert "inhomogeneous" not in message


@pytest.mark.parametrize(("call", "error", "names"), [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_bad_input_raises_naming_the_parameter(tmp_path: Path, call: Call, error: type, names: tuple[str, ...]) -> None:
    """The call raises the expected exception type, and its message names the parameter (and value)."""
    check_row(tmp_path, call, error, names)
