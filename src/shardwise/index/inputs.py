"""The one step every ``*Input.of`` takes: whatever a user passes, as a checked 1-D numpy array.

:class:`~shardwise.index.labels.LabelsInput`, :class:`~shardwise.index.weights.WeightsInput` and
:class:`~shardwise.index.lengths.LengthsInput` read alike: an input of their own class is returned
as is, anything else goes through :func:`input_array` (a ``pyarrow`` array or an HF column resolved
to numpy, the shape checked, the dtype checked), and the class holds the array it returns. Every
message names the parameter (``labels``, ``weights``, ``lengths``).

Cost at 1e9 samples: O(1) for a numpy array or memory map (used as is, never copied); a list, a
tensor or an object array is converted once (O(n), 8 bytes a sample); a ``pyarrow`` column once per
node (:func:`~shardwise.index.arrow.column`, cached).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .._core.arrays import one_dimensional
from .arrow import resolve


def input_array(
    name: str,
    values: object,
    *,
    sequence_of: str,
    one: str,
    kinds: str,
    holds: str,
    allow_empty: bool = False,
    convert: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """``values`` as a 1-D array of a dtype kind in ``kinds`` (as is when it is one), or raise naming ``name``.

    Args:
        name: the parameter, for messages (``"labels"``).
        values: what the caller passed: a sequence, numpy array or memory map, CPU tensor, ``pyarrow``
            Array/ChunkedArray, HF ``dataset["column"]`` (a whole HF ``Dataset`` is refused with the fix).
        sequence_of: what the sequence holds, for the shape message (``"a 1-D sequence of {sequence_of}"``).
        one: one element, for the empty message (``"should hold at least one {one}"``).
        kinds: the numpy dtype kinds accepted (``"iu"``: integers); a bool array is refused whatever they are.
        holds: what the dtype message says it should hold (``"{name} should hold {holds}, but got ..."``).
        allow_empty: accept an empty sequence.
        convert: applied to the 1-D array before the dtype check (e.g. an object array of labels to str or int).

    Raises:
        TypeError: a dtype of another kind (or bool); what ``one_dimensional`` refuses.
        ValueError: not 1-D, or empty without ``allow_empty``.
    """
    array = one_dimensional(name, resolve(name, values), sequence_of=sequence_of, one=one, allow_empty=allow_empty)
    if convert is not None:
        array = convert(array)
    if array.dtype == np.bool_ or array.dtype.kind not in kinds:
        raise TypeError(f"{name} should hold {holds}, but got {name} of dtype {array.dtype}")
    return array


def held_in(values: object) -> str:
    """Where an input's values live, for its ``repr``: ``"a memory map"`` or ``"an array"``."""
    return "a memory map" if isinstance(values, np.memmap) else "an array"
