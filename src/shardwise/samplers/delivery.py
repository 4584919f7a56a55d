"""What reached the training loop: the DataLoader iterator that drives a pass, read for resume.

A ``DataLoader`` with workers asks its sampler for ``prefetch_factor x num_workers`` batches
ahead of the training loop, so "units handed out" is not "units trained": a state counting the
former skips the prefetched batches on every resume. A shardwise pass therefore learns, when its
first unit is pulled, which DataLoader iterator pulls it (the iterator is the ``self`` of one of
the few frames that called it: torch's ``_next_index``, directly for a batch sampler, through
``BatchSampler.__iter__`` for an index sampler; ``callers.loader_iterator`` finds it), and reads
that iterator's ``_num_yielded``, the batches it delivered to the loop. From it and the batch
structure (a batch sampler: one unit per batch; an index sampler under a ``BatchSampler``:
``batch_size`` units, the last batch short or dropped) the pass computes the units this rank
trained, which ``state_dict()`` reports.

- All ranks are in lockstep, so the global position is ``start + trained x world_size``, the
  same on every rank at a step boundary.
- torchdata's ``StatefulDataLoader`` snapshots the sampler as it hands out indices and pairs each
  snapshot with the step at which that batch is delivered: its own calls (recognised by the
  calling module, ``callers.torchdata_snapshotting``) get the handed-out position; anyone else's
  call gets the trained one.
- The iterator is held by a weak reference, plus its attribute dict, so the count survives the
  iterator (a loop that ``break``\\ s and then saves) without keeping its workers alive.
- A loader that starts a new iteration over the same iterator object (``persistent_workers``)
  replaces its sampler iterator: the old pass is then over. The iterator asks the sampler for its
  new sampler iterator before it replaces the old one and zeroes its count, so the sampler's
  ``__iter__`` freezes what the pass delivered there (:meth:`LoaderDriver.restarting`); a pass
  whose replacement came another way counts what it handed out.
- torchdata's iterator with workers restores the snapshot it took last (every
  ``snapshot_every_n_steps`` steps) and replays the steps the loop took after it: at another
  world size those steps cover another number of units, so the sampler refuses such a state
  there (``callers.torchdata_replayed_steps`` reads their count as the state loads).
- A loader whose batches shardwise cannot map to units (a batch sampler that wraps the shardwise
  sampler, ``in_order=False``) with workers falls back to the handed-out count, and
  ``state_dict()`` warns, naming the exact alternative (torchdata's ``StatefulDataLoader``).
"""

from __future__ import annotations

import weakref
from typing import Any

from .._core.foreign import check, private
from . import callers

check("torch")  # the names below: one clear error naming the torch to pin, not a silent miscount

_INDEX_SAMPLER = private("torch", "_index_sampler")
_NUM_WORKERS = private("torch", "_num_workers")
_IN_ORDER = private("torch", "_in_order")
_SAMPLER_ITER = private("torch", "_sampler_iter")
_NUM_YIELDED = private("torch", "_num_yielded")  # torchdata's restored iterator sets it too (see the table)
_GROUPERS = ("torch.utils.data.sampler", "torchdata.stateful_dataloader.sampler")

STATEFUL_FIX = (
    "checkpoint the loader instead: build it as torchdata's StatefulDataLoader (or convert it with "
    "shardwise.integrations.torchdata.to_stateful(loader)) and save loader.state_dict()"
)


class LoaderDriver:
    """The DataLoader iterator that pulls a pass, and how its batches map to the pass's units."""

    __slots__ = ("__weakref__", "_final", "_pulled", "_ref", "_vars", "base", "batch_size", "drop_last", "mapped",
                 "workers", "wrapper")  # fmt: skip

    def __init__(self, iterator: Any, sampler: object) -> None:
        index_sampler: Any = getattr(iterator, _INDEX_SAMPLER, None)
        self.batch_size, self.drop_last, self.mapped = 1, False, True
        self.wrapper = type(index_sampler).__name__
        if index_sampler is sampler:
            pass  # a batch sampler (one unit per batch), or an index sampler with batch_size=None
        elif _groups_in_order(index_sampler) and getattr(index_sampler, "sampler", None) is sampler:
            self.batch_size, self.drop_last = int(index_sampler.batch_size), bool(index_sampler.drop_last)
        else:
            self.mapped = False
        self.workers = int(getattr(iterator, _NUM_WORKERS, 0) or 0)
        if getattr(iterator, _IN_ORDER, True) is False and self.workers > 0:
            self.mapped = False  # batches arrive out of order: a count does not say which
        # The attribute dict outlives the iterator: the last count stays readable after it is gone.
        self._vars: dict[str, Any] | None = vars(iterator)
        self._pulled = self._vars.get(_SAMPLER_ITER)
        self.base = int(self._vars.get(_NUM_YIELDED, 0) or 0)
        self._final: int | None = None
        self._ref = weakref.ref(iterator, self._gone)

    def _gone(self, _: object) -> None:
        self._final = self._delivered_now()
        self._vars = self._pulled = None

    def _delivered_now(self) -> int | None:
        state = self._vars
        if state is None:
            return self._final
        if state.get(_SAMPLER_ITER) is not self._pulled:
            return None  # the loader began a new iteration: this pass is over
        return max(0, int(state.get(_NUM_YIELDED, 0) or 0) - self.base)

    def restarting(self, depth: int) -> None:
        """Freeze what the pass delivered when the loader iterator driving it is asking for a new sampler
        iterator (it is among the frames from ``depth`` above the caller: see ``callers.called_by``).

        A loader with ``persistent_workers`` restarts the same iterator object (torch's ``_reset``):
        it asks for the new sampler iterator, then replaces the old one and sets its delivered count
        to 0. Read before that, the count says what the loop received of this pass (all of it at an
        epoch end; none for torchdata's iterator restored from a finished state, which only
        prefetched the next epoch); read after, nothing says it.
        """
        if self._vars is None or self._vars.get(_SAMPLER_ITER) is not self._pulled:
            return  # over already (its count is final), or replaced without asking us first
        iterator = self._ref()
        if iterator is not None and callers.called_by(iterator, depth + 1):
            self._final = self._delivered_now()
            self._vars = self._pulled = None

    def trained(self, handed: int, count: int) -> int:
        """Units of a pass of ``count`` that reached the loop, given that ``handed`` were handed out."""
        batches = self._delivered_now() if self.mapped else None
        if batches is None:
            return handed
        size = self.batch_size
        full = count // size if self.drop_last else -(-count // size)
        units = count if batches >= full else batches * size
        return min(handed, units)

    def prefetched_only(self, handed: int) -> bool:
        """Whether workers hold ``handed`` units of the pass while the loop has received none yet."""
        return self.workers > 0 and handed > 0 and self._delivered_now() == 0

    def lossy(self) -> bool:
        """Whether the handed-out count may run ahead of the loop and cannot be corrected."""
        return not self.mapped and self.workers > 0

    def __repr__(self) -> str:
        return f"LoaderDriver(batch_size={self.batch_size}, drop_last={self.drop_last}, mapped={self.mapped})"


def _groups_in_order(batch_sampler: object) -> bool:
    """Whether ``batch_sampler`` is torch's (or torchdata's) ``BatchSampler``: consecutive groups of ``batch_size``."""
    iterate = getattr(type(batch_sampler), "__iter__", None)
    return getattr(iterate, "__qualname__", "") == "BatchSampler.__iter__" and getattr(
        iterate, "__module__", ""
    ) in _GROUPERS


def find_driver(sampler: object, depth: int) -> LoaderDriver | None:
    """The DataLoader iterator that pulled ``sampler``'s first unit (``depth`` frames above the caller), if any."""
    iterator = callers.loader_iterator(depth + 1)
    return None if iterator is None else LoaderDriver(iterator, sampler)
