"""How shardwise samplers meet what training frameworks do to samplers, with their default settings.

A shardwise sampler is already distributed. Frameworks that distribute data themselves must
therefore leave it in place, and must still be able to set its epoch:

- Index samplers subclass ``DistributedSampler``: Lightning leaves such a DataLoader alone and
  calls ``set_epoch``; Composer and most trainers check for that class.
- Lightning (``use_distributed_sampler=True``, the default) rebuilds every DataLoader whose
  ``sampler`` is not a ``DistributedSampler``, and so every loader built with ``batch_sampler=``.
  It re-creates a custom batch sampler from the arguments it recorded at construction
  (``__pl_saved_args`` and friends), putting its own ``DistributedSampler`` into the argument named
  ``sampler``. A shardwise batch sampler exposes such a record, made of a :class:`Keep` marker
  and the ``sampler`` slot; :class:`PlanMeta` turns "construct from a ``Keep``" into "return the
  kept sampler", so Lightning's rebuild hands back the very same, already distributed object.
- Lightning and Accelerate call ``set_epoch`` on ``loader.batch_sampler.sampler``. A shardwise
  batch sampler's ``sampler`` attribute is an :class:`EpochRelay` that sets the batch sampler's
  own epoch (a value assigned to ``sampler`` on the instance, as ``shard_batches`` does not, wins).
  The relay is also in the instance's ``__dict__``: Lightning's ``trainer.predict`` wraps the batch
  sampler in its ``_IndexBatchSamplerWrapper``, which copies the instance's ``__dict__`` and none of
  its class, and calls ``set_epoch`` on ``wrapper.sampler``; the copied relay still reaches the
  batch sampler (NOTE [ The relay in the instance ]).
- The record also carries ``drop_last``: ``trainer.predict`` injects ``drop_last=False`` so that
  every sample is predicted. The kept sampler keeps its own ``drop_last``; if that is ``True`` it
  drops units, and :class:`PlanMeta` says so (NOTE [ drop_last under predict ]).
- Accelerate's ``prepare`` wraps every batch sampler in its ``BatchSamplerShard``, which would deal
  an already dealt plan a second time; :func:`refuse_resharding` makes that fail at the first
  ``__iter__``, before any step, naming the one-line fix.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from typing import Any

from .._core.foreign import check_loaded, private
from . import callers
from .keywords import accepted_keywords, expand_signature

ACCELERATE_FIX = (
    "loader = shardwise.integrations.accelerate.prepare_data_loader(accelerator, loader)"
)
_PL_SAVED = tuple(
    private("lightning", name)
    for name in ("__pl_saved_args", "__pl_saved_kwargs", "__pl_saved_arg_names", "__pl_saved_default_kwargs")
)
"""Lightning's record of a batch sampler's construction arguments, in the order of its tuple."""


def is_batch_plan(sampler: object) -> bool:
    """Whether a shardwise sampler's units are batches (index samplers are ``DistributedSampler``\\ s)."""
    from torch.utils.data.distributed import DistributedSampler

    return not isinstance(sampler, DistributedSampler)


def is_batch_class(cls: type) -> bool:
    """Whether ``cls`` is a batch sampler class: a torch ``Sampler`` that is not a ``DistributedSampler``."""
    from torch.utils.data import DistributedSampler, Sampler

    return issubclass(cls, Sampler) and not issubclass(cls, DistributedSampler)


class Keep:
    """Marker argument: constructing a shardwise sampler class from ``Keep(s)`` returns ``s`` itself."""

    __slots__ = ("sampler",)

    def __init__(self, sampler: object) -> None:
        self.sampler = sampler

    def __repr__(self) -> str:
        return f"Keep({type(self.sampler).__name__})"


class PlanMeta(type):
    """Metaclass of the sampler shell: honours :class:`Keep` so a framework's rebuild is the identity.

    It also gives each class the signature of its ``__init__`` (without ``self``), the shared
    keywords expanded (``.keywords``): otherwise ``inspect.signature``, ``help()`` and IDEs would
    show this ``__call__``'s ``(*args, **kwargs)``.
    """

    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(name, bases, namespace, **kwargs)
        # The shared keywords (``**options: Unpack[...]``, see .keywords) are shown as the parameters they are.
        # A subclass whose own __init__ passes the keywords on to super().__init__ keeps its base's kind.
        kind = accepted_keywords(cls.__init__) if "__init__" in namespace else None  # type: ignore[misc]
        if kind is not None or not hasattr(cls, "_keyword_kind"):
            cls._keyword_kind = kind
        init = expand_signature(cls.__init__, getattr(cls, "_KEYWORD_DEFAULTS", None))  # type: ignore[misc]
        if "__init__" in namespace:
            namespace["__init__"].__signature__ = init
        params = list(init.parameters.values())[1:]
        cls.__signature__ = init.replace(parameters=params, return_annotation=inspect.Signature.empty)
        if is_batch_class(cls) and not hasattr(cls, _PL_SAVED[0]):
            install(cls)  # the first batch sampler class of its line: the relay and Lightning's record

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        kept: object = args[0].sampler if args and isinstance(args[0], Keep) else None
        klass: type = cls
        if kept is not None and isinstance(kept, klass):
            _warn_if_kept_drops(kept, args[2:3], kwargs)
            return kept
        made = super().__call__(*args, **kwargs)
        if is_batch_plan(made) and "sampler" not in made.__dict__:
            made.__dict__["sampler"] = EpochRelay(made)  # NOTE [ The relay in the instance ]
        return made


def _warn_if_kept_drops(kept: Any, positional: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """NOTE [ drop_last under predict ]: a rebuild that asks for ``drop_last=False`` of a kept sampler that drops.

    Lightning's ``trainer.predict`` re-creates the batch sampler from its record with ``drop_last=False``
    (its own samplers then yield every sample). A shardwise rebuild returns the very same sampler,
    configured as it was built: with ``drop_last=False`` every sample is predicted (the last global
    step padded by repeating up to ``W - 1`` units, as every shardwise sampler keeps ranks equal), so
    nothing is said; with ``drop_last=True`` some are not, and this warning says so and names the fix.
    Training's rebuild passes the sampler's own value back: no warning.
    """
    asked = positional[0] if positional else kwargs.get("drop_last")
    if asked is False and getattr(kept, "drop_last", False) is True:
        name = type(kept).__name__
        warnings.warn(
            f"Lightning asked this {name} for drop_last=False (trainer.predict predicts every sample), but it was "
            f"built with drop_last=True and is kept as built: the units it drops (the last partial global step, and a "
            f"short batch where {name} drops one) are not predicted. Build the predict loader's sampler with "
            "drop_last=False to predict every sample (padding then repeats up to W - 1 of its units on the last step)",
            stacklevel=3,
        )


class EpochRelay:
    """What ``batch_sampler.sampler`` is on a shardwise batch sampler: ``set_epoch`` reaches its owner.

    Lightning (``_set_sampler_epoch``) and Accelerate (``DataLoaderShard.set_epoch``) look for
    ``set_epoch`` on ``loader.batch_sampler.sampler``; this is how the epoch gets there.
    """

    __slots__ = ("owner",)

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        """Set the owning batch sampler's epoch."""
        self.owner.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The owning batch sampler's epoch."""
        return int(self.owner.epoch)

    def __repr__(self) -> str:
        return f"EpochRelay(of {type(self.owner).__name__})"


class _RelayAttribute:
    """Data descriptor for ``sampler``: a relay to the instance it is read from, unless a value was assigned.

    NOTE [ The relay in the instance ]: Lightning's ``_IndexBatchSamplerWrapper`` (``trainer.predict``)
    copies the batch sampler's ``__dict__`` into an object of its own class and reads ``sampler`` there
    (``_set_sampler_epoch``), so a relay only on the class never reaches it. :class:`PlanMeta` therefore
    puts ``EpochRelay(self)`` in every batch sampler's ``__dict__``; the copy carries it and it still
    sets the original's epoch. On the sampler itself this descriptor takes precedence (a data
    descriptor) and relays to the object it is read from, so a ``copy.copy`` of a sampler, whose
    ``__dict__`` holds the original's relay, sets its own epoch (and its entry is mended). A value
    assigned to ``sampler`` (``self.sampler = x`` in a subclass) is returned as assigned.
    """

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        held = obj.__dict__.get("sampler")
        if held is not None and not isinstance(held, EpochRelay):
            return held  # assigned on the instance
        if held is None or held.owner is not obj:
            held = obj.__dict__["sampler"] = EpochRelay(obj)
        return held

    def __set__(self, obj: object, value: Any) -> None:
        obj.__dict__["sampler"] = value

    def __delete__(self, obj: object) -> None:
        obj.__dict__.pop("sampler", None)


def _lightning_record(position: int) -> property:
    """One of Lightning's ``__pl_saved_*`` attributes: re-create as ``cls(Keep(self), sampler, drop_last)``."""

    def get(self: object) -> Any:
        check_loaded("lightning")  # Lightning reads the record: its names are loaded
        drop_last = getattr(self, "drop_last", None)
        if isinstance(drop_last, bool):  # NOTE [ drop_last under predict ]
            record: tuple[Any, ...] = ((Keep(self), None, drop_last), {}, ("keep", "sampler", "drop_last"), {})
        else:
            record = ((Keep(self), None), {}, ("keep", "sampler"), {})
        return record[position]

    return property(get)


def install(cls: type) -> None:
    """Give a batch sampler class the attributes described in the module docstring (:class:`PlanMeta` does,
    for the first batch sampler class of each line: index samplers, ``DistributedSampler``\\ s, have none)."""
    cls.sampler = _RelayAttribute()  # type: ignore[attr-defined]
    for position, name in enumerate(_PL_SAVED):
        setattr(cls, name, _lightning_record(position))


def refuse_resharding(sampler: object) -> None:
    """Raise if ``sampler``'s ``__iter__`` (the caller) is called from inside a framework's own sharding wrapper.

    Once per pass (``callers.accelerate_resharder``). A shardwise sampler dealt out a second time
    would silently hand each rank ``1/W`` of its share. A sampler built with ``num_replicas=1``
    yields the whole plan, which the framework may deal out itself.
    """
    check_loaded("accelerate")
    resharder = callers.accelerate_resharder(2)  # 1: the sampler's __iter__, 2: what called it
    # A sampler pinned to one replica yields the whole plan: dealing it out once is correct.
    if resharder is not None and getattr(getattr(sampler, "world", None), "world_size", 2) > 1:
        raise RuntimeError(
            f"accelerator.prepare() wrapped this {type(sampler).__name__} in Accelerate's "
            f"{type(resharder).__name__}, which would shard an already distributed sampler a second time "
            f"(each rank would get 1/{getattr(resharder, 'num_processes', 'W')} of its share). Prepare the "
            f"loader with: {ACCELERATE_FIX}"
        )


def lightning_pending_epoch(depth: int) -> int | None:
    """The epoch Lightning is about to set, when it pulls a pass (``depth`` frames above the caller) before
    setting it; else ``None``.

    ``FitLoop.setup_data`` creates the first training iterator of a run before ``on_advance_start``
    calls ``set_epoch``; with DataLoader workers that iterator already draws from the sampler. On
    a run resumed from an epoch-end checkpoint the sampler would still be at epoch 0, and the
    workers would prefetch epoch 0's first batches into epoch ``e + 1``. The epoch Lightning will
    set is ``fit_loop.epoch_progress.current.processed`` once ``FitLoop.reset()`` (which runs after
    ``setup_data``) has read the checkpoint: :func:`_epoch_after_reset`. The pass adopts it first.
    """
    if "lightning.pytorch" not in sys.modules:
        return None
    check_loaded("lightning")
    loop = callers.lightning_fit_loop(depth + 1)
    return None if loop is None else _epoch_after_reset(loop)


def _epoch_after_reset(loop: Any) -> int | None:
    """``fit_loop.epoch_progress.current.processed`` as ``FitLoop.reset()`` will leave it (Lightning 2.6).

    NOTE [ A step checkpoint at an epoch's last batch ]: restored from a checkpoint saved at the last
    batch of epoch ``e`` (``every_n_train_steps``, a run stopped by ``max_steps``), ``reset()`` counts
    epoch ``e`` as processed and the restored loader iterator, made in ``setup_data`` before that,
    runs epoch ``e + 1``: Lightning sets epoch ``e + 1`` on the sampler only after the workers drew
    from it, and they had drawn the empty rest of epoch ``e`` (epoch ``e + 1`` was never trained;
    torch's ``DistributedSampler`` draws epoch ``e``'s order there). This reads, without changing
    anything, the restored progress ``reset()`` decides by: ``FitLoop.restarted_mid_epoch``, the
    epoch loop's ``restarted_on_train_batch_end`` and ``batch_progress.is_last_batch``, as
    ``update_restart_stage`` computes the first two. Once ``reset()`` has counted the epoch (a
    ``setup_data`` that reloads the loader later), the same reading gives ``processed`` itself. A
    checkpoint saved at the epoch end (``save_on_train_epoch_end``, alone) is not such a case:
    Lightning finishes epoch ``e`` on the restored iterator (empty) and makes a new one.
    """
    try:
        processed = loop.epoch_progress.current.processed
        if not isinstance(processed, int) or not loop.restarting:
            return processed if isinstance(processed, int) else None
        epochs, epoch_loop = loop.epoch_progress.total, loop.epoch_loop
        batches = epoch_loop.batch_progress.total
        mid_epoch = (epochs.started == epochs.ready and epochs.processed == epochs.started - 1
                     and epochs.completed == epochs.processed)  # fmt: skip
        on_batch_end = epoch_loop.restarting and (batches.started == batches.ready == batches.processed
                                                  and batches.completed == batches.processed - 1)  # fmt: skip
        finished = mid_epoch and on_batch_end and epoch_loop.batch_progress.is_last_batch is True
    except AttributeError:  # another Lightning: the loop's own count, as before this case was known
        processed = getattr(getattr(getattr(loop, "epoch_progress", None), "current", None), "processed", None)
        return processed if isinstance(processed, int) else None
    return processed + 1 if finished else processed
