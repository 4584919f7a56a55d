"""``ShardedSampler``: a drop-in ``DistributedSampler`` with O(1) memory, resume and lazy ranks."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core.errors import check_int
from .._core.permutation import Permutation, positions_of
from .._core.seeds import INDEX_SHUFFLE, derive_seed
from .._core.state import Fingerprint
from .._core.world import World
from .identity import with_data
from .inputs import dataset_size
from .keywords import ShuffledKeywords, positional_keywords, positional_signature
from .passes import UnitSource
from .sized import SizedPlanSampler

if TYPE_CHECKING:
    from typing_extensions import Unpack

_TORCH_POSITIONAL = ("num_replicas", "rank", "shuffle", "seed", "drop_last")
"""``DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last)``: NOTE [ Drop-in signature ]."""


class ShardedSampler(SizedPlanSampler):
    """``torch.utils.data.DistributedSampler``, with O(1) memory, O(1) resume and lazy ranks.

    Same lengths as torch's sampler (``num_samples``, ``total_size``, strided dealing, padding by
    wrapping or ``drop_last``) and, with ``shuffle=False``, exactly the same indices. With
    ``shuffle=True`` the order comes from a keyed permutation computed position by position, so
    no rank ever materialises ``randperm(n)`` (torch's costs ~44 bytes a sample per rank).

    NOTE [ Drop-in signature ]: it takes torch's calls: ``ShardedSampler(dataset, num_replicas,
    rank, shuffle, seed, drop_last)`` positionally or by keyword (the only shardwise sampler whose
    shared keywords may be positional: it stands in for torch's), "Invalid rank" errors,
    ``ShardedSampler[int]``, ``drop_last``/``dataset`` assigned between epochs (read by the next
    pass, as torch reads them when iterating; checked, and refused mid-epoch; ``shuffle`` is a
    plain attribute, as torch's, read by every pass), and subclasses that yield their own indices
    and assign ``num_samples``/``total_size`` (torch's ``ElasticDistributedSampler``; ``len()`` is
    then ``num_samples``, as torch's; a subclass that keeps this ``__iter__`` may assign only the
    plan's own length: NOTE [ Assigned num_samples ] in ``sized``).

    Differences by design: the shuffled order is not torch's (same lengths, another uniform
    permutation); without ``set_epoch`` the epoch advances after every complete pass (torch
    repeats epoch 0's order); ``state_dict``/``load_state_dict`` resume mid-epoch; rank and world
    size are resolved when iterated, not when built.

    Being a ``DistributedSampler`` subclass, frameworks keep it in place and call its
    ``set_epoch``.

    Args:
        dataset: a sized dataset, or its length as an int.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        shuffle: shuffle the order, differently every epoch.
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        drop_last: cut the tail so ranks get equal lengths, instead of padding it by wrapping.

    Example:
        >>> sampler = ShardedSampler(10, num_replicas=2, rank=1, seed=7)
        >>> len(sampler)
        5
        >>> sorted(set(sampler) | set(ShardedSampler(10, num_replicas=2, rank=0, seed=7)))
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]

    .. warning::
        Like torch's sampler, call ``sampler.set_epoch(epoch)`` before each epoch when you can;
        without it the epoch still advances after every complete pass.
    """

    # Sized for the permutation: chunks of 64Ki positions amortise numpy's per-call cost, and
    # chunks growing from 1Ki keep the first batch (and the first after a resume) near 1 ms.
    _CHUNK = 1 << 16
    _FIRST_CHUNK = 1 << 10

    def __init__(self, dataset: Any, *positional: Any, **options: Unpack[ShuffledKeywords]) -> None:
        if positional:  # torch's order (NOTE [ Drop-in signature ]); the shell checks the values
            options = positional_keywords(  # type: ignore[assignment]
                type(self).__name__, "dataset", _TORCH_POSITIONAL, positional, options
            )
        self._dataset = dataset
        self._size = dataset_size(dataset)
        keywords = self._read_keywords(options)
        self.shuffle = keywords.shuffle  # a plain attribute, as torch's: read by every pass (and by `shardwise verify`)
        self._init_plan(keywords)

    @property
    def dataset(self) -> Any:
        """The data (torch's attribute); assigned between epochs, the next pass samples the new data."""
        return self._dataset

    @dataset.setter
    def dataset(self, dataset: Any) -> None:
        size = dataset_size(dataset)
        self._refuse_mid_epoch("dataset")
        self._dataset, self._size = dataset, size

    def _plan_size(self, epoch: int) -> int:
        return self._size

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        if not self.shuffle:
            return np.ndarray.tolist
        permutation = Permutation(self._size, derive_seed(seed, epoch, INDEX_SHUFFLE))
        return lambda positions: permutation(positions).tolist()

    def _id_count(self) -> int:
        return self._size

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """The one position holding ``index``: the inverse permutation, O(1) (provenance)."""
        index = check_int("index", index, minimum=0, maximum=self._size - 1)
        if not self.shuffle:
            return np.asarray([index], dtype=np.int64)
        return positions_of(Permutation(self._size, derive_seed(self.seed, epoch, INDEX_SHUFFLE)), np.asarray([index]))

    def _positions_of_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """The position of each id (``skip_ids``): the inverse permutation, vectorised, O(1) each."""
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self._size):
            raise ValueError(f"sample ids should be in [0, {self._size - 1}], but got ids up to {int(ids.max())}")
        if not self.shuffle:
            return np.asarray(ids, dtype=np.int64)
        return positions_of(Permutation(self._size, derive_seed(self.seed, epoch, INDEX_SHUFFLE)), ids)

    def _fingerprint(self) -> Fingerprint:
        return with_data({"num_samples": self._size, "shuffle": self.shuffle}, self.dataset)

    def _config(self) -> dict[str, Any]:
        return {"shuffle": self.shuffle, "drop_last": self.drop_last}

    def _data_repr(self) -> str:
        return f"n={self._size}"


# NOTE [ Drop-in signature ]: help() and inspect.signature show torch's DistributedSampler parameters.
ShardedSampler.__init__.__signature__ = positional_signature(  # type: ignore[attr-defined]
    inspect.signature(ShardedSampler.__init__), ("self", "dataset", *_TORCH_POSITIONAL)
)
ShardedSampler.__signature__ = positional_signature(inspect.signature(ShardedSampler), ("dataset", *_TORCH_POSITIONAL))
