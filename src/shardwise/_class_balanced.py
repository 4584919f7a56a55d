"""``ClassBalancedBatchSampler``: P classes x K samples per batch, for metric learning, distributed.

What an epoch is. With ``N`` samples in the usable classes, ``P = classes_per_batch`` and
``K = samples_per_class``, an epoch's global plan has ``B = max(1, N // (P * K))`` batches, so the
epoch draws about ``N`` samples. The ``B * P`` class slots of the epoch are shared out in
proportion to class sizes (class ``c`` with ``n_c`` samples gets ``n_c / K`` slots, rounded up
or down at random so that it is exact on average, in integer arithmetic), never more than ``B``
(a class appears at most once per batch); the share a very large class cannot take goes to the
others in proportion. Within a class, its slots take ``K`` samples at a time from a shuffle of
its samples; when a class needs more slots than one shuffle holds (``n_c // K``) the next slots
come from a fresh shuffle. So:

- a class with at least ``K`` samples never repeats a sample within a batch, and each of its
  samples is seen at most once per epoch unless the class got more than ``n_c // K`` slots;
- a class with fewer than ``K`` samples (``small_classes="replace"``) repeats its samples within
  its batch group, each about ``K / n_c`` times per group.

Layout. The class slots, grouped by class in a keyed class order, are dealt column by column
into a ``(B, P)`` table, so the ``<= B`` slots of one class fall in distinct batches. That alone
would make a class share batches only with the classes laid out beside it, so random swaps
between rows (in the same column, only where both rows stay free of repeats) then mix which
classes meet; finally the batches are put in a keyed order. A batch lists its ``P`` groups of
``K`` indices one after the other, each group sharing a label. The whole epoch plan
(``B x P x K`` indices, about ``N``) is built once per epoch with vectorised numpy (O(N)
memory, O(N log N) time) and addressed by batch position, so resume is O(1) after that build.
"""

from __future__ import annotations

import enum
import numbers
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ._arrays import digest, one_dimensional
from ._base import PlanSampler, UnitSource
from ._errors import check_bool, check_choice, check_int
from ._permutation import Permutation
from ._plan import Even
from ._schedule import BatchSizeSchedule, EpochSizes
from ._seeds import derive_seed
from ._state import Fingerprint
from ._world import World

QUOTA = "class-balanced-quota"
CLASSES = "class-balanced-classes"
BATCHES = "class-balanced-batches"
MEMBERS = "class-balanced-members"
MIX = "class-balanced-mix"
MIX_PASSES = 16


class SmallClasses(str, enum.Enum):
    """What to do with a class that has fewer than ``samples_per_class`` samples."""

    REPLACE = "replace"
    """Use it, repeating its samples to fill its ``K`` places (sampling with replacement)."""
    EXCLUDE = "exclude"
    """Leave it out of every batch."""
    ERROR = "error"
    """Refuse the labels at construction."""


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
    order = np.argsort(words[:count], kind="stable")
    ends = np.cumsum(remainder[order])
    offset = int(words[count] % np.uint64(total))
    points_before_end = -((offset - ends) // total)  # ceil((end - offset) / total)
    quota[order] += np.diff(points_before_end, prepend=0)
    return quota


def mix_rows(table_class: np.ndarray, table_use: np.ndarray, key: int, passes: int = MIX_PASSES) -> None:
    """Randomise which classes share a batch, in place, keeping every row's classes distinct.

    Each pass pairs the rows at random and, in one random column per pair, swaps the two cells
    when neither class is already in the other row. Rows keep ``P`` distinct classes and every
    class keeps its number of slots; only the company it keeps changes.

    Args:
        table_class, table_use: ``(B, P)`` int64, the class of each cell and its use number.
        key: 64-bit key of the random choices (raw PCG64 words: stable across numpy releases).
        passes: rounds of swaps.
    """
    rows, columns = table_class.shape
    half = rows // 2
    if half == 0 or columns < 2:
        return
    words = np.random.PCG64(key).random_raw(passes * (rows + half)).reshape(passes, rows + half)
    for draw in words:
        order = np.argsort(draw[:rows], kind="stable")
        first, second = order[:half], order[half : 2 * half]
        column = (draw[rows:] % np.uint64(columns)).astype(np.int64)
        x, y = table_class[first, column], table_class[second, column]
        clash = (table_class[second] == x[:, None]).any(axis=1) | (table_class[first] == y[:, None]).any(axis=1)
        a, b, c = first[~clash], second[~clash], column[~clash]
        for table in (table_class, table_use):
            table[a, c], table[b, c] = table[b, c], table[a, c]


def class_balanced_plan(
    members: np.ndarray,
    class_starts: np.ndarray,
    sizes: np.ndarray,
    *,
    classes_per_batch: int,
    samples_per_class: int,
    num_batches: int,
    seed: int,
    epoch: int,
) -> np.ndarray:
    """The global plan of one epoch, see the module docstring.

    Args:
        members: ``(N,)`` sample indices grouped by class (class ``c`` at
            ``members[class_starts[c]:class_starts[c] + sizes[c]]``), usable classes only.
        class_starts, sizes: ``(C,)`` int64.
        classes_per_batch, samples_per_class: ``P`` and ``K``.
        num_batches: ``B``.
        seed, epoch: the keys of every random choice.

    Returns:
        ``(B, P * K)`` int64 sample indices, batch by batch.
    """
    count, per_class = len(sizes), samples_per_class
    words = np.random.SeedSequence(derive_seed(seed, epoch, QUOTA)).generate_state(count + 1, dtype=np.uint64)
    quota = class_quotas(sizes, num_batches * classes_per_batch, num_batches, words)
    order = Permutation(count, derive_seed(seed, epoch, CLASSES))(np.arange(count, dtype=np.int64))
    # slot_class, slot_use: (B * P,) class of each slot and how many earlier slots that class had.
    runs = quota[order]
    slot_class = np.repeat(order, runs)
    run_starts = np.cumsum(runs) - runs
    slot_use = np.arange(len(slot_class), dtype=np.int64) - np.repeat(run_starts, runs)
    # Column-major: slot i goes to batch i % B, so one class's <= B consecutive slots hit distinct batches.
    table_class = slot_class.reshape(classes_per_batch, num_batches).T.copy()
    table_use = slot_use.reshape(classes_per_batch, num_batches).T.copy()
    mix_rows(table_class, table_use, derive_seed(seed, epoch, MIX))
    batch_order = Permutation(num_batches, derive_seed(seed, epoch, BATCHES))(np.arange(num_batches, dtype=np.int64))
    # pick_*: (B, P, K) class, cycle and position in that cycle's shuffle of the class.
    pick_class = np.broadcast_to(table_class[batch_order][:, :, None], (num_batches, classes_per_batch, per_class))
    use = table_use[batch_order][:, :, None]
    within = np.arange(per_class, dtype=np.int64)
    size = sizes[pick_class]
    groups = size // per_class  # whole groups of K one shuffle of the class holds
    whole = groups > 0
    safe_groups = np.maximum(groups, 1)
    stream = use * per_class + within  # a small class reads an endless stream of its shuffles
    pick_cycle = np.where(whole, use // safe_groups, stream // size)
    pick_offset = np.where(whole, (use % safe_groups) * per_class + within, stream % size)
    ranks = _cycle_shuffles(pick_class, pick_cycle, pick_offset, sizes, seed, epoch)
    plan: np.ndarray = members[class_starts[pick_class] + ranks]
    return plan.reshape(num_batches, classes_per_batch * per_class)


def _cycle_shuffles(
    pick_class: np.ndarray, pick_cycle: np.ndarray, pick_offset: np.ndarray, sizes: np.ndarray, seed: int, epoch: int
) -> np.ndarray:
    """Rank within its class of the member at ``pick_offset`` of shuffle ``pick_cycle`` of ``pick_class``.

    Every needed (class, cycle) shuffle is drawn at once: each member of the class gets a random
    word and one lexsort orders the members of every shuffle by their words.
    """
    cycles = int(pick_cycle.max()) + 1
    pair = pick_class * cycles + pick_cycle
    pairs, pick_pair = np.unique(pair, return_inverse=True)
    pair_size = sizes[pairs // cycles]
    pair_start = np.cumsum(pair_size) - pair_size
    total = int(pair_size.sum())
    # element e of pair t is member (e - pair_start[t]) of the pair's class, with a random word.
    element_pair = np.repeat(np.arange(len(pairs), dtype=np.int64), pair_size)
    element_member = np.arange(total, dtype=np.int64) - np.repeat(pair_start, pair_size)
    words = np.random.PCG64(derive_seed(seed, epoch, MEMBERS)).random_raw(total)
    shuffled = element_member[np.lexsort((words, element_pair))]
    ranks: np.ndarray = shuffled[pair_start[pick_pair.reshape(pick_class.shape)] + pick_offset]
    return ranks


def _labels_array(labels: object) -> np.ndarray:
    array = one_dimensional("labels", labels, sequence_of="class labels", one="label")
    kind = array.dtype.kind
    if kind == "O":
        items = array.tolist()
        if all(isinstance(item, str) for item in items):
            array, kind = np.asarray(items, dtype=str), "U"
        elif all(isinstance(item, numbers.Integral) and not isinstance(item, bool) for item in items):
            array, kind = np.asarray(items, dtype=np.int64), "i"
    if kind not in "iuUS":
        raise TypeError(f"labels should hold integers or strings, but got labels of dtype {array.dtype}")
    return array


class ClassBalancedBatchSampler(PlanSampler[list[int]], Sampler[list[int]]):
    """Batches of ``classes_per_batch`` classes x ``samples_per_class`` samples (P x K), distributed.

    For metric learning losses (triplet, contrastive, ...), which need several samples of the
    same class in a batch. Each batch holds ``P`` distinct classes, ``K`` samples each, as ``P``
    consecutive groups of ``K`` indices. An epoch is ``max(1, N // (P * K))`` batches, so each
    sample is seen about once per epoch; classes take part in proportion to their size (see the
    module docstring of ``shardwise._class_balanced`` for the exact rule).

    The batches form one global plan, the same on every rank and independent of the world size;
    rank ``r`` of ``W`` takes whole batches ``r, r + W, ...``, and every rank yields the same number.

    Args:
        labels: 1-D integer or string class label of every sample of the dataset.
        classes_per_batch: ``P``, distinct classes per batch.
        samples_per_class: ``K``, samples per class in a batch.
        small_classes: what to do with a class with fewer than ``K`` samples: ``"replace"``
            (default: repeat its samples), ``"exclude"`` (leave it out) or ``"error"``.
        seed: base seed, identical on every rank; ``None`` resolves one that every rank shares.
        num_replicas: world size; default: torch.distributed, then the launcher's environment.
        rank: global rank; default: as ``num_replicas``.
        drop_last: cut the last partial global step (at most ``W - 1`` batches) instead of padding
            it by repeating batches from the start of the plan.

    Attributes:
        batch_size: ``P * K``, what frameworks read.
        num_batches: batches in one epoch's global plan (all ranks together).

    Raises:
        ValueError: empty or non-1-D labels, non-positive ``P``/``K``, fewer than ``P`` usable
            classes, or a class smaller than ``K`` with ``small_classes="error"``.
        TypeError: labels that are neither integers nor strings, non-integer ``P``/``K``.

    Example:
        >>> labels = [0, 0, 1, 1, 2, 2, 3, 3]
        >>> sampler = ClassBalancedBatchSampler(labels, classes_per_batch=2, samples_per_class=2,
        ...                                     num_replicas=1, rank=0)
        >>> len(sampler), sampler.batch_size
        (2, 4)
        >>> sorted(i for batch in sampler for i in batch)
        [0, 1, 2, 3, 4, 5, 6, 7]
    """

    _CHUNK = 128

    def __init__(
        self,
        labels: Any,
        *,
        classes_per_batch: int | BatchSizeSchedule,
        samples_per_class: int,
        small_classes: SmallClasses | str = SmallClasses.REPLACE,
        seed: int | None = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> None:
        self.labels = _labels_array(labels)
        # classes_per_batch may be a per-epoch BatchSizeSchedule; the attribute holds epoch 0's value.
        self._schedules = EpochSizes("ClassBalancedBatchSampler", len(self.labels), classes_per_batch=classes_per_batch)
        classes_per_batch = self._schedules.initial("classes_per_batch", classes_per_batch)  # type: ignore[assignment]
        self.classes_per_batch = check_int("classes_per_batch", classes_per_batch, minimum=1)
        self.samples_per_class = check_int("samples_per_class", samples_per_class, minimum=1)
        self.small_classes = check_choice("small_classes", small_classes, SmallClasses)
        self.drop_last = check_bool("drop_last", drop_last)
        classes, inverse, sizes = np.unique(self.labels, return_inverse=True, return_counts=True)
        small = sizes < self.samples_per_class
        if small.any() and self.small_classes is SmallClasses.ERROR:
            first = int(np.argmax(small))
            raise ValueError(
                f"labels should have at least samples_per_class={self.samples_per_class} samples in every class "
                f"with small_classes='error', but {int(small.sum())} classes have fewer (e.g. class "
                f"{classes[first].item()!r} with {int(sizes[first])}); pass small_classes='replace' to repeat their "
                "samples or small_classes='exclude' to leave them out"
            )
        usable = ~small if self.small_classes is SmallClasses.EXCLUDE else np.ones(len(sizes), dtype=bool)
        if int(usable.sum()) < self.classes_per_batch:
            which = (
                "classes"
                if self.small_classes is not SmallClasses.EXCLUDE
                else (f"classes with at least samples_per_class={self.samples_per_class} samples")
            )
            raise ValueError(
                f"classes_per_batch should be at most the number of usable {which} in labels "
                f"({int(usable.sum())}), but got classes_per_batch={self.classes_per_batch}"
            )
        for epoch in self._schedules.epochs():
            wanted = self._schedules.at("classes_per_batch", epoch, self.classes_per_batch)
            if int(usable.sum()) < wanted:
                raise ValueError(
                    f"classes_per_batch should be at most the number of usable classes in labels "
                    f"({int(usable.sum())}), but its schedule gives {wanted} at epoch {epoch}"
                )
        # members: sample indices grouped by class, usable classes only, in label order.
        members = np.argsort(inverse, kind="stable")
        keep = usable[inverse[members]]
        self._members = members[keep].astype(np.int64)
        self._sizes = sizes[usable].astype(np.int64)
        self._class_starts = np.cumsum(self._sizes) - self._sizes
        self.classes = classes[usable]
        self._cached: tuple[int, int, np.ndarray] | None = None
        self._digest: str | None = None
        self._init_plan(seed=seed, num_replicas=num_replicas, rank=rank, even=Even.DROP if drop_last else Even.PAD)

    @property
    def batch_size(self) -> int:
        """Indices per batch: ``classes_per_batch * samples_per_class``."""
        classes, samples = self._batch_shape(self.epoch)
        return classes * samples

    @property
    def num_batches(self) -> int:
        """Batches in the upcoming epoch's global plan, all ranks together."""
        return self._plan_size(self.epoch)

    def _batch_shape(self, epoch: int) -> tuple[int, int]:
        """``(classes_per_batch, samples_per_class)`` of ``epoch``: the one place that reads them."""
        return self._schedules.at("classes_per_batch", epoch, self.classes_per_batch), self.samples_per_class

    def epoch_plan(self, epoch: int) -> np.ndarray:
        """The global plan of ``epoch``: ``(num_batches, P * K)`` int64 sample indices (cached per epoch)."""
        seed = self.seed
        classes, samples = self._batch_shape(epoch)
        if self._cached is None or self._cached[:2] != (seed, epoch):
            plan = class_balanced_plan(
                self._members,
                self._class_starts,
                self._sizes,
                classes_per_batch=classes,
                samples_per_class=samples,
                num_batches=self._plan_size(epoch),
                seed=seed,
                epoch=epoch,
            )
            self._cached = (seed, epoch, plan)
        return self._cached[2]

    def _plan_size(self, epoch: int) -> int:
        classes, samples = self._batch_shape(epoch)
        return max(1, len(self._members) // (classes * samples))

    def _open_pass(self, epoch: int, seed: int, world: World, start: int) -> UnitSource:
        plan = self.epoch_plan(epoch)
        return lambda positions: plan[positions].tolist()

    def _fingerprint(self) -> Fingerprint:
        if self._digest is None:
            self._digest = digest(self._members) + digest(self._sizes)
        return {
            "num_labels": len(self.labels),
            "classes_per_batch": self.classes_per_batch,
            "samples_per_class": self.samples_per_class,
            "small_classes": self.small_classes.value,
            "labels_digest": self._digest,
            **self._schedules.fingerprint(),
        }

    def _config(self) -> dict[str, Any]:
        return {
            "classes_per_batch": self.classes_per_batch,
            "samples_per_class": self.samples_per_class,
            "small_classes": self.small_classes.value,
            "drop_last": self.drop_last,
        }

    def _data_repr(self) -> str:
        return f"labels={len(self.labels)}, classes={len(self.classes)}"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_cached"] = None  # rebuilt on demand: do not ship an epoch plan to every worker
        return state
