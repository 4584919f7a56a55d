"""pad_collate and PadCollate: padding, lengths, masks, dtypes, workers, and refusing bad batches."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardwise import PadCollate, PaddedBatch, RaggedArray, pad_collate


def _ragged(rows: list[int], features: tuple[int, ...] = (2,), dtype: type = np.float32) -> list[np.ndarray]:
    return [np.arange(r * int(np.prod(features)), dtype=dtype).reshape(r, *features) + 1 for r in rows]


def test_pads_to_the_longest_with_lengths_and_mask() -> None:
    """data is (B, max_rows, *feat) with each sample first and padding after; lengths and mask say which is which."""
    batch = _ragged([3, 1, 0, 2])
    data, lengths, mask = pad_collate(batch, padding_value=-7.0)
    assert data.shape == (4, 3, 2)
    assert data.dtype == torch.float32
    assert lengths.tolist() == [3, 1, 0, 2]
    assert lengths.dtype == torch.int64
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[True, True, True], [True, False, False], [False, False, False], [True, True, False]]
    for b, sample in enumerate(batch):
        np.testing.assert_array_equal(data[b, : len(sample)].numpy(), sample)
        assert (data[b, len(sample) :] == -7.0).all()


@pytest.mark.parametrize(
    ("rows", "multiple", "expected"), [([5, 2], 4, 8), ([8, 1], 4, 8), ([0, 0], 8, 0), ([1], 1, 1)]
)
def test_pad_to_multiple_of_rounds_max_rows_up(rows: list[int], multiple: int, expected: int) -> None:
    """max_rows is rounded up to a multiple; an exact multiple, and an all-empty batch, stay as they are."""
    batch = pad_collate(_ragged(rows), pad_to_multiple_of=multiple)
    assert batch.data.shape[1] == expected
    assert batch.mask.shape == (len(rows), expected)
    assert batch.mask.sum(1).tolist() == rows


def test_tensors_and_arrays_of_any_dtype_and_row_shape() -> None:
    """Tensors, arrays and a mix pad alike; bool, int and multi-dimensional rows keep their dtype and shape."""
    arrays = _ragged([2, 4], (2, 3), np.int64)
    tensors = [torch.from_numpy(a) for a in arrays]
    for batch in (arrays, tensors, [arrays[0], tensors[1]]):
        out = pad_collate(batch)
        assert out.data.shape == (2, 4, 2, 3)
        assert out.data.dtype == torch.int64
        assert torch.equal(out.data[1], tensors[1])
        assert (out.data[0, 2:] == 0).all()
    flags = pad_collate([np.ones(3, bool), np.ones(1, bool)], padding_value=False)
    assert flags.data.tolist() == [[True, True, True], [True, False, False]]
    assert pad_collate([torch.ones(2, 1, dtype=torch.bfloat16)]).data.dtype == torch.bfloat16


def test_output_is_a_new_writable_tensor_even_from_a_read_only_store(tmp_path: Path) -> None:
    """Read-only views of a store are copied once into a fresh tensor, without torch's non-writable warning."""
    store = RaggedArray.write(tmp_path / "s", _ragged([2, 3]))
    batch = pad_collate(store.__getitems__([0, 1]))
    batch.data.add_(100)
    np.testing.assert_array_equal(store[1], _ragged([3])[0])
    tensors = pad_collate(store.tensors([1, 0]))
    assert tensors.data.data_ptr() != store.tensor(1).data_ptr()
    assert torch.equal(tensors.data[0], torch.from_numpy(_ragged([3])[0]))


def test_padded_batch_is_a_named_tuple_that_moves_and_casts() -> None:
    """PaddedBatch unpacks, names its fields, and .to(dtype) casts data but keeps lengths and mask."""
    batch = pad_collate(_ragged([1, 2]))
    assert isinstance(batch, tuple)
    assert batch._fields == ("data", "lengths", "mask")
    half = batch.to(torch.float16)
    assert isinstance(half, PaddedBatch)
    assert half.data.dtype == torch.float16
    assert (half.lengths.dtype, half.mask.dtype) == (torch.int64, torch.bool)
    assert batch.to("cpu").data.data_ptr() == batch.data.data_ptr()


def test_pad_collate_class_and_partial_pickle_for_workers() -> None:
    """PadCollate and functools.partial(pad_collate, ...) survive pickling with their options."""
    batch = _ragged([1, 3])
    for collate in (PadCollate(padding_value=9, pad_to_multiple_of=4), functools.partial(pad_collate, padding_value=9,
                    pad_to_multiple_of=4)):  # fmt: skip
        copy = pickle.loads(pickle.dumps(collate))
        out = copy(batch)
        assert out.data.shape == (2, 4, 2)
        assert out.data[0, 1:].eq(9).all()
    assert repr(PadCollate(pad_to_multiple_of=8)) == "PadCollate(padding_value=0, pad_to_multiple_of=8)"


def test_dataloader_workers_collate_like_the_main_process() -> None:
    """With two worker processes, batches equal those collated in the main process."""
    samples = _ragged([3, 0, 5, 1, 2, 7, 4])
    batches = [[0, 1, 2], [3, 4], [5, 6]]
    collate = PadCollate(padding_value=-1, pad_to_multiple_of=2)
    loader = DataLoader(samples, batch_sampler=batches, collate_fn=collate, num_workers=2)
    for got, indices in zip(loader, batches, strict=True):
        want = collate([samples[i] for i in indices])
        assert isinstance(got, PaddedBatch)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


@pytest.mark.parametrize(
    ("batch", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, r"batch should hold at least one sample, but got an empty batch"),
        ([np.zeros((1, 2)), [1, 2]], {}, TypeError, r"batch item 1 should be a numpy array or torch tensor .* a list"),
        ([np.zeros((1, 2)), np.array(1.0)], {}, ValueError, r"batch item 1 is a scalar"),
        ([np.zeros((1, 2)), np.zeros((1, 2), np.float32)], {}, TypeError,
         r"batch item 1 has dtype torch.float32, but item 0 has torch.float64"),
        ([np.zeros((1, 2)), np.zeros((1, 3))], {}, ValueError, r"batch item 1 has feature shape \(3,\), but item 0 has \(2,\)"),
        ([np.zeros((1, 2), np.int32)], {"padding_value": 0.5}, ValueError,
         r"padding_value should be a value that the batch's dtype torch.int32 can hold \(a whole number in "
         r"\[-2147483648, 2147483647\]\), but got padding_value=0.5"),
        ([np.zeros((1, 2))], {"padding_value": "0"}, TypeError, r"padding_value should be a number, but got padding_value='0'"),
        ([np.zeros((1, 2))], {"pad_to_multiple_of": 0}, ValueError, r"pad_to_multiple_of should be a positive integer"),
        ([np.zeros((1, 2))], {"pad_to_multiple_of": True}, TypeError, r"pad_to_multiple_of should be an integer"),
        ([np.zeros((1, 2))], {"pad_to_multiple_of": 2.0}, TypeError, r"pad_to_multiple_of should be an integer"),
    ],
)  # fmt: skip
def test_bad_batches_and_options_are_refused(batch: list, kwargs: dict, error: type, match: str) -> None:
    """Each bad batch or option raises naming the item or parameter and what is accepted."""
    with pytest.raises(error, match=match):
        pad_collate(batch, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pad_to_multiple_of": -2}, ValueError, r"pad_to_multiple_of should be a positive integer, but got .*=-2"),
        ({"padding_value": None}, TypeError, r"padding_value should be a number, but got padding_value=None"),
    ],
)
def test_pad_collate_class_checks_options_at_construction(kwargs: dict, error: type, match: str) -> None:
    """PadCollate refuses bad options when built, before any worker starts."""
    with pytest.raises(error, match=match):
        PadCollate(**kwargs)
