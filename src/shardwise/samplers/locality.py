"""``LocalitySampler``: the global plan over sharded data, reading a window of shards at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from .._core.arrays import digest
from .._core.errors import check_choice, check_int
from .._core.locality import LocalityPermutation, check_shard_sizes
from .._core.partitions import PartitionedPermutation, PartitionLayout
from .._core.seeds import derive_seed
from .._core.state import Fingerprint
from .._core.streams import PLAN_VERSION, Mixing, StreamPermutation, locality_plan
from .._core.world import World
from .identity import with_data
from .keywords import ShuffledKeywords
from .passes import UnitSource
from .sized import SizedPlanSampler

if TYPE_CHECKING:
    from typing_extensions import Unpack

SHUFFLE = "locality-shuffle"
LAYOUT = "locality-partitions"
WINDOW = 10
"""The default ``window``: streams give about 1/10 consecutive samples from one shard, on any layout."""
Plan = LocalityPermutation | StreamPermutation | PartitionedPermutation


@runtime_checkable
class ShardedData(Protocol):
    """What the sampler needs of a sharded source: samples per shard, global ids shard by shard."""

    @property
    def shard_sizes(self) -> np.ndarray: ...


@runtime_checkable
class PlanListener(Protocol):
    """A source that prefetches shards in plan order (``shardwise.data.sharded.ShardedSource``)."""

    def follow_plan(self, permutation: Plan, positions: np.ndarray) -> None: ...


class _Followed(list[int]):
    """A chunk's ids, handed out ``step`` at a time: before each step, the plan's listener is told where the reading is.

    The base shell hands out a chunk's :meth:`pieces` one list iterator each, so every id is handed
    out by C (a Python iterator called per id cost ~0.2 us an id in the main process).
    """

    def __init__(self, ids: list[int], positions: np.ndarray, step: int, follow: Callable[[np.ndarray], None]) -> None:
        super().__init__(ids)
        self._positions, self._step, self._follow = positions, step, follow

    def pieces(self) -> Iterator[list[int]]:
        """The chunk's ids, ``step`` a piece; the listener hears of a piece's positions as its first id is pulled."""
        step = self._step
        for i in range(0, len(self), step):
            self._follow(self._positions[i : i + 8 * step])  # about two windows ahead
            yield self[i : i + step]


class LocalitySampler(SizedPlanSampler):
    """A ``DistributedSampler`` over sharded data whose shuffle reads ``window`` shards at a time.

    The plan is :class:`~shardwise._core.streams.StreamPermutation` (NOTE [ Staggered streams ]):
    the shard order permuted per epoch and cut into ``window`` streams of about equal samples; each
    stream reads one shard at a time, the streams interleaved, so shards start and end one at a
    time and the node cache holds about ``window + 2`` shards. About ``1/window`` of consecutive
    samples come from one shard, on even and uneven shards alike (a shard holding more than
    ``1/window`` of the samples is read across the epoch, as a uniform shuffle reads it):
    ``bench/bench_sharded_sources.py`` measures 0.08 at the default ``window=10`` on even shards,
    and within twice a uniform shuffle's on 53 shards of sizes spread 1:1000. With
    ``mixing="windows"`` the plan is :class:`~shardwise._core.locality.LocalityPermutation` (NOTE
    [ Locality-aware shuffle ], the default before plan 2): the samples of ``window`` shards mixed,
    then the next ``window``; it holds two windows and, on uneven shards, mixes far less. Like
    every shardwise plan it is a function of ``(seed, epoch, position)`` only: equal steps on every
    rank, exact resume at any world size, in O(1). When the dataset can prefetch
    (``ShardedSource``), each pass tells it which shards this rank reads next.

    Many nodes (NOTE [ Shard partitions ] in ``shardwise._core.partitions``): with ``partitions=P``
    and ``ranks_per_partition=G`` (e.g. the GPUs of a node), the samples are cut once into ``P``
    balanced partitions and position ``p`` reads partition ``(p // G) % P``. The plan stays one
    bijection independent of the world size (exact resume at any ``W``); when ``W`` is a multiple
    of ``P * G`` and a node's ``G`` ranks are consecutive (torchrun), each node reads only its
    partition, about ``1/P`` of the bytes. Both are plan configuration (in the state's
    fingerprint), never derived from the world.

    With ``drop_last=False`` the padding of the last step (fewer than ``W`` samples) reads the
    plan's last positions, not its start (torch's rule): the wrap period is ``P * G`` (NOTE
    [ Padding wrap ] in ``shardwise._core.plan``), so each padded position reads one of its slot
    of the period, the latest first: without partitions (``P = G = 1``) the plan's last samples,
    backwards (distinct, as torch's are), and with partitions ones of the same partition (when the
    data holds at least ``P * G`` samples). The
    shards of the plan's end are the ones the node holds as the epoch ends; the plan's first ones
    may have been evicted, and were fetched again whole for a padded sample each under a budget
    (4 ranks a node, 24 shards: 1.077x the dataset; ``tests/data/test_sharded_node_bytes.py``).

    Cost at 1e9 samples in 1e5 shards: ~3.2 MB per rank (shard offsets and order), independent of
    the number of samples; about twice that with partitions (the layout and one stream a
    partition), plus a one-off ~0.2 s greedy layout per seed (``bench/bench_partitions.py``
    measured 9.5 MiB of private memory per rank with one partition, 17 MiB with 8, chunk buffers
    included); O(log shards) per index.

    Args:
        dataset: a source with ``shard_sizes`` (``ShardedSource``) or the samples per shard.
        window: shards mixed together (the node cache should hold ``window + 6`` shards, two windows
            with ``mixing="windows"``); ``>=`` the number of shards is a uniform shuffle.
        mixing: ``"streams"`` (default: each of ``window`` streams reads one shard at a time) or
            ``"windows"`` (one window of shards, then the next: the default of plan 1). Part of the
            plan: a checkpoint resumes only with the same ``mixing`` (and a streams checkpoint only
            with the same plan version, ``shardwise._core.streams.PLAN_VERSION``).
        partitions: partitions of the shards (``P``); 1: one global stream (the plain plan).
        ranks_per_partition: consecutive positions reading one partition (``G``, the ranks of a
            node); ignored when ``partitions=1``.
        shuffle: shuffle (else shard by shard, in order, like ``ShardedSampler(shuffle=False)``; with
            partitions, each partition's shards in its layout order, the partitions interleaved).
        seed: base seed, identical on every rank.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: cut the tail so ranks get equal lengths, instead of padding it by wrapping
            (within the partition, with partitions).

    Example:
        >>> sampler = LocalitySampler([4, 3, 5], window=2, num_replicas=2, rank=0, seed=1)
        >>> len(sampler)
        6
    """

    _CHUNK = 1 << 16
    _FIRST_CHUNK = 1 << 10

    def __init__(
        self,
        dataset: Any,
        *,
        window: int = WINDOW,
        mixing: str = "streams",
        partitions: int = 1,
        ranks_per_partition: int = 1,
        **options: Unpack[ShuffledKeywords],
    ) -> None:
        sizes = dataset.shard_sizes if isinstance(dataset, ShardedData) else dataset
        self._sizes = check_shard_sizes("dataset" if sizes is dataset else "dataset.shard_sizes", sizes)
        self._size = int(self._sizes.sum())
        # torch's attribute is the data: the source, or (given samples per shard) the number of samples.
        self.dataset: Any = dataset if isinstance(dataset, ShardedData) else self._size
        self.window = check_int("window", window, minimum=1)
        self.mixing = check_choice("mixing", mixing, Mixing)
        self.partitions = check_int("partitions", partitions, minimum=1)
        self.ranks_per_partition = check_int("ranks_per_partition", ranks_per_partition, minimum=1)
        self._layout: tuple[int, PartitionLayout] | None = None  # (seed, layout): fixed for the run
        keywords = self._read_keywords(options)
        self.shuffle = keywords.shuffle  # drop_last: the shell's, from keywords.even
        self._init_plan(keywords)

    def permutation(self, epoch: int) -> Plan | None:
        """The plan of ``epoch`` (``None`` without shuffling and partitions: ids in shard order)."""
        return self._plan(self.seed, epoch)

    def partition_layout(self, seed: int | None = None) -> PartitionLayout | None:
        """The fixed cut into partitions (``None`` when ``partitions=1``); one per seed, built once."""
        if self.partitions == 1:
            return None
        seed = self.seed if seed is None else seed
        if self._layout is None or self._layout[0] != seed:
            layout = PartitionLayout(self._sizes, partitions=self.partitions,
                                     ranks_per_partition=self.ranks_per_partition, key=derive_seed(seed, LAYOUT))
            self._layout = (seed, layout)
        return self._layout[1]

    def _plan(self, seed: int, epoch: int) -> Plan | None:
        key = derive_seed(seed, epoch, SHUFFLE) if self.shuffle else None
        layout = self.partition_layout(seed)
        if layout is not None:
            return PartitionedPermutation(layout, window=self.window, key=key, mixing=self.mixing)
        return None if key is None else locality_plan(self._sizes, window=self.window, mixing=self.mixing, key=key)

    def _plan_size(self, epoch: int) -> int:
        return self._size

    def _wrap_period(self) -> int:
        """``P * G``: padding reads the plan's last positions (its own partition's, NOTE [ Shard partitions ])."""
        return self.partitions * self.ranks_per_partition

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        permutation = self._plan(seed, epoch)
        if permutation is None:
            return np.ndarray.tolist
        # A query (shardwise.which) asks about every rank's positions: nothing to prefetch for it.
        listener = self.dataset if isinstance(self.dataset, PlanListener) and world.source != "query" else None
        # The cache is told where the reading is every quarter of a window's samples on this rank,
        # so that it evicts what was read, not what comes next (a chunk spans many windows).
        step = max(32, self.window * self._size // max(1, 4 * len(self._sizes) * world.world_size))

        def units(positions: np.ndarray) -> list[int]:
            ids: list[int] = permutation(positions).tolist()
            if listener is None:
                return ids
            return _Followed(ids, positions, step, lambda rest: listener.follow_plan(permutation, rest))

        return units

    def _id_count(self) -> int:
        return self._size

    def _plan_positions_of(self, epoch: int, index: int) -> np.ndarray:
        """The one position holding ``index``: the plan inverted, O(log shards) (provenance)."""
        index = check_int("index", index, minimum=0, maximum=self._size - 1)
        return self._positions_of_ids(epoch, np.asarray([index], dtype=np.int64))

    def _positions_of_ids(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """The position of each id (``skip_ids``, ``when``): the plan inverted, vectorised, O(log shards) each."""
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self._size):
            raise ValueError(f"sample ids should be in [0, {self._size - 1}], but got ids up to {int(ids.max())}")
        permutation = self._plan(self.seed, epoch)
        if permutation is None:
            return np.asarray(ids, dtype=np.int64)
        found: np.ndarray = permutation.positions_of(np.asarray(ids, dtype=np.int64))
        return found

    def _fingerprint(self) -> Fingerprint:
        fingerprint: Fingerprint = {}
        if self.mixing is not Mixing.WINDOWS:  # absent for windows: states of the window plan still load
            # First: a state of the earlier default (windows) is refused naming mixing, of streams' plan 1 naming plan.
            fingerprint.update(mixing=self.mixing.value, plan=PLAN_VERSION)
        fingerprint.update(
            num_samples=self._size, shard_sizes=digest(self._sizes), window=self.window, shuffle=self.shuffle
        )
        if self.partitions > 1:  # absent for one partition: states saved before partitions existed still load
            fingerprint.update(partitions=self.partitions, ranks_per_partition=self.ranks_per_partition)
        return with_data(fingerprint, self.dataset)

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"window": self.window, "shuffle": self.shuffle, "drop_last": self.drop_last}
        if self.partitions > 1:
            config.update(partitions=self.partitions, ranks_per_partition=self.ranks_per_partition)
        if self.mixing is not Mixing.STREAMS:  # the default
            config.update(mixing=self.mixing.value)
        return config

    def _data_repr(self) -> str:
        return f"n={self._size}, shards={len(self._sizes)}"
