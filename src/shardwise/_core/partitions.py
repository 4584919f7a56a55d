"""Partitioned locality plans: each node of a many-node run reads only its share of the shards.

NOTE [ Shard partitions ]
With one global plan dealt by position (rank ``r`` of ``W`` takes positions ``r, r + W, ...``),
every rank reads from every window of shards, so every node fetches the whole dataset. Fixing
``partitions=P`` and ``ranks_per_partition=G`` in the plan's configuration (never derived from the
world size) keeps the plan one bijection on ``[0, n)`` independent of ``W`` while making the
position decide the partition:

1. the layout (once per seed, not per epoch): the samples are cut into ``P`` partitions of exactly
   the sizes the interleave below needs (``quota_k``: the positions ``p`` in ``[0, n)`` with
   ``(p // G) % P == k``; they differ by at most ``G``). Shards go to partitions by a greedy
   balance on sample counts (largest first, keyed tie-break, to the partition with most room);
   each partition's shards are laid out smallest first, then largest to second smallest, and the
   sequence is cut at the quotas, so the few shards split between two neighbours are small ones;
2. each partition is its own stream, a :class:`~shardwise._core.locality.LocalityPermutation`
   over its pieces of shards, keyed per partition and epoch (``window`` shards at a time);
3. position ``p`` reads partition ``k = (p // G) % P`` at stream index
   ``(p // (G * P)) * G + p % G``: blocks of ``G`` positions, the partitions in turn.

When ``P * G`` divides ``W`` (``W`` a multiple of ``P * G``), rank ``r`` reads only partition
``(r // G) % P``: with torchrun's numbering (a node's ``G`` ranks are contiguous) a node reads one
partition, about ``1/P`` of the bytes, and the partition's shards can stay in its cache across
epochs. When ``W`` divides ``P * G``, a node reads ``P * G / W``... partitions, its share again;
any other ``W`` is still exact (same plan), just with more bytes per node. There is no tail: the
quotas are what the interleave consumes, so the last partial round is partition-local too. The
cost of exact quotas is at most ``P - 1`` shards split between two partitions (each fetched by
both nodes), and a resumed pass whose start is not a multiple of ``P * G`` reads other partitions
until the epoch ends. ``P = 1`` is the plain locality plan, bit for bit.

Cost: ``O(S + P)`` memory (about 64 bytes a shard: ~6.4 MB at 1e5 shards, whatever the number of
samples, 1e9 included), ``O(log S)`` per position; the layout is ``O(S log S)`` once per seed
(~0.2 s at 1e5 shards: a Python heap loop over the shards). Numpy only.

Padding (``Even.PAD``) wraps within the partition: the plan's wrap period is ``P * G``
(NOTE [ Padding wrap ] in ``_core.plan``), so padded position ``p >= n`` reads a position below ``n``
congruent to ``p`` modulo ``P * G`` (the latest first): the same partition, at the plan's end. Wrapping to the
plan's start (``p % n``, torch's rule) would read the first positions, which belong to other
partitions: a rank's one padded sample would make its node fetch a whole shard of another
partition for it (up to 1.7x a node's share of bytes on a small dataset, ``bench/bench_partitions.py``).
When ``n >= P * G`` and ``P * G`` divides ``W``, every position a rank reads, padding included, is
in its node's partition; a plan shorter than ``P * G`` wraps the positions it cannot match to
``p % n``.
"""

from __future__ import annotations

import heapq

import numpy as np

from .errors import check_int
from .locality import LocalityPermutation, check_shard_sizes, split_wrap
from .permutation import Permutation, inverse_permutation
from .seeds import derive_seed
from .streams import Mixing, StreamPermutation, locality_plan

LAYOUT = "shard-partition"
STREAM = "partition-stream"


def partition_quotas(n: int, partitions: int, ranks_per_partition: int) -> np.ndarray:
    """``(P,)`` positions of ``[0, n)`` that read each partition: ``#{p : (p // G) % P == k}``."""
    block = partitions * ranks_per_partition
    rounds, rest = divmod(n, block)
    extra = np.clip(rest - np.arange(partitions, dtype=np.int64) * ranks_per_partition, 0, ranks_per_partition)
    quotas: np.ndarray = rounds * ranks_per_partition + extra
    return quotas


class PartitionLayout:
    """The fixed cut of a sharded dataset into ``partitions`` streams (see NOTE [ Shard partitions ]).

    Args:
        sizes: ``(S,)`` samples per shard.
        partitions: ``P``, the number of partitions (a number of nodes the world size fits).
        ranks_per_partition: ``G``, consecutive positions that read one partition (ranks per node).
        key: 64-bit key of the layout (derived from the seed only: the same layout every epoch).

    Example:
        >>> layout = PartitionLayout([5, 3, 4, 4], partitions=2, ranks_per_partition=1, key=3)
        >>> layout.quotas.tolist()
        [8, 8]
    """

    __slots__ = ("cuts", "partitions", "piece_bounds", "piece_shards", "quotas", "ranks_per_partition",
                 "seq_order", "seq_starts", "shard_starts")  # fmt: skip

    def __init__(self, sizes: object, *, partitions: int, ranks_per_partition: int, key: int) -> None:
        sizes = check_shard_sizes("sizes", sizes)
        self.partitions = check_int("partitions", partitions, minimum=1)
        self.ranks_per_partition = check_int("ranks_per_partition", ranks_per_partition, minimum=1)
        key = check_int("key", key, minimum=0, maximum=2**64 - 1)
        n_shards = len(sizes)
        self.shard_starts = np.zeros(n_shards + 1, dtype=np.int64)  # (S + 1,) first global id of each shard
        np.cumsum(sizes, out=self.shard_starts[1:])
        n = int(self.shard_starts[-1])
        self.quotas = partition_quotas(n, self.partitions, self.ranks_per_partition)  # (P,)
        self.cuts = np.zeros(self.partitions + 1, dtype=np.int64)  # (P + 1,) first sequence position of each
        np.cumsum(self.quotas, out=self.cuts[1:])
        self.seq_order = _balanced_sequence(sizes, self.quotas, key)  # (S,) sequence slot -> shard
        self.seq_starts = np.zeros(n_shards + 1, dtype=np.int64)  # (S + 1,) first sequence position of each slot
        np.cumsum(sizes[self.seq_order], out=self.seq_starts[1:])
        # Pieces: the sequence cut at both shard boundaries and partition cuts; each lies in one
        # shard and one partition. piece_bounds: (pieces + 1,), piece_shards: (pieces,).
        bounds = np.union1d(self.seq_starts, self.cuts)
        self.piece_bounds = bounds
        self.piece_shards = self.seq_order[self._slot_of(bounds[:-1])] if n_shards else bounds[:0]

    def _slot_of(self, positions: np.ndarray) -> np.ndarray:
        # the first slot ending after each sequence position (empty shards are skipped)
        found: np.ndarray = np.searchsorted(self.seq_starts[1:], positions, side="right")
        return found

    def partition_pieces(self, partition: int) -> tuple[int, int]:
        """Pieces ``[first, stop)`` of ``partition`` (indices into ``piece_bounds``/``piece_shards``)."""
        first = int(np.searchsorted(self.piece_bounds, self.cuts[partition], side="left"))
        stop = int(np.searchsorted(self.piece_bounds, self.cuts[partition + 1], side="left"))
        return first, max(first, stop)

    def ids_of(self, partition: int, local: np.ndarray) -> np.ndarray:
        """Global sample ids of ``partition``'s stream samples ``local`` (its numbering, piece by piece)."""
        sequence = self.cuts[partition] + np.asarray(local, dtype=np.int64)
        slots = self._slot_of(sequence)
        ids: np.ndarray = self.shard_starts[self.seq_order[slots]] + (sequence - self.seq_starts[slots])
        return ids

    def locals_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(partition, local sample)`` of global sample ``ids`` (the inverse of :meth:`ids_of`)."""
        ids = np.asarray(ids, dtype=np.int64)
        shards = np.searchsorted(self.shard_starts[1:], ids, side="right")
        slots = inverse_permutation(self.seq_order)[shards]
        sequence = self.seq_starts[slots] + (ids - self.shard_starts[shards])
        partitions = np.searchsorted(self.cuts[1:], sequence, side="right")
        return partitions, sequence - self.cuts[partitions]

    def shard_bytes(self, file_sizes: object) -> np.ndarray:
        """``(P,)`` bytes of the shards each partition reads (a split shard counts for both sides)."""
        file_sizes = np.asarray(file_sizes, dtype=np.int64)
        out = np.zeros(self.partitions, dtype=np.int64)
        for k in range(self.partitions):
            first, stop = self.partition_pieces(k)
            out[k] = file_sizes[np.unique(self.piece_shards[first:stop])].sum()
        return out


def _balanced_sequence(sizes: np.ndarray, quotas: np.ndarray, key: int) -> np.ndarray:
    """``(S,)`` shard ids, partition after partition, each partition's total close to its quota."""
    n_shards, parts = len(sizes), len(quotas)
    keyed = Permutation(n_shards, derive_seed(key, LAYOUT))(np.arange(n_shards, dtype=np.int64))
    largest_first = keyed[np.argsort(-sizes[keyed], kind="stable")]
    # Greedy: each shard to the partition with the most room left (ties: the lowest partition).
    room = [(-int(q), k) for k, q in enumerate(quotas.tolist())]
    heapq.heapify(room)
    members: list[list[int]] = [[] for _ in range(parts)]
    for shard, size in zip(largest_first.tolist(), sizes[largest_first].tolist(), strict=True):
        negative, k = heapq.heappop(room)
        members[k].append(shard)
        heapq.heappush(room, (negative + size, k))
    # Smallest first, then largest to second smallest: the cuts fall in (or near) small shards.
    sequence = [m[-1:] + m[:-1] for m in members]
    return np.asarray([s for part in sequence for s in part], dtype=np.int64)


class PartitionedPermutation:
    """One epoch's plan over a :class:`PartitionLayout`: ``P`` locality streams interleaved by ``G`` positions.

    Args:
        layout: the partitions (fixed for the run).
        window: shards mixed together within a partition's stream.
        key: 64-bit key of the epoch; ``None``: no shuffle (each stream in layout order).
        mixing: how each partition mixes its ``window`` shards (windows, or staggered streams).

    Example:
        >>> layout = PartitionLayout([5, 3, 4, 4], partitions=2, ranks_per_partition=1, key=3)
        >>> perm = PartitionedPermutation(layout, window=1, key=9)
        >>> sorted(perm(np.arange(16)).tolist()) == list(range(16))
        True
    """

    __slots__ = ("_layout", "_streams", "_window", "mixing")

    def __init__(self, layout: PartitionLayout, *, window: int, key: int | None,
                 mixing: Mixing = Mixing.WINDOWS) -> None:
        self._layout = layout
        self._window = check_int("window", window, minimum=1)
        self.mixing = Mixing(mixing)
        self._streams: list[LocalityPermutation | StreamPermutation | None] = []
        for k in range(layout.partitions):
            first, stop = layout.partition_pieces(k)
            pieces = np.diff(layout.piece_bounds[first : stop + 1]) if stop > first else np.zeros(1, np.int64)
            keyed = None if key is None else derive_seed(key, STREAM, k)
            plan = None if keyed is None else locality_plan(pieces, window=window, mixing=mixing, key=keyed)
            self._streams.append(plan)

    def __len__(self) -> int:
        return int(self._layout.cuts[-1])

    @property
    def window(self) -> int:
        """Shards mixed together within a partition."""
        return self._window

    def partition_of(self, positions: np.ndarray) -> np.ndarray:
        """The partition each plan position reads: ``(p // G) % P``."""
        layout = self._layout
        found: np.ndarray = (np.asarray(positions, dtype=np.int64) // layout.ranks_per_partition) % layout.partitions
        return found

    def _stream_index(self, positions: np.ndarray) -> np.ndarray:
        g, p = self._layout.ranks_per_partition, self._layout.partitions
        index: np.ndarray = (positions // (g * p)) * g + positions % g
        return index

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Global sample ids at plan ``positions`` (each in ``[0, n)``), int64 of the same shape."""
        positions = np.asarray(positions, dtype=np.int64)
        flat = positions.ravel()
        parts = self.partition_of(flat)
        within = self._stream_index(flat)
        ids = np.empty_like(flat)
        for k in np.unique(parts).tolist():
            at = np.flatnonzero(parts == k)
            stream = self._streams[k]
            local = within[at] if stream is None else stream(within[at])
            ids[at] = self._layout.ids_of(k, local)
        return ids.reshape(positions.shape)

    def positions_of(self, ids: np.ndarray) -> np.ndarray:
        """The plan positions holding global sample ``ids`` (the inverse of calling the plan)."""
        ids = np.asarray(ids, dtype=np.int64)
        parts, local = self._layout.locals_of(ids.ravel())
        g, p = self._layout.ranks_per_partition, self._layout.partitions
        out = np.empty_like(local)
        for k in np.unique(parts).tolist():
            at = np.flatnonzero(parts == k)
            stream = self._streams[k]
            within = local[at] if stream is None else stream.positions_of(local[at])
            out[at] = ((within // g) * p + k) * g + within % g
        return out.reshape(ids.shape)

    def upcoming_shards(self, positions: np.ndarray, ahead: int) -> np.ndarray:
        """Shards read at ``positions`` and in the ``ahead`` windows after, in reading order.

        Only the partitions ``positions`` read (a rank's own positions: its node's partition when
        ``P * G`` divides the world size); their windows taken in turn, a split shard once. Padded
        positions wrapped back into the plan (below the rank's last) add only the shards they read.
        """
        positions, wrapped = split_wrap(positions)
        if positions.size == 0:
            return positions
        parts = self.partition_of(positions)
        within = self._stream_index(positions)
        lists = []
        for k in dict.fromkeys(parts.tolist()):
            first, _ = self._layout.partition_pieces(k)
            local = within[parts == k]
            stream = self._streams[k]
            if stream is None:
                sequence = self._layout.cuts[k] + local
                pieces = np.unique(np.searchsorted(self._layout.piece_bounds, sequence, side="right") - 1)
                lists.append(self._layout.piece_shards[pieces])
                continue
            lists.append(self._layout.piece_shards[first + stream.upcoming_shards(local, ahead)])
        # The padding wrapped back into the plan: its own shards only, last.
        lists.append(np.searchsorted(self._layout.shard_starts[1:], self(wrapped), side="right"))
        taken = [s for row in _interleave(lists[:-1]) for s in row] + lists[-1].tolist()
        return np.asarray(list(dict.fromkeys(taken)), dtype=np.int64)

    def mixed_shards(self, positions: np.ndarray) -> int:
        """Shards a reader of ``positions`` mixes at once: those of each partition read (padding aside)."""
        read = np.unique(self.partition_of(split_wrap(positions)[0])).tolist()
        return sum(self._window if stream is None else stream.mixed_shards(positions)
                   for stream in (self._streams[k] for k in read))

    def __repr__(self) -> str:
        layout = self._layout
        return (f"PartitionedPermutation(n={len(self)}, partitions={layout.partitions}, "
                f"ranks_per_partition={layout.ranks_per_partition}, window={self._window})")  # fmt: skip


def _interleave(lists: list[np.ndarray]) -> list[list[int]]:
    """Rows of one element of each list in turn (``[a0, b0], [a1, b1], ...``), for round-robin prefetch."""
    rows: list[list[int]] = []
    longest = max((len(x) for x in lists), default=0)
    for i in range(longest):
        rows.append([int(x[i]) for x in lists if i < len(x)])
    return rows
