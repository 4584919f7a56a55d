"""Labels as samplers take them: one validated input (:class:`LabelsInput`) and its shared class index.

:class:`LabelsInput` is the one step from whatever a user passes as ``labels`` (a list, a numpy
array or memory map, a CPU tensor, a ``pyarrow`` array, an HF ``dataset["column"]``) to what
``ClassBalancedBatchSampler`` reads: a 1-D integer or string array used as is (a memory map is
never copied), checked once, and its class index. Samplers take that object and never look at the
raw input again.

The class index, kind ``"class-index-v1"`` (:data:`CLASS_INDEX`): ``classes`` (the sorted distinct
labels), ``counts`` (int64, samples of each class), ``members`` (every sample index grouped by
class in ``classes`` order, dataset order within: 4 bytes a sample below 2**32 samples) and
``digest`` (8 bytes: the labels' digest, hashed on another core while the index is built). Built
once per labels and node by a counting sort in two local passes (NOTE [ Class index in two passes ]
in :mod:`shardwise._core.class_buckets`), then memory-mapped by every rank and worker; labels
below 65,536 entries are indexed in private memory (:func:`~shardwise.index.tables.shared_arrays`).
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from .._core.class_buckets import group_by_class
from .._core.class_index import count_classes
from .builders import index_dtype, populate
from .cache import DEFAULT_TIMEOUT, CacheDir
from .inputs import held_in, input_array
from .integrity import read_checked
from .keys import BackgroundDigest
from .tables import Allocate, by_reference, input_key, shared_arrays

CLASS_INDEX = "class-index-v1"
"""Cache kind of the class index (classes, counts, members grouped by class, digest of the labels)."""


def _from_objects(array: np.ndarray) -> np.ndarray:
    """Labels given as Python objects (a list, an object array) as a str or int64 array: all strings or all
    integers; any other array as is (the dtype check of ``LabelsInput.of`` then names what it holds)."""
    if array.dtype.kind == "O":
        items = array.tolist()
        if all(isinstance(item, str) for item in items):
            return np.asarray(items, dtype=str)
        if all(isinstance(item, numbers.Integral) and not isinstance(item, bool) for item in items):
            return np.asarray(items, dtype=np.int64)
    return array


def build_class_index(labels: np.ndarray, allocate: Allocate) -> None:
    """Write the class index of ``labels`` into the arrays ``allocate`` gives (see the module docstring)."""
    with BackgroundDigest(labels) as hashing:  # the labels' digest, on another core meanwhile
        dtype = index_dtype(len(labels))  # of the sample indices (uint32 below 2**32 samples)
        found, counts = count_classes(labels)
        allocate("classes", len(found), found.dtype)[:] = found
        allocate("counts", len(counts), np.int64)[:] = counts
        members = allocate("members", len(labels), dtype)
        # the one-pass sort writes through the mapping: its pages faulted in first, in one call
        group_by_class(labels, found, counts, members, before_one_pass=populate)
        allocate("digest", 8, np.uint8)[:] = np.frombuffer(bytes.fromhex(hashing.result()), dtype=np.uint8)


class ClassIndex(NamedTuple):
    """The class index of some labels, as :class:`LabelsInput` holds it."""

    classes: np.ndarray  # (C,) the sorted distinct labels
    counts: np.ndarray  # (C,) int64: samples of each class (read checked)
    members: np.ndarray  # (n,) every sample index grouped by class, dataset order within
    digest: str  # hex digest of the labels


class LabelsInput:
    """One ``labels`` input, resolved and checked once, with its class index: what a sampler over labels reads.

    Build it with :meth:`of` (a ``LabelsInput`` given again is returned as is). What it holds:

    - :attr:`values`: the labels as a 1-D integer or string array (a memory map stays one);
    - :attr:`classes`, :attr:`counts`, :attr:`members`, :attr:`digest`: the class index (see the
      module docstring), built or opened when one of them is first read, so that a sampler checks
      its other arguments before an O(n) build.

    Shape and dtype are checked at :meth:`of` (O(1) for an array); the index where it is built.
    Cost at 1e9 labels: the input itself, then the index, 4 GB shared by the node, O(classes)
    private memory.

    Example:
        >>> labels = LabelsInput.of(["b", "a", "b"], cache_dir=False)
        >>> len(labels), labels.classes.tolist(), labels.counts.tolist(), labels.members.tolist()
        (3, ['a', 'b'], [1, 2], [1, 0, 2])
    """

    __slots__ = ("_index", "cache_dir", "timeout", "values")

    def __init__(self, values: np.ndarray, *, cache_dir: CacheDir = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.values, self.cache_dir, self.timeout = values, cache_dir, timeout
        self._index: ClassIndex | None = None

    @classmethod
    def of(cls, labels: object, *, cache_dir: CacheDir = None, timeout: float = DEFAULT_TIMEOUT) -> LabelsInput:
        """``labels`` as one checked input, or raise naming ``labels`` (``TypeError``/``ValueError``).

        Args:
            labels: 1-D integer or string class labels (a sequence, numpy array or memory map, CPU
                tensor, ``pyarrow`` Array/ChunkedArray, HF ``dataset["column"]``), or a
                ``LabelsInput`` (returned as is).
            cache_dir: where the class index is shared (see :func:`~shardwise.index.build_or_open`):
                ``None`` for the default cache, a path, or ``False`` (private memory, with a warning).
            timeout: seconds to wait for another process of the node building the same index.
        """
        if isinstance(labels, LabelsInput):
            return labels
        array = input_array("labels", labels, sequence_of="class labels", one="label", kinds="iuUS",
                            holds="integers or strings", convert=_from_objects)  # fmt: skip
        return cls(array, cache_dir=cache_dir, timeout=timeout)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def size(self) -> int:
        """The number of samples."""
        return len(self.values)

    def index(self) -> ClassIndex:
        """The class index: built once per labels and node (a chunked counting sort), then mapped."""
        if self._index is None:
            values = self.values

            def build(allocate: Allocate) -> None:
                build_class_index(values, allocate)

            arrays = shared_arrays(CLASS_INDEX, input_key(values), build, size=len(values), cache_dir=self.cache_dir,
                                   timeout=self.timeout)  # fmt: skip
            counts = np.asarray(read_checked(arrays["counts"], arrays["counts"]))
            self._index = ClassIndex(arrays["classes"], counts, arrays["members"], bytes(arrays["digest"]).hex())
        return self._index

    @property
    def classes(self) -> np.ndarray:
        """``(C,)`` the sorted distinct labels."""
        return self.index().classes

    @property
    def counts(self) -> np.ndarray:
        """``(C,)`` int64: how many samples each class has."""
        return self.index().counts

    @property
    def members(self) -> np.ndarray:
        """``(n,)`` every sample index grouped by class (``classes`` order), dataset order within a class."""
        return self.index().members

    @property
    def digest(self) -> str:
        """The labels' digest (hex): what a sampler's fingerprint names them by."""
        return self.index().digest

    def __repr__(self) -> str:
        return f"LabelsInput(<{self.size} labels in {held_in(self.values)}>)"

    def __getstate__(self) -> dict[str, Any]:
        # Memory-mapped labels and index travel as file names (spawned workers map the same files).
        state = by_reference({"values": self.values})
        if self._index is not None:
            state.update(by_reference(self._index._asdict()))
        return {**state, "cache_dir": self.cache_dir, "timeout": self.timeout, "built": self._index is not None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.values, self.cache_dir, self.timeout = state["values"], state["cache_dir"], state["timeout"]
        self._index = ClassIndex(*(state[name] for name in ClassIndex._fields)) if state["built"] else None
