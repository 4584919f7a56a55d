"""Which shardwise sampler ``ShardwiseTrainer`` picks from the ``TrainingArguments``, and the lengths it reads.

Needs no transformers import: it reads the arguments' attributes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..index.arrow import column, hf_dataset
from ..samplers.base import PlanSampler
from ..samplers.bucket import BucketBatchSampler
from ..samplers.sharded import ShardedSampler

_STRATEGIES = ("random", "sequential", "group_by_length")


def _arrow_parts(dataset: Any) -> list[Any]:
    """The HF Datasets ``dataset`` is made of (itself, or a ``shardwise.Mixture`` of them); [] if not Arrow."""
    if hf_dataset(dataset):
        return [dataset]
    parts = getattr(dataset, "datasets", None)
    if isinstance(parts, Sequence) and parts and all(hf_dataset(part) for part in parts):
        return list(parts)
    return []


def _lengths(dataset: Any, args: Any, model_input_name: str) -> Any:
    """Sample lengths for ``group_by_length``: from the Arrow column of an HF Dataset, else one pass as ``Trainer``.

    An HF ``datasets.Dataset`` (or a ``shardwise.Mixture`` of them) is read with
    :func:`shardwise.column`: its ``length_column_name`` column, else the row lengths of its
    ``model_input_name`` column from the Arrow offsets (one vectorised pass, cached per node:
    seconds at 1e7 rows, milliseconds on the other ranks), never a Python loop per row.
    """
    column_name = getattr(args, "length_column_name", "length")
    parts = _arrow_parts(dataset)
    if parts:
        shared = set.intersection(*(set(part.column_names) for part in parts))
        if column_name in shared:
            return column(dataset, column_name, kind="values")
        if model_input_name in shared:
            return column(dataset, model_input_name, kind="length")
        raise ValueError(
            f"train_sampling_strategy='group_by_length' reads each sample's length from the dataset's "
            f"{column_name!r} column, else from its {model_input_name!r} column, but the dataset has columns "
            f"{sorted(shared)}; add a length column: dataset = dataset.map(lambda b: {{{column_name!r}: "
            f"[len(x) for x in b['<token column>']]}}, batched=True) (or with Arrow: dataset.add_column("
            f"{column_name!r}, pyarrow.compute.list_value_length(dataset.data.column('<token column>')).to_numpy())), "
            "or pass ShardwiseTrainer(train_sampler=...)"
        )
    names = getattr(dataset, "column_names", None)
    if names is not None and column_name in names:
        return [int(length) for length in dataset[column_name]]
    first = dataset[0]
    if not isinstance(first, dict) and not hasattr(first, "keys"):
        raise TypeError(
            "train_sampling_strategy='group_by_length' needs each sample to be a dict with a "
            f"{model_input_name!r} key, or a {column_name!r} column, but the first sample is a {type(first).__name__}; "
            "pass ShardwiseTrainer(train_sampler=shardwise.BucketBatchSampler(lengths, batch_size=...)) instead"
        )
    if model_input_name not in first:
        raise ValueError(
            f"train_sampling_strategy='group_by_length' reads lengths from each sample's {model_input_name!r}, "
            f"but the first sample has keys {sorted(first.keys())}; add a {column_name!r} column or pass train_sampler="
        )
    return [len(dataset[i][model_input_name]) for i in range(len(dataset))]


def default_train_sampler(dataset: Any, args: Any, *, model_input_name: str = "input_ids") -> PlanSampler[Any]:
    """The shardwise sampler for ``args.train_sampling_strategy`` (what ``Trainer`` would pick).

    Args:
        dataset: the map-style training dataset.
        args: the ``TrainingArguments``; reads ``train_sampling_strategy``, ``data_seed``/``seed``,
            ``per_device_train_batch_size``, ``dataloader_drop_last`` and ``length_column_name``.
        model_input_name: the key whose length is a sample's length (``group_by_length`` only).

    Returns:
        ``"random"``: ``ShardedSampler(dataset)``; ``"sequential"``: the same with ``shuffle=False``;
        ``"group_by_length"``: ``BucketBatchSampler(lengths, batch_size=per_device_train_batch_size,
        longest_first=True)``, whose batches hold similar lengths across the whole epoch (least
        padding), new batches in a new order every epoch and seed, the longest batch first (as HF's
        ``LengthGroupedSampler``: running out of memory shows at the first step).

    Raises:
        ValueError: another strategy (``"batch_rebalance"``): pass ``train_sampler=`` instead.
    """
    strategy = str(getattr(args, "train_sampling_strategy", "random"))
    if getattr(args, "group_by_length", False) is True:  # the flag of transformers < 5
        strategy = "group_by_length"
    seed = args.data_seed if getattr(args, "data_seed", None) is not None else args.seed
    drop_last = bool(args.dataloader_drop_last)
    if strategy == "group_by_length":
        lengths = _lengths(dataset, args, model_input_name)
        return BucketBatchSampler(
            lengths, batch_size=args.per_device_train_batch_size, seed=seed, drop_last=drop_last, longest_first=True
        )
    if strategy in ("random", "sequential"):
        return ShardedSampler(dataset, shuffle=strategy == "random", seed=seed, drop_last=drop_last)
    raise ValueError(
        f"train_sampling_strategy should be one of {', '.join(map(repr, _STRATEGIES))} for a shardwise default, "
        f"but got train_sampling_strategy={strategy!r}; pass ShardwiseTrainer(train_sampler=...) instead"
    )
