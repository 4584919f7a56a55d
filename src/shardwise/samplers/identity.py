"""What a state can record about the data itself, beyond its size: the ``dataset`` fingerprint field.

NOTE [ What the data fingerprint checks ]
A sampler sees sizes, lengths, labels or weights, not samples. Those it digests into the state's
fingerprint, so a state of other lengths or labels is refused. Two datasets of the same size are
told apart only when the data names its content cheaply: a dataset (or a mixture source) with a
``data_fingerprint`` attribute, a short string that changes when the content does, adds it to the
fingerprint as ``dataset``. shardwise's own sources have one:

- :class:`shardwise.RaggedArray` (``data_fingerprint`` is a property): a digest of its manifest
  (sizes and CRC-32s of both files);
- :class:`shardwise.ShardedSource`: a digest of every shard's URL, size and version (the ETag, else
  the modification time), read once at construction.

A plain torch ``Dataset`` or a length has none: its state records the size only, and a state of
another dataset of the same size loads (nothing cheap and honest can tell them apart; give your
dataset a ``data_fingerprint`` to have it checked). HF ``datasets`` fingerprints are not used:
``datasets`` falls back to a random fingerprint when a transform cannot be hashed, which would
refuse a legitimate resume in a new process.

States saved before the field existed, or a sampler over data without one, still load: the
check is skipped with a logged warning (``shardwise._core.state.LATER_FIELDS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core.state import Fingerprint

DATASET = "dataset"
"""The fingerprint field holding the data's own fingerprint (or one per mixture source)."""


def data_fingerprint(data: object) -> str | None:
    """``data.data_fingerprint`` if it is a string, else ``None`` (a length, a plain dataset).

    Anything else under that name (a dataset whose ``__getattr__`` answers every name) is ignored.
    """
    value = getattr(data, "data_fingerprint", None)
    return value if isinstance(value, str) else None


def with_data(fingerprint: Fingerprint, data: object) -> Fingerprint:
    """``fingerprint`` with the ``dataset`` field when ``data`` has a fingerprint (unchanged otherwise)."""
    found = data_fingerprint(data)
    return fingerprint if found is None else {**fingerprint, DATASET: found}


def with_sources(fingerprint: Fingerprint, sources: Sequence[Any]) -> Fingerprint:
    """``fingerprint`` with ``dataset`` listing each source's fingerprint, when one source at least has one."""
    found = [data_fingerprint(source) for source in sources]
    return fingerprint if all(f is None for f in found) else {**fingerprint, DATASET: found}
