"""Arrow inputs: HF Datasets, pyarrow arrays and Parquet files give the lengths, labels and weights of the slow path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="the Arrow inputs need pyarrow (pip install 'shardwise[arrow]')")
pq = pytest.importorskip("pyarrow.parquet", reason="the Parquet inputs need pyarrow.parquet")
datasets = pytest.importorskip("datasets", reason="the HF Dataset inputs need datasets (the dev extra)")

import shardwise  # noqa: E402  (after the skips)
from shardwise.index.arrow import ARROW_KIND  # noqa: E402

datasets.disable_progress_bar()
N = 1000


def _records(n: int = N, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, size=n)
    return {
        "input_ids": [rng.integers(1, 100, size=k).tolist() for k in lengths],
        "label": rng.integers(0, 5, size=n).tolist(),
        "weight": rng.random(n).tolist(),
        "text": ["é" * int(k % 7) + "x" * int(k % 3) for k in lengths],
    }


def _slow(dataset: Any, name: str, kind: str) -> list[Any]:
    """What integrations/transformers.py did before: one Python access per row."""
    rows = [dataset[i][name] for i in range(len(dataset))]
    if kind == "length":
        return [len(row.encode()) if isinstance(row, str) else len(row) for row in rows]
    return [row.item() if hasattr(row, "item") else row for row in rows]


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Dataset saved as 3 Arrow files and loaded memory-mapped."""
    folder = tmp_path_factory.mktemp("hf") / "data"
    datasets.Dataset.from_dict(_records()).save_to_disk(str(folder), num_shards=3)
    return datasets.load_from_disk(str(folder))


def _check(dataset: Any, cache: Path) -> None:
    for name, kind in (("input_ids", "length"), ("text", "length"), ("label", "values"), ("weight", "values")):
        got = shardwise.column(dataset, name, kind=kind, cache_dir=cache)
        assert got.ndim == 1 and not got.flags.writeable
        assert got.tolist() == pytest.approx(_slow(dataset, name, kind)), (name, kind)


def test_memory_mapped_dataset_of_several_arrow_files_equals_the_slow_path(on_disk: Any, tmp_path: Path) -> None:
    """load_from_disk over 3 Arrow files: lengths (lists, strings in bytes), labels and weights equal per-row reads."""
    assert len(on_disk.cache_files) == 3 and on_disk.data.table.column("input_ids").num_chunks == 3
    _check(on_disk, tmp_path)
    lengths = shardwise.column(on_disk, "input_ids", kind="length", cache_dir=tmp_path)
    assert isinstance(lengths, np.memmap) and lengths.dtype == np.int32  # mapped from the node's cache
    assert len(list(tmp_path.glob(f"{ARROW_KIND}-*"))) == 4  # one entry a column and kind


def test_select_shuffle_and_torch_format_follow_the_logical_rows(on_disk: Any, tmp_path: Path) -> None:
    """An indices mapping (select, shuffle, a split) and a with_format('torch') view give the rows they show."""
    shuffled = on_disk.shuffle(seed=3)
    picked = on_disk.select([5, 3, 999, 3, 0])
    split = on_disk.train_test_split(test_size=0.25, seed=1)["test"]
    torch_view = shuffled.with_format("torch")
    for view in (shuffled, picked, split, torch_view):
        _check(view, tmp_path)
    assert shuffled._indices is not None and torch_view._indices is not None


def test_in_memory_dataset_and_a_mixture_of_datasets(tmp_path: Path) -> None:
    """An in-memory Dataset is read in this process; a Mixture of Datasets gives their columns concatenated."""
    small = datasets.Dataset.from_dict(_records(50, seed=1))
    got = shardwise.column(small, "input_ids", kind="length", cache_dir=tmp_path)
    assert not isinstance(got, np.memmap) and got.tolist() == _slow(small, "input_ids", "length")
    other = datasets.Dataset.from_dict(_records(30, seed=2)).shuffle(seed=0)
    mixture = shardwise.Mixture({"a": small, "b": other})
    both = shardwise.column(mixture, "input_ids", kind="length", cache_dir=tmp_path)
    assert both.tolist() == _slow(small, "input_ids", "length") + _slow(other, "input_ids", "length")


def test_other_ranks_open_the_cached_column_instead_of_recomputing(on_disk: Any, tmp_path: Path) -> None:
    """Two ranks starting at once share one cache entry; a later process maps the same file, not rebuilt."""
    code = (
        "import sys, datasets, shardwise; d = datasets.load_from_disk(sys.argv[1]); "
        "a = shardwise.column(d, 'input_ids', kind='length', cache_dir=sys.argv[2]); print(a.filename, int(a.sum()))"
    )
    folder = str(Path(on_disk.cache_files[0]["filename"]).parent)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    ranks = [subprocess.Popen([sys.executable, "-c", code, folder, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]  # fmt: skip
    outputs = []
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, err[-2000:]
        outputs.append(out.split())
    expected = str(sum(_slow(on_disk, "input_ids", "length")))
    assert outputs[0] == outputs[1] and outputs[0][1] == expected
    path = Path(outputs[0][0])
    built = path.stat().st_mtime_ns
    later = shardwise.column(on_disk, "input_ids", kind="length", cache_dir=tmp_path)
    assert Path(str(later.filename)) == path and path.stat().st_mtime_ns == built
    assert len(list(tmp_path.glob(f"{ARROW_KIND}-*"))) == 1


def test_rewritten_files_are_a_new_cache_entry(tmp_path: Path) -> None:
    """The key follows the files' identity: a dataset saved again with other rows is computed again."""
    folder = tmp_path / "data"
    datasets.Dataset.from_dict(_records(40, seed=1)).save_to_disk(str(folder))
    before = shardwise.column(datasets.load_from_disk(str(folder)), "input_ids", kind="length", cache_dir=tmp_path)
    datasets.Dataset.from_dict(_records(40, seed=2)).save_to_disk(str(folder))
    again = datasets.load_from_disk(str(folder))
    after = shardwise.column(again, "input_ids", kind="length", cache_dir=tmp_path)
    assert after.tolist() == _slow(again, "input_ids", "length") and after.tolist() != before.tolist()


def test_parquet_files_row_groups_and_pyarrow_objects(tmp_path: Path) -> None:
    """Parquet (several files and row groups), a Table, Array and ChunkedArray give what pyarrow's Python rows give."""
    table = pa.table(_records(300))
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    pq.write_table(table.slice(0, 200), paths[0], row_group_size=64)
    pq.write_table(table.slice(200), paths[1], row_group_size=64)
    lists = table.column("input_ids").to_pylist()
    expected = {"input_ids": [len(x) for x in lists], "label": table.column("label").to_pylist()}
    for name, kind in (("input_ids", "length"), ("label", "values")):
        got = shardwise.column(paths, name, kind=kind, cache_dir=tmp_path / "cache")
        assert isinstance(got, np.memmap) and got.tolist() == expected[name]
        assert shardwise.column(table, name, kind=kind).tolist() == expected[name]
    assert shardwise.column(str(paths[0]), "input_ids", kind="length").tolist() == expected["input_ids"][:200]
    chunked = pa.chunked_array([pa.array(lists[:100]), pa.array(lists[100:])])
    assert shardwise.column(chunked, kind="length").tolist() == expected["input_ids"]
    large = pa.array(lists, type=pa.large_list(pa.int64()))
    assert shardwise.column(large, kind="length").dtype == np.int64
    fixed = pa.array([[1, 2, 3]] * 4, type=pa.list_(pa.int8(), 3))
    assert shardwise.column(fixed, kind="length").tolist() == [3] * 4
    weights = pa.array(np.linspace(0, 1, 50))
    view = shardwise.column(weights)  # numeric, one chunk, no nulls: a view of the Arrow buffer, no copy
    assert view.ctypes.data == weights.buffers()[1].address and not view.flags.writeable
    assert view.tolist() == weights.to_pylist()
    text = pa.array(["", "ab", "é"], type=pa.large_string())
    assert shardwise.column(text, kind="length").tolist() == [0, 2, 2]  # bytes


def test_samplers_take_pyarrow_arrays_directly(on_disk: Any) -> None:
    """BucketBatchSampler, PackedBatchSampler, ClassBalancedBatchSampler and WeightedSampler read Arrow columns."""
    table = on_disk.data.table
    lengths = np.array(_slow(on_disk, "input_ids", "length"))
    bucket = shardwise.BucketBatchSampler(table.column("input_ids"), batch_size=8, num_replicas=1, rank=0)
    assert bucket.lengths.tolist() == lengths.tolist()
    packed = shardwise.PackedBatchSampler(table.column("input_ids"), max_len=64, rows_per_batch=2,
                                          num_replicas=1, rank=0)  # fmt: skip
    pieces = [piece for batch in packed for piece in batch]
    assert np.bincount([int(p) for p in pieces], weights=[p.stop - p.start for p in pieces], minlength=N).tolist() == (
        lengths.tolist()
    )  # every token of every sample packed once, as its Arrow length says
    classes = shardwise.ClassBalancedBatchSampler(table.column("label"), classes_per_batch=2, samples_per_class=2,
                                                  num_replicas=1, rank=0)  # fmt: skip
    labels = np.array(_slow(on_disk, "label", "values"))
    for batch in list(classes)[:5]:
        assert len(set(labels[batch].tolist())) == 2
    weights = pa.array([0.0] * 10 + [1.0] * 10)
    drawn = list(shardwise.WeightedSampler(weights, num_samples=50, num_replicas=1, rank=0))
    assert len(drawn) == 50 and min(drawn) >= 10


def test_arrow_forms_of_lengths_are_one_input_and_one_plan(on_disk: Any, tmp_path: Path) -> None:
    """A pyarrow column, a ChunkedArray, dataset['input_ids'] and a Parquet column resolve to the numpy lengths' plan."""
    from shardwise.index.lengths import LengthsInput

    table = on_disk.data.table
    lengths = np.array(_slow(on_disk, "input_ids", "length"))
    path = tmp_path / "ids.parquet"
    pq.write_table(table.select(["input_ids"]), path, row_group_size=300)
    forms = {
        "pyarrow": table.column("input_ids").combine_chunks(),
        "chunked": table.column("input_ids"),
        "dataset column": on_disk["input_ids"],
        "parquet": shardwise.column(path, "input_ids", kind="length", cache_dir=tmp_path / "cache"),
    }

    def plan(values: Any) -> tuple[list[list[int]], dict[str, Any]]:
        sampler = shardwise.BucketBatchSampler(values, max_tokens=96, seed=1, num_replicas=2, rank=0,
                                               cache_dir=tmp_path / "cache")  # fmt: skip
        return list(sampler), sampler.state_dict()

    expected = plan(lengths)
    assert expected[0]
    for name, form in forms.items():
        resolved = LengthsInput.of(form)
        assert resolved.read(0, len(resolved)).tolist() == lengths.tolist(), name
        assert plan(form) == expected, name
    with pytest.raises(TypeError, match=r"lengths should be an array, but got a datasets.Dataset.*shardwise.column"):
        LengthsInput.of(on_disk)


def test_a_dataset_column_object_is_read_from_arrow(on_disk: Any, tmp_path: Path) -> None:
    """dataset['input_ids'] / dataset['label'] (lazy Column objects) are read from Arrow, by column and by samplers."""
    shuffled = on_disk.shuffle(seed=2)
    lengths = shardwise.column(shuffled["input_ids"], kind="length", cache_dir=tmp_path)
    assert isinstance(lengths, np.memmap) and lengths.tolist() == _slow(shuffled, "input_ids", "length")
    bucket = shardwise.BucketBatchSampler(shuffled["input_ids"], batch_size=8, num_replicas=1, rank=0)
    assert isinstance(bucket.lengths, np.memmap) and bucket.lengths.tolist() == lengths.tolist()
    classes = shardwise.ClassBalancedBatchSampler(shuffled["label"], classes_per_batch=2, samples_per_class=2,
                                                  num_replicas=1, rank=0)  # fmt: skip
    labels = np.array(_slow(shuffled, "label", "values"))
    assert all(len(set(labels[batch].tolist())) == 2 for batch in list(classes)[:5])


def test_bad_columns_name_the_fix(on_disk: Any, tmp_path: Path) -> None:
    """Missing columns, nulls, wrong types, a whole Dataset or a DatasetDict: clear errors that say what to do."""
    with pytest.raises(ValueError, match=r"column 'length' is not in the dataset.*dataset.map\(lambda b"):
        shardwise.column(on_disk, "length", kind="values", cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"row 1 is null"):
        shardwise.column(pa.array([[1], None, [2]]), kind="length")
    with pytest.raises(TypeError, match=r"kind='length' reads list, string or binary columns.*kind='values'"):
        shardwise.column(on_disk, "label", kind="length", cache_dir=tmp_path)
    with pytest.raises(TypeError, match=r"class_encode_column"):
        shardwise.column(on_disk, "text", kind="values", cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"kind should be one of 'length', 'values', but got kind='rows'"):
        shardwise.column(on_disk, "input_ids", kind="rows")
    with pytest.raises(TypeError, match=r"lengths should be an array, but got a datasets.Dataset.*shardwise.column"):
        shardwise.BucketBatchSampler(on_disk, batch_size=4)
    with pytest.raises(TypeError, match=r"pick a split: dataset\['train'\]"):
        shardwise.column(datasets.DatasetDict({"train": on_disk}), "input_ids")
    with pytest.raises(TypeError, match=r"name should be the column to read"):
        shardwise.column(on_disk)


def test_trainer_default_sampler_reads_the_arrow_column(on_disk: Any) -> None:
    """group_by_length over an HF Dataset: lengths from the Arrow column (or the length column); a clear fix if neither."""
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    from shardwise.integrations.transformers import default_train_sampler

    args = TrainingArguments("unused", train_sampling_strategy="group_by_length", per_device_train_batch_size=4,
                             report_to="none", use_cpu=True)  # fmt: skip
    shuffled = on_disk.shuffle(seed=5)
    sampler = default_train_sampler(shuffled, args)
    assert isinstance(sampler, shardwise.BucketBatchSampler)
    assert isinstance(sampler.lengths, np.memmap) and sampler.lengths.tolist() == _slow(shuffled, "input_ids", "length")
    with_length = shuffled.add_column("length", [40 - x for x in _slow(shuffled, "input_ids", "length")])
    assert default_train_sampler(with_length, args).lengths.tolist() == _slow(with_length, "length", "values")
    mixture = shardwise.Mixture([on_disk, shuffled])
    expected = _slow(on_disk, "input_ids", "length") + _slow(shuffled, "input_ids", "length")
    assert default_train_sampler(mixture, args).lengths.tolist() == expected
    with pytest.raises(ValueError, match=r"columns \['label', 'weight'\]; add a length column: dataset = dataset.map"):
        default_train_sampler(on_disk.select_columns(["label", "weight"]), args)


def test_trainer_group_by_length_run_over_an_hf_dataset(on_disk: Any, tmp_path: Path) -> None:
    """A real ShardwiseTrainer run (tiny GPT-2) over a memory-mapped Dataset trains the BucketBatchSampler's batches."""
    pytest.importorskip("transformers")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardwise.integrations.transformers import ShardwiseTrainer, default_train_sampler

    data = on_disk.select(range(64)).filter(lambda row: len(row["input_ids"]) > 0).select_columns(["input_ids"])

    def collate(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.zeros(len(features), longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, feature in enumerate(features):
            ids[row, : len(feature["input_ids"])] = torch.as_tensor(feature["input_ids"])
            mask[row, : len(feature["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    trained: list[list[int]] = []

    class Recording(ShardwiseTrainer):  # type: ignore[misc]
        def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            trained.append(sorted(inputs["attention_mask"].sum(1).tolist()))
            return super().training_step(model, inputs, *args, **kwargs)

    args = TrainingArguments(str(tmp_path / "out"), train_sampling_strategy="group_by_length", per_device_train_batch_size=4,
                             num_train_epochs=1, seed=7, use_cpu=True, report_to="none", disable_tqdm=True,
                             save_strategy="no", logging_strategy="no")  # fmt: skip
    config = GPT2Config(vocab_size=128, n_positions=64, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    trainer = Recording(model=GPT2LMHeadModel(config), args=args, train_dataset=data, data_collator=collate)
    trainer.train()
    sampler = trainer.train_sampler
    assert isinstance(sampler, shardwise.BucketBatchSampler) and isinstance(sampler.lengths, np.memmap)
    lengths = np.array(_slow(data, "input_ids", "length"))
    assert sampler.lengths.tolist() == lengths.tolist()
    plan = default_train_sampler(data, args)
    plan.set_epoch(0)
    assert trained == [sorted(lengths[batch].tolist()) for batch in plan]
