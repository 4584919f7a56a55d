"""``shard()`` and ``shard_batches()``: make any sampler or batch sampler distributed.

Every rank runs the wrapped sampler over the whole epoch and keeps the units at its positions.
For that to be one global plan, every rank must see the same inner sequence, even when the inner
sampler draws from the global ``random``/``numpy.random``/``torch`` generators or owns a generator:
it runs under a *forked* RNG state, seeded from ``(seed, epoch)`` and identical on every rank, and
the caller's RNG state is put back whenever control returns to the caller (``rng_fork.RngFork``).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from .._core.errors import check_bool, check_int
from .._core.plan import Even
from .._core.seeds import derive_seed
from .._core.state import Fingerprint
from .._core.world import World
from .base import PlanSampler
from .identity import with_data
from .keywords import Keywords, ShardKeywords, with_keywords
from .passes import UnitSource
from .rng_fork import RngFork, attribute_values, owned_generators

if TYPE_CHECKING:
    from typing_extensions import Unpack

FORK = "shard-rng"
_SKIP_BLOCK = 4096


def _already_distributed(sampler: object) -> object | None:
    """``sampler`` itself or a sampler inside it that already deals by rank (pinned to one rank is fine)."""
    for candidate in (sampler, *attribute_values(sampler)):
        if isinstance(candidate, PlanSampler) and candidate.plan.deals_by_rank:
            return candidate
        if (
            isinstance(candidate, DistributedSampler)
            and not isinstance(candidate, PlanSampler)
            and candidate.num_replicas != 1
        ):
            return candidate
    return None


_INDEX_SAMPLERS = (SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler)
"""torch's samplers of single indices: a batch sampler over one of them is the usual mix-up."""


class _InnerStream:
    """Reads one epoch of the inner sampler once, forward, keeping the units at asked positions.

    Positions arrive ascending, except the padded tail, which wraps to positions below the
    world size: those first units are kept aside (``head``). If the inner sampler runs short of
    its ``len()``, the missing positions are filled from the head, with a warning, so every rank
    still yields the same number of units.
    """

    def __init__(self, sampler: Iterable[Any], fork: RngFork, head_size: int, label: str) -> None:
        self._fork = fork
        with fork:
            self._iter: Iterator[Any] = iter(sampler)
        self._read = 0
        self._head: list[Any] = []
        self._head_size = head_size
        self._exhausted_at: int | None = None
        self._label = label

    def _next(self) -> Any:
        try:
            unit = next(self._iter)
        except StopIteration:
            return self._short()
        if self._read < self._head_size:
            self._head.append(unit)
        self._read += 1
        return unit

    def _short(self) -> Any:
        if self._exhausted_at is None:
            self._exhausted_at = self._read
            warnings.warn(
                f"{self._label}: the wrapped sampler yielded {self._read} units, fewer than its len(); "
                "the missing positions repeat units from the start of the epoch so ranks stay in step",
                RuntimeWarning,
                stacklevel=2,
            )
        if not self._head:
            raise RuntimeError(f"{self._label}: the wrapped sampler yielded no units although its len() is positive")
        unit = self._head[(self._read - self._exhausted_at) % len(self._head)]
        self._read += 1
        return unit

    def _skip(self, gap: int) -> None:
        """Read past ``gap`` units in C, in bounded blocks, counting what was really there."""
        while gap > 0:
            wanted = min(gap, _SKIP_BLOCK)
            got = len(list(itertools.islice(self._iter, wanted)))
            self._read += got
            gap -= got
            if got < wanted:
                break  # ran short: the reads that follow fill from the head and warn
        # Reads below this point go through _next(), which handles an exhausted sampler.

    def head(self) -> list[Any]:
        """The epoch's first units read so far (up to the world size of them; at least one once a unit was read)."""
        return self._head

    def __call__(self, positions: np.ndarray) -> list[Any]:
        units = []
        with self._fork:
            for position in positions.tolist():
                if position < self._read:
                    units.append(self._head[position])
                    continue
                while self._read < min(position, self._head_size):
                    self._next()
                self._skip(position - self._read)
                while self._read < position:
                    self._next()
                units.append(self._next())
        return units


class _EvenBatches:
    """A batch stream whose batches shorter than ``batch_size`` are completed from the epoch's first indices.

    NOTE [ Even batches ]: with more than one rank, the wrapped batch sampler's short last batch
    sits beside full batches of the other ranks at the same step; a framework that gathers a
    step's batches (Accelerate's ``gather``) needs one shape on every rank. As torch's
    ``DistributedSampler`` + ``BatchSampler`` and Accelerate's ``even_batches`` do, the short batch
    is completed with the epoch's first indices (its padding); the plan's positions, the state and
    every full batch are unchanged.
    """

    def __init__(self, stream: _InnerStream, batch_size: int) -> None:
        self._stream = stream
        self._batch_size = batch_size

    def __call__(self, positions: np.ndarray) -> list[Any]:
        units = self._stream(positions)
        for k, batch in enumerate(units):
            missing = self._batch_size - len(batch)
            if missing > 0:
                first = itertools.chain.from_iterable(self._stream.head())
                units[k] = [*batch, *itertools.islice(itertools.cycle(list(first)), missing)]
        return units


class _Shard(PlanSampler[Any]):
    """Shared body of ``shard()`` and ``shard_batches()``: deals the inner sampler's units."""

    _wrapped: Any

    def _wrap(self, sampler: object, keywords: Keywords) -> None:
        inner = _already_distributed(sampler)
        if inner is not None:
            where = "" if inner is sampler else f" inside {type(sampler).__name__}"
            raise TypeError(
                f"sampler should be a sampler that is not already distributed, but got {type(inner).__name__}{where}, "
                "which deals by rank itself: wrapping it would shard twice (each rank would get 1/W of its share); "
                "use the inner sampler undistributed (num_replicas=1), or use it directly"
            )
        if isinstance(sampler, (str, bytes)) or not (isinstance(sampler, Iterable) and isinstance(sampler, Sized)):
            batches = isinstance(self, ShardedBatchWrapper)
            name, kind = ("batch_sampler", "BatchSampler") if batches else ("sampler", "Sampler")
            raise TypeError(
                f"{name} should be a torch {kind} (or any iterable with __len__), "
                f"but got {name}={sampler!r} ({type(sampler).__name__})"
            )
        self._wrapped = sampler
        self._init_plan(keywords)

    def _on_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self._wrapped, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def _plan_size(self, epoch: int) -> int:
        return check_int(f"len({type(self._wrapped).__name__})", len(self._wrapped), minimum=0)

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        fork = RngFork(derive_seed(seed, epoch, FORK), owned_generators(self._wrapped))
        return _InnerStream(self._wrapped, fork, head_size=world.world_size, label=type(self).__name__)

    def _fingerprint(self) -> Fingerprint:
        fingerprint = {"sampler": type(self._wrapped).__qualname__, "num_units": len(self._wrapped)}
        return with_data(fingerprint, getattr(self._wrapped, "data_source", None))

    def _data_repr(self) -> str:
        return repr(self._wrapped)


class ShardedWrapper(_Shard, DistributedSampler[int]):
    """Any index sampler, dealt out to ranks by position; made by :func:`shard`.

    A ``DistributedSampler`` subclass, so frameworks leave it in place and call ``set_epoch``.
    """

    def __init__(self, sampler: Sampler[int], **options: Unpack[ShardKeywords]) -> None:
        inner: object = sampler
        if isinstance(inner, BatchSampler):
            raise TypeError("sampler is a BatchSampler, whose units are batches: use shard_batches(sampler) instead")
        self._wrap(sampler, self._read_keywords(options))

    @property
    def sampler(self) -> Any:
        """The wrapped sampler."""
        return self._wrapped

    @property
    def num_samples(self) -> int:  # type: ignore[override]  # derived from the wrapped sampler and the world size
        """Indices per rank per epoch (``DistributedSampler``'s attribute)."""
        return len(self)

    @property
    def total_size(self) -> int:  # type: ignore[override]  # derived from the wrapped sampler and the world size
        """Indices per epoch over all ranks, padding included."""
        return len(self) * self.num_replicas

    @property
    def shuffle(self) -> bool:  # type: ignore[override]  # derived from the wrapped sampler and the world size
        """Order comes from the wrapped sampler; shardwise adds no shuffle of its own."""
        return False

    @property
    def drop_last(self) -> bool:  # type: ignore[override]  # derived from the wrapped sampler and the world size
        return self._even is Even.DROP


class ShardedBatchWrapper(_Shard, Sampler[list[int]]):
    """Any batch sampler, its batches kept whole and dealt out to ranks; made by :func:`shard_batches`."""

    _CHUNK = 256

    def __init__(self, batch_sampler: Iterable[list[int]], **options: Unpack[ShardKeywords]) -> None:
        inner: object = batch_sampler
        if isinstance(inner, _INDEX_SAMPLERS):
            raise TypeError(
                f"batch_sampler should yield batches, but got {type(inner).__name__}, an index sampler whose units are "
                "single indices: use shard(sampler) instead, or wrap it in a BatchSampler first"
            )
        if "drop_last" not in options and "even" not in options and getattr(inner, "drop_last", None) is True:
            # The wrapped sampler's drop_last=True: no incomplete batch and no repeated sample, so the
            # last partial step is dropped too, rather than padded with repeated batches.
            options = {**options, "drop_last": True}
        self._wrap(batch_sampler, self._read_keywords(options))
        self._even_batches = False

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        stream = super()._open_pass(epoch, seed, world, start)
        size = self.batch_size
        if not self._even_batches or world.world_size == 1 or not isinstance(size, int):
            return stream
        return _EvenBatches(stream, size)  # type: ignore[arg-type]  # _Shard opens an _InnerStream

    @property
    def even_batches(self) -> bool:
        """Whether every rank holds ``batch_size`` indices at every step (NOTE [ Even batches ]); default False.

        With more than one rank, a batch shorter than the wrapped batch sampler's ``batch_size`` (its
        last batch, with ``drop_last=False``) is completed with the epoch's first indices, so the ranks'
        batches at each step have one shape, as a framework that gathers them needs (Accelerate's
        ``gather``; :func:`shardwise.integrations.accelerate.prepare_data_loader` sets it). False keeps
        the short batch as the wrapped sampler made it. Positions and state are the same either way.
        """
        return self._even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        if check_bool("even_batches", value) and not isinstance(self.batch_size, int):
            raise ValueError(
                f"even_batches=True needs the wrapped batch sampler's batch_size, but "
                f"{type(self._wrapped).__name__} has batch_size={self.batch_size!r}; batches of varying size "
                "cannot be evened: pad them before gathering (accelerator.pad_across_processes)"
            )
        self._even_batches = value

    @property
    def batch_sampler(self) -> Any:
        """The wrapped batch sampler (``sampler`` relays ``set_epoch`` to this wrapper, as on every batch plan)."""
        return self._wrapped

    @property
    def batch_size(self) -> int | None:
        """The wrapped batch sampler's ``batch_size``, which frameworks read, if it has one."""
        return getattr(self._wrapped, "batch_size", None)

    @property
    def drop_last(self) -> bool:
        return self._even is Even.DROP


@with_keywords
def shard(sampler: Sampler[int], **options: Unpack[ShardKeywords]) -> ShardedWrapper:
    """Make any index sampler distributed: rank ``r`` of ``W`` gets its units ``r, r+W, ...``.

    The wrapped sampler runs whole on every rank, under an RNG state forked from
    ``(seed, epoch)``, so all ranks agree on its sequence even if it draws from the global
    ``random``/``numpy``/``torch`` generators or owns a ``generator``; the caller's RNG state is
    untouched. ``set_epoch`` is forwarded to it. Stateful, like every shardwise sampler; on
    resume the wrapped sampler is re-run and fast-forwarded (no data is loaded to skip).

    Args:
        sampler: any sampler (or sized iterable) of indices with an exact ``len()``.
        seed: seeds the forked RNG state; the same on every rank.
        num_replicas: world size; default resolved lazily.
        rank: global rank; default resolved lazily.
        drop_last: cut the last partial global step (at most ``W - 1`` units) instead of padding it
            by wrapping to the start.
        even: deprecated alias of ``drop_last`` (``"drop"`` is ``drop_last=True``, ``"pad"`` is
            ``drop_last=False``); warns, and passing both is an error.

    Example:
        >>> from torch.utils.data import RandomSampler
        >>> sampler = shard(RandomSampler(range(10)), num_replicas=2, rank=0)
        >>> len(sampler)
        5
    """
    return ShardedWrapper(sampler, **options)


@with_keywords
def shard_batches(batch_sampler: Iterable[list[int]], **options: Unpack[ShardKeywords]) -> ShardedBatchWrapper:
    """Make any batch sampler distributed, keeping each batch whole: see :func:`shard`.

    Rank ``r`` of ``W`` gets batches ``r, r+W, ...`` of the sequence a single process would make.

    ``drop_last`` is the plan's: what to do with the last global step when the batches do not fill
    it (at most ``W - 1`` batches). Left out, it follows the wrapped batch sampler's ``drop_last``:
    a ``BatchSampler(..., drop_last=True)`` asks for no incomplete batch and no repeated sample, so
    that partial step is dropped too, not padded with repeated whole batches; with the wrapped
    ``drop_last=False`` (or none) the step is padded, as ``DistributedSampler`` pads. Passed
    explicitly, ``drop_last`` wins. The wrapped sampler's short last batch is kept as it is;
    :attr:`ShardedBatchWrapper.even_batches` completes it to ``batch_size`` where ranks' batches
    must have one shape.

    Example:
        >>> from torch.utils.data import BatchSampler, SequentialSampler
        >>> batches = shard_batches(BatchSampler(SequentialSampler(range(8)), 2, False), num_replicas=2, rank=1)
        >>> list(batches)
        [[2, 3], [6, 7]]
    """
    return ShardedBatchWrapper(batch_sampler, **options)

