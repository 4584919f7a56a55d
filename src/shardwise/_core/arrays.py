"""Checks and digests for the arrays samplers hold (indices, labels), with the one message template.

Arrays are kept as compact numpy arrays, never Python lists; a digest of an array goes into a
sampler's fingerprint so that a state saved over other data is refused on load.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from .errors import shown

_INDEX_MAX = 2**62
NUMERIC_KINDS = "biufc"
"""numpy dtype kinds torch can hold: bool, signed and unsigned integers, floats, complex."""


def as_array(name: str, values: object, *, what: str) -> np.ndarray:
    """``values`` as a numpy array (no copy when it already is one), or raise naming ``name``.

    The one place where user data becomes an array, so every parameter gets the same answers:
    ``None`` or a string is a ``TypeError``; so are nested sequences of unequal lengths
    (per-class lists, multi-label rows, a ragged sample: elements that are not what is meant),
    with a message saying so, not
    numpy's "inhomogeneous shape"; a list mixing strings and numbers (which numpy would turn
    silently into strings) is a ``TypeError``. A tensor (recognised without importing torch) must
    be on the CPU; one that requires grad is read through ``detach()``.

    Args:
        name: the parameter, or a phrase such as ``"sample 3"``, for messages.
        values: what the caller passed.
        what: what is accepted, e.g. ``"a 1-D sequence of weights"``.
    """
    if isinstance(values, np.ndarray):
        return values
    if values is None or isinstance(values, (str, bytes)):
        raise TypeError(f"{name} should be {what}, but got {shown(name, values)} ({type(values).__name__})")
    device, detach = getattr(values, "device", None), getattr(values, "detach", None)
    if device is not None and callable(detach):
        if getattr(device, "type", "cpu") != "cpu":
            raise TypeError(
                f"{name} should be {what} in CPU memory, but got a tensor on device {device}; pass {name}.cpu()"
            )
        values = detach()
    try:
        array = np.asarray(values)
    except ValueError as error:
        if "inhomogeneous" not in str(error):
            raise
        raise TypeError(
            f"{name} should be {what}, but got nested sequences of unequal lengths, which make no array "
            f"(e.g. a list of per-class or multi-label lists); flatten them, or pass one array"
        ) from None
    if array.ndim == 0 and array.dtype == object:  # a generator, dict, set...: numpy wraps it whole
        raise TypeError(
            f"{name} should be {what}, but got {shown(name, values)} ({type(values).__name__}); "
            f"pass a list or an array"
        )
    if array.dtype.kind in "US" and isinstance(values, (list, tuple)):
        kinds = {type(item).__name__ for item in values if not isinstance(item, (str, bytes))}
        if kinds:
            raise TypeError(
                f"{name} should hold values of one kind, but got {name} mixing strings and {', '.join(sorted(kinds))}"
            )
    return array


def check_numeric_dtype(name: str, value: object) -> np.dtype[Any]:
    """A numeric numpy dtype (bool, integer, float, complex) in native byte order, or raise naming ``name``.

    What torch tensors hold (``torch.from_numpy`` refuses strings, objects and swapped byte orders).
    """
    dtype: np.dtype[Any] | None
    try:
        dtype = np.dtype(value)  # type: ignore[call-overload]
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in NUMERIC_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise TypeError(
            f"{name} should be a numeric numpy dtype (bool, integer, float or complex), but got {shown(name, value)}"
        )
    if not dtype.isnative:
        raise TypeError(
            f"{name} should be in native byte order, but got {shown(name, dtype.str)}; "
            f"convert with array.astype({dtype.newbyteorder('=').name!r})"
        )
    return dtype


def check_fits(name: str, value: int | float | complex, dtype: np.dtype[Any], *, holder: str = "") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``dtype`` holds ``value`` exactly (floats: without overflow).

    Integers (and bool) take whole numbers in their range only, so ``-1`` never wraps to 255 in
    uint8 and NaN never becomes an arbitrary integer; floats take any real value within their
    range (NaN and infinities included); complex takes anything.

    Args:
        name: the parameter, for messages.
        value: its value.
        dtype: the dtype that must hold it.
        holder: what holds it, for messages (default: the dtype's name).
    """
    kind = dtype.kind
    if kind == "c":
        return
    accepted = ""
    imaginary = isinstance(value, complex) and value.imag != 0
    real = value.real
    if kind == "f":
        if not imaginary and (not math.isfinite(real) or abs(real) <= float(np.finfo(dtype).max)):
            return
        accepted = f"a real number within +-{float(np.finfo(dtype).max):.4g}, NaN or an infinity"
    else:
        low, high = (0, 1) if kind == "b" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
        if not imaginary and math.isfinite(real) and real == int(real) and low <= int(real) <= high:
            return
        accepted = f"a whole number in [{low}, {high}]"
    raise ValueError(
        f"{name} should be a value that {holder or dtype} can hold ({accepted}), but got {name}={value!r}"
    )


def one_dimensional(name: str, values: object, *, sequence_of: str, one: str, allow_empty: bool = False) -> np.ndarray:
    """``values`` as a 1-D numpy array (no copy when it already is one), or raise naming ``name``.

    Args:
        name: the parameter, for messages.
        values: what the caller passed.
        sequence_of: what the sequence holds, e.g. ``"weights"`` (``"a 1-D sequence of weights"``).
        one: one element, e.g. ``"weight"`` (``"should hold at least one weight"``).
        allow_empty: accept an empty sequence.
    """
    array = as_array(name, values, what=f"a 1-D sequence of {sequence_of}")
    if array.ndim != 1:
        raise ValueError(f"{name} should be a 1-D sequence of {sequence_of}, but got {name} with shape {array.shape}")
    if array.size == 0 and not allow_empty:
        raise ValueError(f"{name} should hold at least one {one}, but got an empty {name}")
    return array


def check_non_negative_integers(name: str, array: np.ndarray, *, holds: str, noun: str) -> tuple[int, int]:
    """Raise unless ``array`` (1-D, non-empty) is integer-typed with every value in ``[0, 2**62)``.

    Args:
        name: the parameter, for messages.
        array: the values to check.
        holds: what the dtype message says it should hold, e.g. ``"integer indices"``.
        noun: the values' plural in range messages, e.g. ``"indices"``.

    Returns:
        The smallest and largest value.
    """
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} should hold {holds}, but got {name} of dtype {array.dtype}")
    low, high = int(array.min()), int(array.max())
    if low < 0:
        at = int(np.argmin(array))
        raise ValueError(f"{name} should hold non-negative {noun}, but got {name}[{at}]={low}")
    if high >= _INDEX_MAX:
        at = int(np.argmax(array))
        raise ValueError(f"{name} should hold {noun} below 2**62, but got {name}[{at}]={high}")
    return low, high


def as_index_array(name: str, values: object, *, allow_empty: bool = False) -> np.ndarray:
    """``values`` as a 1-D int64 array of non-negative indices, or raise naming ``name``.

    Accepts any 1-D integer sequence, numpy array or CPU tensor; rejects floats and bools (a
    float index is a bug, and a bool array is a mask, not indices).
    """
    array = one_dimensional(name, values, sequence_of="indices", one="index", allow_empty=allow_empty)
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    check_non_negative_integers(name, array, holds="integer indices", noun="indices")
    return np.ascontiguousarray(array, dtype=np.int64)


def digest(array: np.ndarray) -> str:
    """A short, stable hex digest of an array's dtype, shape and bytes (for fingerprints)."""
    array = np.ascontiguousarray(array)
    hasher = digest_hasher(array.dtype, array.shape)
    hasher.update(array.view(np.uint8).data if array.size else b"")
    return hasher.hexdigest()


def digest_hasher(dtype: Any, shape: tuple[int, ...]) -> hashlib.blake2b:
    """The hasher of :func:`digest` for an array of ``dtype`` and ``shape``, before its bytes (fed in order)."""
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(f"{np.dtype(dtype).str}{tuple(shape)}".encode())
    return hasher


def check_weight_count(name: str, got: int, length: int, of: str = "source") -> None:
    """Raise, naming ``name``, unless ``got`` weights are one per ``of`` (``length`` of them)."""
    if got != length:
        raise ValueError(f"{name} should hold one weight per {of} ({length}), but got {got} weights")


def as_weight_array(name: str, values: object, *, length: int | None = None, of: str = "source") -> np.ndarray:
    """``values`` as a 1-D float64 array of finite, non-negative weights, not all zero, or raise naming ``name``.

    Args:
        name: the parameter, for messages.
        values: what the caller passed (list, array or CPU tensor).
        length: the number of weights required (one per ``of``), if fixed.
        of: what each weight belongs to, for the length message.
    """
    if isinstance(values, (list, tuple)) and any(isinstance(value, bool) for value in values):
        raise TypeError(f"{name} should hold real numbers, but got {name}={list(values)!r} (a bool is not a weight)")
    array = one_dimensional(name, values, sequence_of="weights", one="weight")
    if array.dtype == np.bool_ or array.dtype.kind not in "iuf":
        raise TypeError(f"{name} should hold real numbers, but got {name} of dtype {array.dtype}")
    if length is not None:
        check_weight_count(name, len(array), length, of)
    array = array.astype(np.float64)
    bad = ~np.isfinite(array) | (array < 0)
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} should be finite and non-negative, but got {name}[{at}]={array[at].item()!r}")
    if not array.any():
        raise ValueError(f"{name} should have at least one positive weight, but all {len(array)} weights are zero")
    return array


def as_size_array(name: str, values: object, *, what: str = "source") -> np.ndarray:
    """``values`` as a 1-D int64 array of positive sizes (one per ``what``), or raise naming ``name``.

    A size of 0 is refused: nothing can be drawn from an empty ``what``.
    """
    if isinstance(values, (list, tuple)) and any(isinstance(value, bool) for value in values):
        raise TypeError(f"{name} should hold integer sizes, but got {name}={list(values)!r} (a bool is not a size)")
    array = one_dimensional(name, values, sequence_of="sizes", one="size")
    low, _ = check_non_negative_integers(name, array, holds="integer sizes", noun="sizes")
    if low == 0:
        at = int(np.argmin(array))
        raise ValueError(
            f"{name} should hold positive sizes, but got {name}[{at}]=0: an empty {what} cannot be drawn from; "
            f"leave it out of the mixture"
        )
    return np.ascontiguousarray(array, dtype=np.int64)


def as_lookup_indices(name: str, values: object, *, size: int, of: str) -> np.ndarray:
    """``values`` (an int or an array of any shape) as int64 indices in ``[0, size)``, or raise naming ``name``.

    For vectorised lookups (the source of each index): a float or bool is a ``TypeError``, an
    index outside ``[0, size)`` an ``IndexError`` (a negative one too: these lookups never count
    from the end, so a silent wrap would hide a bug).

    Args:
        name: the parameter, for messages.
        values: what the caller passed.
        size: the number of valid indices.
        of: what is indexed, for messages, e.g. ``"the mixture"``.
    """
    if isinstance(values, bool):
        raise TypeError(f"{name} should be an integer index or an array of them, but got {name}={values!r} (bool)")
    array = as_array(name, values, what="an integer index or an array of integer indices")
    if array.size == 0 and array.dtype.kind in NUMERIC_KINDS:  # [] is float64 to numpy: nothing to look up
        return np.zeros(array.shape, dtype=np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} should hold integer indices, but got {name} of dtype {array.dtype}")
    if array.size:
        bad = (array < 0) | (array >= size)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            where = f"{name}[{', '.join(map(str, at))}]" if array.ndim else name
            raise IndexError(
                f"{name} should hold indices in [0, {size}) of {of}, but got {where}={array[at].item()!r}"
            )
    return array.astype(np.int64, copy=False)
