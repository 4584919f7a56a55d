"""Class-balanced arithmetic: samples grouped by class, and an epoch's P x K layout computed batch by batch.

Two parts, with the one O(n) structure built once per input and shared:

- **The class index** (:func:`.class_index.count_classes`, :func:`.class_buckets.group_by_class`):
  the distinct labels, their counts and every sample index grouped by class (a counting sort in
  two local passes: private memory O(classes + chunk), output written in place, so it can be a
  file every process memory-maps). Within a class the samples keep their
  dataset order, so the index is the same on every machine.
- **The layout** (:class:`EpochLayout`): per epoch, O(classes + P) numbers say which class and
  which use of it every cell of every batch holds, computed for any batch from its position.

The layout. Class ``c`` gets ``q_c <= B`` slots (``class_quotas``); the slots are laid out by
class, in a keyed class order, and cut into ``P`` columns of ``B`` slots. A batch takes one cell
per column. Column 0 is read through a keyed permutation ``f_0`` of the ``B`` rows, and column
``k + 1`` through ``f_(k+1) = G_(k+1)(f_k)``, where ``G`` is a keyed bijection of ``[0, B)``
constrained only where a class straddles the boundary between the two columns (its ``B - a``
cells at the end of column ``k`` and its ``b <= a`` cells at the start of column ``k + 1``):
``G`` never sends a row holding that class in column ``k`` to its cells in column ``k + 1``. Every
other class lies in one column, and columns are distinct, so a batch always holds ``P``
distinct classes; and since every ``G`` is otherwise a random bijection, a class meets random
classes, not the ones laid out beside it. Batch ``r`` of the plan is row ``r``: ``P`` evaluations
of ``G`` (two keyed permutations each) and a binary search per cell, O(P log C).

Within a class, its uses take ``K`` samples at a time from successive keyed shuffles of the
class (cycles); the shuffle of (class, cycle) is a keyed Feistel permutation with per-element
domain and key, vectorised over a whole chunk of batches at once (no per-class table).
"""

from __future__ import annotations

import numpy as np

from .permutation import GOLDEN, Permutation, feistel_rounds, mix64
from .seeds import derive_seed

__all__ = [
    "EpochLayout",
    "class_quotas",
    "keyed_shuffle",
    "member_keys",
    "member_ranks",
]

LINK_TABLE_MAX = 1 << 10
"""Links over more rows than this are Feistel permutations: 2P of them per epoch must start fast."""

QUOTA = "class-balanced-quota"
CLASSES = "class-balanced-classes"
ROWS = "class-balanced-rows"
LINK = "class-balanced-link"
MEMBERS = "class-balanced-members"

_ROUNDS = 6


# -- quotas ------------------------------------------------------------------------------------
def class_quotas(sizes: np.ndarray, slots: int, cap: int, words: np.ndarray) -> np.ndarray:
    """Slots per class in proportion to ``sizes``, summing to ``slots``, each at most ``cap``.

    Integer arithmetic only. Exact shares ``slots * n_c / N`` are floored; the few missing slots go
    out by systematic sampling: class ``c`` gets one more with probability equal to the fraction
    of its share (so a class whose share is 0.2 slots takes part in about one epoch in five, where
    rounding would leave it out of every epoch), and exactly as many slots as missing go out.
    Classes whose share exceeds ``cap`` get ``cap`` and the rest is re-shared among the others.

    Args:
        sizes: ``(C,)`` positive int64 class sizes.
        slots: total slots, at most ``cap * C``.
        cap: most slots one class may get.
        words: ``(C + 1,)`` random uint64: the order of the systematic pass and its offset.

    Returns:
        ``(C,)`` int64 quotas.
    """
    count = len(sizes)
    capped = np.zeros(count, dtype=bool)
    while True:
        budget = slots - cap * int(capped.sum())
        total = int(sizes[~capped].sum())
        share = budget * sizes
        quota, remainder = np.divmod(share, total)
        over = ~capped & ((quota > cap) | ((quota == cap) & (remainder > 0)))
        if not over.any():
            break
        capped |= over
    quota[capped], remainder[capped] = cap, 0
    # Systematic sampling: points offset + k * total on the line of the remainders laid end to
    # end in a random class order; a class gets one more slot per point in its interval (< 1).
    order = np.argsort(words[:count])  # numpy's SIMD sort; the stable order itself when no two words tie
    ordered = words[order]
    if bool((ordered[1:] == ordered[:-1]).any()):
        order = np.argsort(words[:count], kind="stable")
    ends = np.cumsum(remainder[order])
    offset = int(words[count] % np.uint64(total))
    points_before_end = -((offset - ends) // total)  # ceil((end - offset) / total)
    quota[order] += np.diff(points_before_end, prepend=0)
    return quota


# -- the layout --------------------------------------------------------------------------------
class EpochLayout:
    """Which class, and which use of it, each of the ``P`` cells of any batch of one epoch holds.

    O(C + P) memory; see the module docstring for the construction.

    Args:
        sizes: ``(C,)`` int64 sizes of the usable classes.
        classes_per_batch, num_batches: ``P`` and ``B``, with ``P <= C``.
        seed, epoch: the keys of every random choice.
    """

    __slots__ = ("_ends", "_first", "_links", "_order", "_runs", "num_batches")

    def __init__(self, sizes: np.ndarray, *, classes_per_batch: int, num_batches: int, seed: int, epoch: int) -> None:
        count, rows = len(sizes), num_batches
        self.num_batches = rows
        words = np.random.PCG64(derive_seed(seed, epoch, QUOTA)).random_raw(count + 1)  # raw words: stable, fast
        quota = class_quotas(sizes, rows * classes_per_batch, rows, words)
        self._order = Permutation(count, derive_seed(seed, epoch, CLASSES))(np.arange(count, dtype=np.int64))
        self._runs = quota[self._order]
        self._ends = np.cumsum(self._runs)  # exclusive end slot of each class's run, in layout order
        self._first = Permutation(rows, derive_seed(seed, epoch, ROWS))
        # One link per column boundary: (a, b, g1 on [0, a), g2 on [0, B - b)).
        self._links: list[tuple[int, int, Permutation, Permutation]] = []
        for column in range(1, classes_per_batch):
            boundary = column * rows
            run = int(np.searchsorted(self._ends, boundary - 1, side="right"))  # the run holding slot boundary - 1
            end = int(self._ends[run])
            if end > boundary:  # straddles: cells [a, B) of the previous column, [0, b) of this one
                a, b = int(end - self._runs[run]) - (column - 1) * rows, end - boundary
            else:
                a, b = rows, 0
            self._links.append(
                (
                    a,
                    b,
                    Permutation(a, derive_seed(seed, epoch, LINK, column, 0), table_max=LINK_TABLE_MAX),
                    Permutation(rows - b, derive_seed(seed, epoch, LINK, column, 1), table_max=LINK_TABLE_MAX),
                )
            )

    def cells(self, batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(class, use)`` of every cell of the given batches: two ``(m, P)`` int64 arrays.

        ``class`` indexes the usable classes; ``use`` counts that class's earlier slots this epoch.
        """
        rows = self.num_batches
        x = self._first(np.asarray(batches, dtype=np.int64))
        slots = np.empty((len(x), len(self._links) + 1), dtype=np.int64)
        slots[:, 0] = x
        for column, (a, b, inner, outer) in enumerate(self._links, start=1):
            x = _link(x, a, b, inner, outer)
            slots[:, column] = column * rows + x
        run = np.searchsorted(self._ends, slots, side="right")
        use = slots - (self._ends[run] - self._runs[run])
        found: np.ndarray = self._order[run]
        return found, use


def _link(x: np.ndarray, a: int, b: int, inner: Permutation, outer: Permutation) -> np.ndarray:
    """``G(x)``: a keyed bijection of ``[0, B)`` that sends ``[a, B)`` into ``[b, B)`` (``b <= a``).

    ``x < a`` goes through ``inner`` (on ``[0, a)``); a result below ``b`` is final. Every other
    point, ``inner``'s results ``[b, a)`` and the inputs ``[a, B)``, is numbered ``t`` in
    ``[0, B - b)`` and sent to ``b + outer(t)``. So only rows of ``[0, a)`` reach ``[0, b)``.
    """
    out = np.empty_like(x)
    pooled = np.empty_like(x)
    low = x < a
    z = inner(x[low]) if low.any() else x[:0]
    direct = z < b
    low_at = np.flatnonzero(low)
    out[low_at[direct]] = z[direct]
    pooled[low_at] = z - b
    high = ~low
    pooled[high] = (a - b) + (x[high] - a)
    rest = np.ones(len(x), dtype=bool)
    rest[low_at[direct]] = False
    if rest.any():
        out[rest] = b + outer(pooled[rest])
    return out


# -- within a class ----------------------------------------------------------------------------
def member_ranks(
    pick_class: np.ndarray, use: np.ndarray, sizes: np.ndarray, samples_per_class: int, keys: np.ndarray
) -> np.ndarray:
    """Rank within its class of each of the ``K`` samples of every cell: ``(m, P, K)`` int64.

    Use ``u`` of a class with ``n_c >= K`` samples takes positions ``[j K, (j + 1) K)`` of shuffle
    ``u // (n_c // K)`` of the class (``j = u % (n_c // K)``); a smaller class reads an endless
    stream of its shuffles. Shuffle ``t`` of class ``c`` is a keyed permutation of ``[0, n_c)``.
    """
    per_class = samples_per_class
    within = np.arange(per_class, dtype=np.int64)
    cls = np.broadcast_to(pick_class[:, :, None], (*pick_class.shape, per_class))
    size = sizes[cls]
    groups = size // per_class
    whole = groups > 0
    safe_groups = np.maximum(groups, 1)
    uses = use[:, :, None]
    stream = uses * per_class + within
    cycle = np.where(whole, uses // safe_groups, stream // size)
    offset = np.where(whole, (uses % safe_groups) * per_class + within, stream % size)
    tweak = mix64(cls.astype(np.uint64) * GOLDEN ^ mix64(cycle.astype(np.uint64) + GOLDEN))
    return keyed_shuffle(offset, size, tweak, keys)


def keyed_shuffle(positions: np.ndarray, sizes: np.ndarray, tweaks: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``perm_e(position_e)`` for every element ``e``, where ``perm_e`` is a keyed bijection of ``[0, size_e)``.

    A Feistel network over the smallest power-of-two domain of each element, keyed by
    ``keys`` (the round keys) xor the element's ``tweak``, with cycle walking: many small
    permutations with different domains and keys in one vectorised call, O(1) memory per element.
    """
    shape = positions.shape
    x = positions.reshape(-1).astype(np.uint64)
    limit = sizes.reshape(-1).astype(np.uint64)
    tweak = tweaks.reshape(-1)
    bits = np.maximum(1, _bit_length(limit - np.uint64(1)))
    low = (bits >> np.uint64(1)).astype(np.uint64)
    low_mask = (np.uint64(1) << low) - np.uint64(1)
    high_mask = (np.uint64(1) << (bits - low)) - np.uint64(1)
    out = feistel_rounds(x, low, low_mask, high_mask, [tweak ^ key for key in keys])
    outside = np.flatnonzero(out >= limit)
    while outside.size:
        walked = feistel_rounds(
            out[outside], low[outside], low_mask[outside], high_mask[outside], [tweak[outside] ^ key for key in keys]
        )
        out[outside] = walked
        outside = outside[walked >= limit[outside]]
    return out.astype(np.int64).reshape(shape)


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bits needed for each uint64 value (0 for 0), exactly, without floating point."""
    bits = np.zeros(x.shape, dtype=np.uint64)
    value = x.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        step = np.uint64(shift)
        big = value >= (np.uint64(1) << step)
        bits[big] += step
        value[big] >>= step
    bits += value  # what remains is 0 or 1
    return bits



def member_keys(seed: int, epoch: int) -> np.ndarray:
    """The Feistel round keys of an epoch's within-class shuffles."""
    return np.random.SeedSequence(derive_seed(seed, epoch, MEMBERS)).generate_state(_ROUNDS, dtype=np.uint64)
