"""A locality-aware keyed permutation of the samples of a sharded dataset.

NOTE [ Locality-aware shuffle ]
A uniform permutation of ``n`` samples spread over ``S`` shard files touches every shard every
few positions, so a loader that reads shards from object storage must keep them all resident.
This permutation keeps the plan's guarantees (a pure function of ``(seed, epoch, position)``,
independent of the world size, a bijection on ``[0, n)``) while reading ``window`` shards at a
time:

1. the shard order is permuted per epoch (keyed): slot ``j`` holds shard ``order[j]``;
2. consecutive slots form windows of ``window`` shards; the plan reads the windows one after the
   other, so only one window (plus the one being prefetched) needs to be resident;
3. the samples of a window are permuted together (keyed per window): consecutive samples come
   from ``window`` different shards, mixed uniformly inside the window.

``window >= S`` is a single window: a uniform keyed permutation of all samples. ``window = 1``
reads shard after shard, each shuffled internally.

Cost: ``O(S)`` memory (shard order, slot and shard offsets: 32 bytes a shard, 3.2 MB at 1e5
shards, whatever the number of samples; 1e9 samples in 1e5 shards cost the same), ``O(log S)``
per position plus one window permutation per window touched (materialised up to 65,536 samples,
else a Feistel network in O(1) memory). Numpy only.
"""

from __future__ import annotations

import numpy as np

from .errors import check_int
from .permutation import MAX_SIZE, Permutation, inverse_permutation, positions_of
from .seeds import derive_seed

SHARDS = "shard-order"
WINDOW = "shard-window"
_CACHED_WINDOWS = 4  # window permutations kept: the current one and the next, with room to spare


def check_shard_sizes(name: str, sizes: object) -> np.ndarray:
    """``sizes`` as a 1-D int64 array of non-negative per-shard sample counts, or raise naming ``name``."""
    from .arrays import check_non_negative_integers, one_dimensional

    array = one_dimensional(name, sizes, sequence_of="per-shard sample counts", one="shard")
    check_non_negative_integers(name, array, holds="integer sample counts", noun="sample counts")
    array = np.ascontiguousarray(array, dtype=np.int64)
    if int(array.sum()) > MAX_SIZE:
        raise ValueError(f"{name} should sum to at most 2**62 samples, but got {int(array.sum())}")
    return array


def split_wrap(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One rank's ascending positions, and the padding wrapped back into the plan after them (fewer than ``W``).

    A rank's own positions strictly ascend, so the wrapped tail starts at the first position not
    above the one before it: with the plan's start as the wrap (``p % total``) every wrapped
    position is below the last one, and with ``LocalitySampler``'s wrap to the plan's last positions
    (NOTE [ Padding wrap ] in ``_core.plan``) a wrapped position may equal the rank's last.
    A wrapped position above the last lies in the plan's last period, read after it in order, so
    it is rightly read with the ascending part. Prefetching reads the windows ahead of the first
    part only: the wrapped few are single samples.
    """
    positions = np.asarray(positions, dtype=np.int64).ravel()
    back = np.flatnonzero(positions[1:] <= positions[:-1])
    if back.size == 0:
        return positions, positions[:0]
    return positions[: back[0] + 1], positions[back[0] + 1 :]


def _then(first: np.ndarray, more: np.ndarray) -> np.ndarray:
    """``first`` followed by the elements of ``more`` not in it, once each, in order."""
    if more.size == 0:
        return first
    merged = np.asarray(list(dict.fromkeys([*first.tolist(), *more.tolist()])), dtype=np.int64)
    return merged


class LocalityPermutation:
    """Keyed bijection on the global sample ids of sharded data that reads ``window`` shards at a time.

    Global sample ids number the samples shard by shard: shard ``s`` holds ids
    ``[starts[s], starts[s] + sizes[s])``. See NOTE [ Locality-aware shuffle ].

    Args:
        sizes: ``(S,)`` samples per shard (zeros allowed).
        window: shards whose samples are mixed together (``>= S``: a uniform permutation).
        key: 64-bit key of the epoch; derive it with :func:`shardwise._core.seeds.derive_seed`.

    Example:
        >>> perm = LocalityPermutation([3, 0, 5, 2], window=2, key=7)
        >>> sorted(perm(np.arange(10)).tolist()) == list(range(10))
        True
    """

    __slots__ = ("_key", "_order", "_shard_starts", "_slot_starts", "_window", "_window_perms", "_window_starts")
    mixing = "windows"  # streams.Mixing.WINDOWS (a str enum; streams imports this module)

    def __init__(self, sizes: object, *, window: int, key: int) -> None:
        sizes = check_shard_sizes("sizes", sizes)
        self._window = check_int("window", window, minimum=1)
        self._key = check_int("key", key, minimum=0, maximum=2**64 - 1)
        n_shards = len(sizes)
        self._shard_starts = np.zeros(n_shards + 1, dtype=np.int64)  # (S + 1,) first id of each shard
        np.cumsum(sizes, out=self._shard_starts[1:])
        # order: (S,) slot -> shard, the epoch's shard order
        self._order = Permutation(n_shards, derive_seed(self._key, SHARDS))(np.arange(n_shards))
        slot_starts = np.zeros(n_shards + 1, dtype=np.int64)  # (S + 1,) first plan position of each slot
        np.cumsum(sizes[self._order], out=slot_starts[1:])
        self._slot_starts = slot_starts
        bounds = slot_starts[:: self._window]
        if (n_shards % self._window) != 0 or n_shards == 0:
            bounds = np.append(bounds, slot_starts[-1])
        self._window_starts = bounds  # (ceil(S / window) + 1,) first plan position of each window
        self._window_perms: dict[int, Permutation] = {}

    def __len__(self) -> int:
        return int(self._shard_starts[-1])

    @property
    def window(self) -> int:
        """Shards mixed together."""
        return self._window

    @property
    def num_windows(self) -> int:
        """Windows in the plan (the last may hold fewer shards)."""
        return len(self._window_starts) - 1

    def shard_order(self) -> np.ndarray:
        """``(S,)`` shard ids in the order the plan reads them (window ``w`` is ``[w*window, (w+1)*window)``)."""
        order: np.ndarray = self._order.copy()
        return order

    def window_of(self, positions: np.ndarray) -> np.ndarray:
        """The window each plan position falls in (int64, same shape)."""
        found: np.ndarray = np.searchsorted(self._window_starts, np.asarray(positions, dtype=np.int64), side="right")
        return found - 1

    def window_shards(self, window: int) -> np.ndarray:
        """Shard ids read in window ``window``."""
        return self._order[window * self._window : (window + 1) * self._window]

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        """The shard holding each global sample id."""
        return np.searchsorted(self._shard_starts, np.asarray(ids, dtype=np.int64), side="right") - 1

    def _permutation(self, window: int) -> Permutation:
        perm = self._window_perms.get(window)
        if perm is None:
            if len(self._window_perms) >= _CACHED_WINDOWS:
                self._window_perms.pop(next(iter(self._window_perms)))
            size = int(self._window_starts[window + 1] - self._window_starts[window])
            perm = self._window_perms[window] = Permutation(size, derive_seed(self._key, WINDOW, window))
        return perm

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Global sample ids at plan ``positions`` (int array, each in ``[0, n)``), int64 of the same shape."""
        positions = np.asarray(positions, dtype=np.int64)
        flat = positions.ravel()
        windows = self.window_of(flat)  # (m,)
        mixed = np.empty_like(flat)  # plan positions after mixing inside each window
        # Positions of a chunk fall in one or two windows: one permutation call per window touched.
        for window in np.unique(windows).tolist():
            at = np.flatnonzero(windows == window)
            start = self._window_starts[window]
            mixed[at] = start + self._permutation(window)(flat[at] - start)
        # slot of each position: the first slot ending after it (empty shards are skipped)
        slots = np.searchsorted(self._slot_starts[1:], mixed, side="right")
        shards = self._order[slots]
        ids: np.ndarray = self._shard_starts[shards] + (mixed - self._slot_starts[slots])
        return ids.reshape(positions.shape)

    def positions_of(self, ids: np.ndarray) -> np.ndarray:
        """The plan positions holding global sample ``ids`` (the inverse of calling the plan), O(log S) each."""
        ids = np.asarray(ids, dtype=np.int64)
        flat = ids.ravel()
        shards = self.shard_of(flat)
        slots = inverse_permutation(self._order)[shards]
        mixed = self._slot_starts[slots] + (flat - self._shard_starts[shards])
        windows = self.window_of(mixed)
        out = np.empty_like(flat)
        for window in np.unique(windows).tolist():
            at = np.flatnonzero(windows == window)
            start = self._window_starts[window]
            out[at] = start + positions_of(self._permutation(window), mixed[at] - start)
        return out.reshape(ids.shape)

    def upcoming_shards(self, positions: np.ndarray, ahead: int) -> np.ndarray:
        """Shards of the windows ``positions`` read and of the ``ahead`` windows after, in reading order.

        Padded positions wrapped back into the plan (see :func:`split_wrap`) add only their own shards.
        """
        ahead_of, wrapped = split_wrap(positions)
        if ahead_of.size == 0:
            return ahead_of
        first = int(self.window_of(ahead_of[:1])[0])
        last = int(self.window_of(ahead_of[-1:])[0])
        order: np.ndarray = self._order[first * self._window : (last + 1 + ahead) * self._window]
        return _then(order, self.shard_of(self(wrapped)))

    def mixed_shards(self, positions: np.ndarray) -> int:
        """Shards a reader of ``positions`` mixes at once: one window."""
        return self._window

    def __repr__(self) -> str:
        return f"LocalityPermutation(n={len(self)}, shards={len(self._order)}, window={self._window})"
