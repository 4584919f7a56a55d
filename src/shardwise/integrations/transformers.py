"""HF transformers ``Trainer`` (and TRL's trainers): train with any shardwise sampler, resume exactly.

What ``Trainer`` does with its training loader, and what this module changes:

- ``Trainer.get_train_dataloader`` builds a ``DataLoader`` with ``sampler=`` its own sampler
  (``RandomSampler``, or ``LengthGroupedSampler`` for ``train_sampling_strategy="group_by_length"``)
  and sends it through ``accelerator.prepare``, which wraps the batch sampler in Accelerate's
  ``BatchSamplerShard``: a shardwise sampler there would be dealt out twice (shardwise refuses
  that before the first step). :class:`ShardwiseTrainerMixin` builds the same loader (the
  trainer's collator with unused columns removed, ``dataloader_num_workers``, pin memory,
  persistent workers, prefetch factor, ``in_order``, the trainer's ``seed_worker``) over a
  shardwise sampler and prepares it with
  :func:`shardwise.integrations.accelerate.prepare_data_loader`: Accelerate's own
  ``DataLoaderShard`` (device placement, ``end_of_dataloader`` for gradient accumulation,
  registered with the accelerator) around the shardwise batches, sharded once, by shardwise.
- The sampler is the one you pass (``train_sampler=`` an instance, or a factory
  ``(dataset, args) -> sampler``), else :func:`default_train_sampler` from the
  ``TrainingArguments``: ``train_sampling_strategy="group_by_length"`` gives
  :class:`shardwise.BucketBatchSampler` over the dataset's lengths, ``"sequential"`` an
  unshuffled :class:`shardwise.ShardedSampler`, ``"random"`` (the default) a shuffled one.
  Seeds come from ``args.data_seed``, else ``args.seed``. ``Trainer`` calls ``set_epoch`` every
  epoch, so every epoch has a new order.
- Checkpoints: every checkpoint folder gets ``shardwise_sampler.json``, the sampler's O(1) state
  for the batches actually *trained* (counted in ``training_step``, never read from the sampler,
  whose position runs ahead by the batches the loader and its workers prefetch).
  ``trainer.train(resume_from_checkpoint=...)`` loads it and continues with the next batch the
  uninterrupted run would have trained, on every rank, at any world size, instead of
  ``skip_first_batches`` (which re-draws the skipped batches). At another world size the epoch's
  remaining batches are counted at the new size and, for epoch-driven runs (``max_steps`` unset),
  the run's step budget is adjusted so the epochs still end where they should; the learning-rate
  schedule, counted in optimizer steps, is Trainer's own business. A checkpoint without the file
  (from a plain ``Trainer``) resumes as ``Trainer`` does, by replaying, with a warning; the
  replayed batches count as trained, so every later checkpoint holds the uninterrupted run's state.

Example:
    >>> from shardwise.integrations.transformers import ShardwiseTrainer  # doctest: +SKIP
    >>> trainer = ShardwiseTrainer(model=model, args=args, train_dataset=data, data_collator=collate)  # doctest: +SKIP
    >>> trainer.train(resume_from_checkpoint=True)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from .._core.errors import StateMismatchError, check_instance_or_factory
from .._core.foreign import check, private
from .._core.state import REBASE_HINT
from ..data.attention import packing_leak
from ..data.packed_dataset import PackedDataset
from ..data.packing import PackCollate
from ..samplers.base import PlanSampler
from ..samplers.frameworks import is_batch_plan
from ..samplers.packed import PackedBatchSampler
from ..samplers.packed_mixture import PackedMixtureSampler
from . import require
from .loader_settings import trainer_settings
from .trainer_sampling import default_train_sampler

_transformers = require("transformers", "transformers", "transformers", "transformers")
_trainer_module: Any = require("transformers.trainer", "transformers", "transformers", "transformers")
_trainer_utils = require("transformers.trainer_utils", "transformers", "transformers", "transformers")

from .accelerate import prepare_data_loader  # noqa: E402  (after the install hint for transformers)

__all__ = ["STATE_FILE", "ShardwiseTrainer", "ShardwiseTrainerMixin", "default_train_sampler"]

logger = logging.getLogger("shardwise")

STATE_FILE = "shardwise_sampler.json"
"""The file each checkpoint folder gets: ``{"sampler": state, "world_size", "global_step"}``."""

SamplerFactory = Callable[[Any, Any], PlanSampler[Any]]
"""``factory(train_dataset, training_args) -> shardwise sampler``, called when the loader is built."""

_DESCRIBED = "a shardwise sampler or batch sampler"
_Base: Any = object
_Trainer: Any = _transformers.Trainer
check("transformers")  # the Trainer hooks this module extends or calls: fail at import, not mid-run
_HOOKS = tuple(
    private("transformers", name)
    for name in ("_run_epoch", "_init_training_state", "_save_checkpoint", "_remove_unused_columns",
                 "_get_collator_with_removed_columns", "_get_output_dir")
)  # fmt: skip
"""Trainer's private methods :class:`ShardwiseTrainerMixin` overrides or calls (see ``shardwise._core.foreign``)."""
_TRAIN_BATCH_SIZE = private("transformers", "_train_batch_size")
_SKIP = private("transformers", "skip_first_batches")  # transformers.trainer's, replaced in a resumed epoch

PACKED_SAMPLERS = (PackedBatchSampler, PackedMixtureSampler)
"""Samplers whose batches are packed rows of ``PackedIndex`` pieces (read through ``PackedDataset``, laid out by
``PackCollate``)."""


class _Position:
    """Where the training loop is in the sampler's plan, counted in batches actually trained."""

    def __init__(self, sampler: PlanSampler[Any], loader: Any, batch_size: int | None, drop_last: bool) -> None:
        self.sampler, self.loader, self.batch_size = sampler, loader, batch_size
        self.drop_last = drop_last  # the loader drops a short last batch (index samplers only)
        self.epoch = 0
        self.start = 0  # plan position where this pass began (nonzero only in a resumed epoch)
        self.trained = 0  # local batches trained in this pass
        self.resumed: tuple[int, int] | None = None  # (epoch, consumed) loaded from a checkpoint
        self.replayed: tuple[int, int] | None = None  # (epoch, local batches) Trainer replays (plain checkpoint)

    def begin(self, epoch: int) -> None:
        resumed, replayed = self.resumed, self.replayed
        self.epoch = epoch
        self.start = resumed[1] if resumed is not None and resumed[0] == epoch else 0
        # A plain Trainer checkpoint: Trainer's skip_first_batches draws and drops the batches trained
        # before it, from the start of the epoch. They were trained, so the pass has trained them too:
        # every later state then equals the uninterrupted run's.
        self.trained = replayed[1] if replayed is not None and replayed[0] == epoch else 0

    def remaining_batches(self, epoch: int, consumed: int) -> int:
        """Batches this rank has left in ``epoch`` from plan position ``consumed``, at the current world size."""
        units = self.sampler.plan.pass_units(epoch, consumed, self.sampler.num_replicas)
        if self.batch_size is None:
            return units
        return units // self.batch_size if self.drop_last else -(-units // self.batch_size)

    def consumed(self) -> int:
        """The plan position of ``epoch`` after the batches trained in this pass (all ranks together)."""
        units = self.trained if self.batch_size is None else self.trained * self.batch_size
        return self.sampler.plan.consumed_after(self.epoch, self.start, self.sampler.num_replicas, units)

    def state(self) -> dict[str, Any]:
        """The sampler's state after the batches trained in this pass (the same on every rank)."""
        state = self.sampler.state_dict()
        state["epoch"], state["consumed"] = self.epoch, self.consumed()
        return state


class ShardwiseTrainerMixin(_Base):  # type: ignore[misc]
    """Put it before any ``transformers.Trainer`` subclass (TRL's ``SFTTrainer``...) to sample with shardwise.

    Adds one keyword argument, ``train_sampler``: a shardwise sampler or batch sampler, or a
    factory ``(train_dataset, args) -> sampler`` (called when the training loader is built, after
    unused columns are removed); ``None`` (default) picks :func:`default_train_sampler` from the
    ``TrainingArguments``. See the module docstring for what is kept from ``Trainer`` and how
    checkpoints resume.

    Raises:
        TypeError: at construction, ``train_sampler`` is neither a shardwise sampler instance nor a
            callable taking ``(train_dataset, args)`` (a sampler class whose constructor takes other
            arguments, a torch sampler, a factory of another arity); when the loader is built, the
            factory returned something else.

    Example:
        >>> from trl import SFTTrainer  # doctest: +SKIP
        >>> class ShardwiseSFTTrainer(ShardwiseTrainerMixin, SFTTrainer):  # doctest: +SKIP
        ...     pass
        >>> trainer = ShardwiseSFTTrainer(model=model, args=args, train_dataset=data,  # doctest: +SKIP
        ...                               train_sampler=shardwise.BucketBatchSampler(lengths, max_tokens=8192))
    """

    def __init__(self, *args: Any, train_sampler: PlanSampler[Any] | SamplerFactory | None = None, **kwargs: Any):
        if train_sampler is not None:  # a class or a factory of another arity would fail only at train()
            check_instance_or_factory("train_sampler", train_sampler, kind=PlanSampler, described=_DESCRIBED,
                                      arguments=("train_dataset", "args"))  # fmt: skip
        self._shardwise_source = train_sampler
        self._shardwise_sampler: PlanSampler[Any] | None = None
        self._shardwise_position: _Position | None = None
        self._shardwise_checked = False  # the first training batch is checked for packed documents that would leak
        super().__init__(*args, **kwargs)

    @property
    def train_sampler(self) -> PlanSampler[Any]:
        """The shardwise sampler of the training loader (built on first use)."""
        if self._shardwise_sampler is None:
            self._shardwise_sampler = self._build_shardwise_sampler(self.train_dataset)
        return self._shardwise_sampler

    def _build_shardwise_sampler(self, dataset: Any) -> PlanSampler[Any]:
        source = self._shardwise_source
        if isinstance(source, PlanSampler):
            sampler: object = source
        elif source is not None:
            sampler = source(dataset, self.args)
        else:
            sampler = default_train_sampler(dataset, self.args, model_input_name=self._model_input_name())
        if not isinstance(sampler, PlanSampler):
            raise TypeError(
                f"the train_sampler factory should return {_DESCRIBED}, but it returned {type(sampler).__name__}"
            )
        return sampler

    def get_train_dataloader(self) -> Any:
        """``Trainer``'s training loader, sampled by the shardwise sampler and sharded once (by it)."""
        import torch
        from torch.utils.data import DataLoader

        dataset = self.train_dataset
        if dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError(
                "a shardwise sampler needs a map-style train_dataset (with __len__ and __getitem__), but got an "
                f"IterableDataset ({type(dataset).__name__}); use transformers.Trainer for iterable datasets"
            )
        datasets = _trainer_module.datasets if _trainer_module.is_datasets_available() else None
        arrow = datasets is not None and isinstance(dataset, datasets.Dataset)
        if arrow:
            dataset = self._remove_unused_columns(dataset, description="Training")
        if self._shardwise_sampler is None:
            self._shardwise_sampler = self._build_shardwise_sampler(dataset)
        sampler = self._shardwise_sampler
        self._fit_pack_collate(sampler)
        collator = self.data_collator
        if not arrow:
            collator = self._get_collator_with_removed_columns(self.data_collator, description="Training")
        if isinstance(sampler, PACKED_SAMPLERS) and not isinstance(dataset, PackedDataset):
            dataset = self._packed_dataset(dataset)
        args = self.args
        params: dict[str, Any] = {
            **trainer_settings(args),
            "collate_fn": collator,
            "worker_init_fn": partial(
                _trainer_utils.seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index
            ),
        }
        batch_size: int | None = None
        if is_batch_plan(sampler):
            loader = DataLoader(dataset, batch_sampler=sampler, **params)
        else:
            batch_size = getattr(self, _TRAIN_BATCH_SIZE)
            loader = DataLoader(
                dataset, sampler=sampler, batch_size=batch_size, drop_last=args.dataloader_drop_last, **params
            )
        prepared = prepare_data_loader(self.accelerator, loader)
        drop_last = bool(batch_size is not None and args.dataloader_drop_last)
        self._shardwise_position = _Position(sampler, prepared, batch_size, drop_last)
        return prepared

    def _model_input_name(self) -> str:
        """The key of a sample's token ids: the processing class's first model input, else ``input_ids``."""
        names = getattr(self.processing_class, "model_input_names", None) or ["input_ids"]
        return str(names[0])

    def _packed_dataset(self, dataset: Any) -> PackedDataset:
        """A dataset of token rows (an HF Dataset, TRL's prepared one) read as the pieces PackedBatchSampler plans."""
        return PackedDataset(dataset, field=self._model_input_name() if isinstance(dataset[0], Mapping) else None)

    def _fit_pack_collate(self, sampler: PlanSampler[Any]) -> None:
        """Packed batches get the inputs that keep documents apart for this model (see ``shardwise.data.attention``)."""
        collator: Any = vars(self).get("data_collator")  # set by Trainer.__init__
        if isinstance(collator, PackCollate):
            if not collator.layout.hf:
                self.data_collator = collator.for_model(self.model)
                logger.info("PackCollate fitted to the model: %r", self.data_collator)
        elif isinstance(sampler, PACKED_SAMPLERS):
            raise TypeError(
                f"{type(sampler).__name__}'s batches are packed rows that data_collator={type(collator).__name__} "
                "does not lay out; pass data_collator=shardwise.PackCollate(max_len=..., rows=...) (fitted to the "
                "model here)"
            )

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.training_step``, counting the batches trained (what checkpoints record).

        The first batch is checked before it trains: inputs whose documents would attend to each
        other (``shardwise.data.attention.packing_leak``) raise, naming the fix.
        """
        if not self._shardwise_checked:
            self._shardwise_checked = True
            leak = packing_leak(model, inputs)
            if leak is not None:
                raise ValueError(f"this batch of packed documents would train across documents: {leak}")
        loss = super().training_step(model, inputs, *args, **kwargs)
        if self._shardwise_position is not None:
            self._shardwise_position.trained += 1
        return loss

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        position = self._shardwise_position
        if position is None or "epoch" not in kwargs:
            return super()._run_epoch(*args, **kwargs)
        position.begin(kwargs["epoch"])
        if position.resumed is None:
            return super()._run_epoch(*args, **kwargs)
        # The sampler already stands at the checkpoint's position (loaded in _init_training_state):
        # Trainer's skip_first_batches would re-draw and drop that many batches more.
        replay = getattr(_trainer_module, _SKIP)

        def skip_first_batches(loader: Any, num_batches: int = 0) -> Any:
            return loader if loader is position.loader else replay(loader, num_batches)

        setattr(_trainer_module, _SKIP, skip_first_batches)
        try:
            return super()._run_epoch(*args, **kwargs)
        finally:
            setattr(_trainer_module, _SKIP, replay)

    def _init_training_state(
        self, max_steps: int, num_update_steps_per_epoch: int, num_train_epochs: int, resume_from_checkpoint: Any,
        trial: Any,
    ) -> tuple[int, int]:  # fmt: skip
        epochs_trained, steps_trained = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        position = self._shardwise_position
        if position is None:
            return epochs_trained, steps_trained
        position.resumed = position.replayed = None
        if resume_from_checkpoint is None or self.args.ignore_data_skip:
            return epochs_trained, steps_trained
        path = os.path.join(resume_from_checkpoint, STATE_FILE)
        if not os.path.isfile(path):
            logger.warning(
                "checkpoint %s has no %s (saved by a plain Trainer?): resuming as Trainer does, by replaying "
                "the trained batches of the epoch", resume_from_checkpoint, STATE_FILE,
            )  # fmt: skip
            position.replayed = (epochs_trained, steps_trained)
            return epochs_trained, steps_trained
        with open(path, encoding="utf-8") as file:
            saved = json.load(file)
        try:
            position.sampler.load_state_dict(saved["sampler"])
        except StateMismatchError as error:
            raise StateMismatchError(
                f"checkpoint {resume_from_checkpoint} holds a data position for other data or another sampler: "
                f"{str(error).removesuffix(REBASE_HINT)}. To resume its weights and optimizer with this data, without "
                "skipping what it trained, pass TrainingArguments(ignore_data_skip=True); to resume its data position "
                "exactly, train on the data and sampler options it was saved with"
            ) from error
        epoch, consumed = int(saved["sampler"]["epoch"]), int(saved["sampler"]["consumed"])
        remaining = position.remaining_batches(epoch, consumed)
        steps_in_epoch = len(position.loader)
        if remaining == 0:
            epochs_trained, steps_trained = epoch + 1, 0
        else:
            epochs_trained, steps_trained = epoch, max(steps_in_epoch - remaining, 0)
            position.resumed = (epoch, consumed)
        if int(saved.get("world_size", 0)) != position.sampler.num_replicas and self.args.max_steps <= 0:
            # Trainer counts epochs in optimizer steps of the saving run's world size; count what is left here.
            accumulation = self.args.gradient_accumulation_steps
            this_epoch = num_update_steps_per_epoch - steps_trained // accumulation if remaining else 0
            later = max(num_train_epochs - epoch - 1, 0) * num_update_steps_per_epoch
            self.state.max_steps = self.state.global_step + this_epoch + later
        return epochs_trained, steps_trained

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        position = self._shardwise_position
        if position is None or not self.args.should_save:
            return
        folder = f"{_trainer_utils.PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        output_dir = os.path.join(self._get_output_dir(trial=trial), folder)
        record = {
            "sampler": position.state(),
            "world_size": position.sampler.num_replicas,
            "global_step": self.state.global_step,
        }
        os.makedirs(output_dir, exist_ok=True)
        temporary = os.path.join(output_dir, STATE_FILE + ".tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(record, file)
        os.replace(temporary, os.path.join(output_dir, STATE_FILE))


class ShardwiseTrainer(ShardwiseTrainerMixin, _Trainer):  # type: ignore[misc]
    """``transformers.Trainer`` that samples with shardwise; one extra keyword, ``train_sampler``.

    Example:
        >>> args = TrainingArguments("out", train_sampling_strategy="group_by_length")  # doctest: +SKIP
        >>> trainer = ShardwiseTrainer(model=model, args=args, train_dataset=data)  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
    """
