"""The one list of DataLoader settings an integration keeps when it builds a loader anew.

Three integrations build a ``DataLoader`` in place of another: Accelerate's ``DataLoaderShard``
around a shardwise batch sampler (:mod:`.accelerate`), a torchdata ``StatefulDataLoader``
(:mod:`.torchdata`), and ``ShardwiseTrainer``'s training loader, made from the
``TrainingArguments`` as ``transformers.Trainer`` makes its own (:mod:`.transformers`). Each
entry of :data:`SETTINGS` says where an integration differs, and why.

Sampling (``sampler``, ``batch_sampler``, ``batch_size``, ``drop_last``) is not here: each
integration decides it. Importing this module imports no framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SETTINGS", "Setting", "copy_settings", "trainer_settings"]


@dataclass(frozen=True)
class Setting:
    """One ``DataLoader`` keyword (also the loader's attribute of that name)."""

    name: str
    trainer_arg: str | None = None
    """The ``TrainingArguments`` field ``Trainer`` reads it from; None: Trainer does not take it from one."""
    stateful: bool = True
    """Whether :func:`shardwise.integrations.torchdata.to_stateful` copies it."""
    note: str = ""


SETTINGS: tuple[Setting, ...] = (
    Setting("num_workers", "dataloader_num_workers"),
    Setting("collate_fn", note="Trainer: its data collator, with the unused columns removed"),
    Setting("pin_memory", "dataloader_pin_memory"),
    Setting("timeout", note="Trainer leaves DataLoader's default"),
    Setting("worker_init_fn", note="Trainer: transformers.trainer_utils.seed_worker for the rank"),
    Setting("multiprocessing_context", "dataloader_multiprocessing_context"),
    Setting("generator", note="Trainer leaves DataLoader's default"),
    Setting("prefetch_factor", "dataloader_prefetch_factor"),
    Setting("persistent_workers", "dataloader_persistent_workers"),
    Setting("pin_memory_device", note="Trainer leaves DataLoader's default"),
    Setting(
        "in_order",
        "dataloader_in_order",
        stateful=False,
        note="to_stateful makes a loader for exact resume: torchdata gives no state guarantee with "
        "in_order=False and workers, so it keeps StatefulDataLoader's default (True) unless overridden",
    ),
)
"""Every setting kept, in DataLoader's argument order (see each entry's ``note`` for the differences)."""


def copy_settings(loader: Any, *, stateful: bool = False) -> dict[str, Any]:
    """``loader``'s settings as keyword arguments for a new loader (``stateful``: for ``to_stateful``).

    Without workers, ``prefetch_factor`` is left out and ``persistent_workers`` is False, as
    ``DataLoader`` requires of a loader built with ``num_workers=0``.
    """
    names = [s.name for s in SETTINGS if s.stateful or not stateful]
    settings: dict[str, Any] = {name: getattr(loader, name) for name in names if hasattr(loader, name)}
    if settings.get("num_workers", 0) == 0:
        settings.pop("prefetch_factor", None)
        settings["persistent_workers"] = False
    return settings


def trainer_settings(args: Any) -> dict[str, Any]:
    """The settings ``transformers.Trainer`` takes from its ``TrainingArguments`` ``args``."""
    return {s.name: getattr(args, s.trainer_arg) for s in SETTINGS if s.trainer_arg is not None}
