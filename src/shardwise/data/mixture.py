"""``Mixture``: a ``ConcatDataset`` of sources that also says which source an index belongs to."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sized
from typing import Any

import numpy as np
from torch.utils.data import ConcatDataset, Dataset

from .._core.arrays import as_lookup_indices
from .._core.errors import check_int, check_iterable, check_str


class Mixture(ConcatDataset[Any]):
    """The datasets of a mixture, concatenated: index ``offset_i + k`` is sample ``k`` of source ``i``.

    What ``torch.utils.data.ConcatDataset`` does, plus the source of an index, the sources' sizes
    and names, so that two lines set up a mixture:
    ``data = Mixture({"web": web, "code": code})`` and
    ``sampler = MixtureSampler(data, weights=[0.7, 0.3], num_samples=...)``.

    Args:
        datasets: sized datasets, as a sequence or a ``{name: dataset}`` mapping (names default to
            ``"0"``, ``"1"``, ...). Every one must hold at least one sample.
        source_key: give every sample its source number, for a loop that reports per-source
            losses (adaptive weights): a dict sample gets it under this key, any other sample
            becomes ``(sample, source)``. ``None`` (default): samples as the datasets return them.

    Example:
        >>> data = Mixture({"a": range(3), "b": range(10, 12)})
        >>> data.sizes, data.names, data[4], data.locate(4)
        ([3, 2], ['a', 'b'], 11, (1, 1))
    """

    def __init__(
        self, datasets: Iterable[Dataset[Any]] | Mapping[str, Dataset[Any]], *, source_key: str | None = None
    ) -> None:
        if isinstance(datasets, Mapping):
            names = [str(name) for name in datasets]
            parts = list(datasets.values())
        else:
            parts = list(check_iterable("datasets", datasets, of="sized datasets"))
            names = [str(i) for i in range(len(parts))]
        if not parts:
            raise ValueError("datasets should hold at least one dataset, but got none")
        if len(set(names)) != len(names):
            raise ValueError(
                f"datasets should have distinct names, but the keys {list(datasets)!r} give the names {names!r}"
            )
        for name, part in zip(names, parts, strict=True):
            if not isinstance(part, Sized):
                raise TypeError(
                    f"datasets should hold sized datasets (with len()), as ConcatDataset requires, but dataset "
                    f"{name!r} is {part!r} ({type(part).__name__})"
                )
            size = len(part)
            if size == 0:
                raise ValueError(f"datasets should all hold samples, but dataset {name!r} is empty; leave it out")
        super().__init__(parts)
        self.names = names
        self.source_key = None if source_key is None else check_str("source_key", source_key)

    @property
    def sizes(self) -> list[int]:
        """The number of samples of each source."""
        return [int(x) for x in np.diff([0, *self.cumulative_sizes])]

    @property
    def offsets(self) -> list[int]:
        """The index at which each source starts."""
        return [0, *self.cumulative_sizes[:-1]]

    def __getitem__(self, index: int) -> Any:
        # ConcatDataset's lookup, through locate(): a float or bool index is refused here, naming it.
        source, within = self.locate(index)
        sample = self.datasets[source][within]
        if self.source_key is None:
            return sample
        if isinstance(sample, Mapping):
            return {**sample, self.source_key: source}
        return sample, source

    def source(self, index: int) -> int:
        """The source an index belongs to."""
        return self.locate(index)[0]

    def locate(self, index: int) -> tuple[int, int]:
        """``(source, index within that source)`` of a global index (negative indices count from the end).

        Raises:
            TypeError: ``index`` is not an integer (a float or bool).
            IndexError: ``index`` is outside ``[-len(self), len(self))``.
        """
        index = check_int("index", index)
        if index < 0:
            if -index > len(self):
                raise IndexError(f"index {index} is out of range for a mixture of {len(self)} samples")
            index += len(self)
        if index >= len(self):
            raise IndexError(f"index {index} is out of range for a mixture of {len(self)} samples")
        source = bisect.bisect_right(self.cumulative_sizes, index)
        return source, index - (self.cumulative_sizes[source - 1] if source else 0)

    def sources(self, indices: Any) -> np.ndarray:
        """The source of each index of an array (vectorised; indices in ``[0, len(self))``).

        Raises:
            TypeError: ``indices`` are not integers.
            IndexError: an index is negative or ``>= len(self)``.
        """
        checked = as_lookup_indices("indices", indices, size=len(self), of=f"a mixture of {len(self)} samples")
        found: np.ndarray = np.searchsorted(np.asarray(self.cumulative_sizes), checked, side="right")
        return found

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={size}" for name, size in zip(self.names, self.sizes, strict=True))
        return f"Mixture({parts})"
