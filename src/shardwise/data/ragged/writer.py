"""``RaggedWriter``: build a store sample by sample, with bounded memory, atomically."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import weakref
import zlib
from collections.abc import Iterable, Sequence, Sized
from pathlib import Path
from typing import Any

import numpy as np

from ..._core.arrays import as_array
from ..._core.errors import check_bool, check_iterable, check_path
from ..._core.files import exchange, fsync_path, sampled_crc
from ...index.lengths import prebuild_store_index
from .format import (
    FORMAT,
    MANIFEST,
    OFFSET_BUFFER,
    OFFSETS,
    VALUES,
    VERSION,
    check_dtype,
    check_feature_shape,
    check_target,
    header_size,
    npy_header,
)
from .partial import Claim, remove_stale


class RaggedWriter:
    """Build a :class:`RaggedArray` store sample by sample, with bounded memory, atomically.

    Each :meth:`append` writes one sample's rows straight to disk; offsets are buffered 65536 at
    a time. Everything goes to a hidden temporary directory beside ``path`` (``.<name>.*.partial``);
    :meth:`close` writes the manifest last and renames the directory into place, so ``path``
    either does not exist or holds a complete store. Leaving the ``with`` block by an exception,
    or :meth:`abort`, deletes the temporary directory. A process killed mid-write leaves it
    behind (without a manifest, so it never opens as a store); the next writer to the same
    ``path`` removes it. Each writer holds a lock on its directory for as long as it lives, so
    a live writer's directory is never removed (see ``shardwise.data.ragged.partial``).

    Args:
        path: directory to create.
        dtype: dtype every sample must have; default: the first sample's (numpy's default
            float64 for an empty store).
        feature_shape: shape of one row (a sample is ``(rows, *feature_shape)``); default: the
            first sample's (``()`` for an empty store).
        overwrite: replace an existing store (or empty directory) at ``path``; anything else there
            is never deleted.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False, or it is not a store.

    Example:
        >>> import tempfile, numpy as np
        >>> from shardwise import RaggedArray, RaggedWriter
        >>> path = tempfile.mkdtemp() + "/store"
        >>> with RaggedWriter(path) as writer:
        ...     writer.append(np.zeros((3, 2), np.float32))
        ...     writer.append(np.ones((1, 2), np.float32))
        >>> RaggedArray(path).lengths.tolist()
        [3, 1]
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: Any = None,
        feature_shape: Sequence[int] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = Path(os.path.abspath(check_path("path", path)))
        self._dtype = None if dtype is None else check_dtype("dtype", dtype)
        self._feature_shape = None if feature_shape is None else check_feature_shape(feature_shape)
        self._dtype_source = "the dtype argument"
        self._shape_source = "the feature_shape argument"
        self.overwrite = check_bool("overwrite", overwrite)
        check_target(self.path, self.overwrite)
        if not self.path.parent.is_dir():
            raise FileNotFoundError(
                f"path should be in an existing directory, but got path={str(self.path)!r}, whose parent directory "
                "does not exist; create it first"
            )
        # Writers killed before they finished left their partial directories: remove those first.
        remove_stale(self.path.parent, self.path.name)
        self._claim = Claim(self.path.parent, self.path.name)
        self._tmp = self._claim.directory
        self._files: list[Any] = []  # closed by the finalizer too: a writer dropped mid-write leaks nothing
        self._cleanup = weakref.finalize(self, _discard, self._files, self._claim)
        self._values: Any = None
        self._offsets: Any = None
        self._values_header = 0
        self._offsets_header = 0
        self._values_crc = 0
        self._offsets_crc = 0
        self._buffer = np.empty(OFFSET_BUFFER, dtype=np.int64)
        self._buffered = 0
        self._count = 0
        self._rows = 0
        self._row_bytes = 0
        self._closed = False

    @property
    def num_samples(self) -> int:
        """Samples appended so far."""
        return self._count

    @property
    def total_rows(self) -> int:
        """Rows appended so far, over all samples."""
        return self._rows

    def _start(self) -> None:
        """Open both files once dtype and feature shape are known, reserving room for their headers."""
        dtype = self._dtype if self._dtype is not None else np.dtype(np.float64)
        shape = self._feature_shape if self._feature_shape is not None else ()
        self._dtype, self._feature_shape = dtype, shape
        self._row_bytes = dtype.itemsize * math.prod(shape)
        self._values_header = header_size(dtype, shape)
        self._offsets_header = header_size(np.dtype(np.int64), ())
        self._values = open(self._tmp / VALUES, "wb")  # noqa: SIM115  (held open across appends)
        self._offsets = open(self._tmp / OFFSETS, "wb")  # noqa: SIM115
        self._files += [self._values, self._offsets]
        self._values.write(b"\0" * self._values_header)
        self._offsets.write(b"\0" * self._offsets_header)
        self._push_offset(0)

    def _push_offset(self, offset: int) -> None:
        self._buffer[self._buffered] = offset
        self._buffered += 1
        if self._buffered == OFFSET_BUFFER:
            self._flush_offsets()

    def _flush_offsets(self) -> None:
        chunk = self._buffer[: self._buffered].data.cast("B")
        self._offsets.write(chunk)
        self._offsets_crc = zlib.crc32(chunk, self._offsets_crc)
        self._buffered = 0

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this RaggedWriter for {self.path} is closed; open a new one to write again")

    def append(self, sample: Any) -> None:
        """Write one sample: an array (or CPU tensor) of shape ``(rows, *feature_shape)``, ``rows >= 0``.

        Raises:
            TypeError: its dtype differs from the store's.
            ValueError: it has no rows axis, or its feature shape differs from the store's.
        """
        self._check_open()
        index = self._count
        array = as_array(f"sample {index}", sample, what="an array or CPU tensor of shape (rows, *feature_shape)")
        if array.ndim == 0:
            raise ValueError(
                f"sample {index} is a scalar, but every sample needs a rows axis: shape (rows, *feature_shape)"
            )
        if self._dtype is None:
            self._dtype = check_dtype(f"sample {index}'s dtype", array.dtype)
            self._dtype_source = f"sample {index}"
        if self._feature_shape is None:
            self._feature_shape = tuple(array.shape[1:])
            self._shape_source = f"sample {index}"
        if self._values is None:
            self._start()
        if array.dtype != self._dtype:
            raise TypeError(
                f"sample {index} has dtype {array.dtype}, but the store holds {self._dtype} (set by "
                f"{self._dtype_source}); convert it first, e.g. array.astype(np.{self._dtype.name})"
            )
        if array.shape[1:] != self._feature_shape:
            raise ValueError(
                f"sample {index} has shape {array.shape}, so feature shape {array.shape[1:]}, but the store "
                f"holds rows of shape {self._feature_shape} (set by {self._shape_source})"
            )
        if array.size:
            data = np.ascontiguousarray(array).reshape(-1).data.cast("B")
            self._values.write(data)
            self._values_crc = zlib.crc32(data, self._values_crc)
        self._rows += array.shape[0]
        self._count += 1
        self._push_offset(self._rows)

    def extend(self, samples: Iterable[Any], *, progress: bool = False) -> None:
        """:meth:`append` every sample of ``samples``; ``progress=True`` shows a tqdm bar (extra ``progress``)."""
        self._check_open()
        check_iterable("samples", samples, of="arrays")
        if check_bool("progress", progress):
            samples = _progress_bar(samples)
        for sample in samples:
            self.append(sample)

    def close(self) -> None:
        """Finish the store: headers, checksums, fsync, manifest last, then rename it into place."""
        self._check_open()
        if self._values is None:
            self._start()
        self._flush_offsets()
        dtype, feature_shape = self._dtype, self._feature_shape
        if dtype is None or feature_shape is None:
            raise RuntimeError("RaggedWriter._start did not set the dtype and feature shape")
        self._closed = True
        for file, header, file_dtype, shape in (
            (self._values, self._values_header, dtype, (self._rows, *feature_shape)),
            (self._offsets, self._offsets_header, np.dtype(np.int64), (self._count + 1,)),
        ):
            file.seek(0)
            file.write(npy_header(file_dtype, shape, header))
            file.flush()
            os.fsync(file.fileno())
            file.close()
        values_bytes = self._values_header + self._rows * self._row_bytes
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": dtype.str,
            "feature_shape": list(feature_shape),
            "num_samples": self._count,
            "total_rows": self._rows,
            "files": {
                VALUES: {
                    "bytes": values_bytes,
                    "header_bytes": self._values_header,
                    "crc32": self._values_crc,
                    "sampled_crc32": sampled_crc(self._tmp / VALUES, self._values_header, values_bytes),
                },
                OFFSETS: {
                    "bytes": self._offsets_header + 8 * (self._count + 1),
                    "header_bytes": self._offsets_header,
                    "crc32": self._offsets_crc,
                },
            },
        }
        if self._count:  # the length index, so the store is ready for BucketBatchSampler (docs/scale.md)
            prebuild_store_index(self._tmp, np.load(self._tmp / OFFSETS, mmap_mode="r"), manifest)
        with open(self._tmp / MANIFEST, "w") as file:
            json.dump(manifest, file, indent=2)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        fsync_path(self._tmp)
        self._publish()
        fsync_path(self.path.parent)

    def _publish(self) -> None:
        """Rename the finished directory to ``path``; with another writer publishing at once, the last wins."""
        old = self._claim.old  # named after the claim, so a writer killed here leaves nothing unowned
        for _ in range(_PUBLISH_TRIES):
            if not self.path.exists():
                if _renamed(self._tmp, self.path):
                    break
                continue  # another writer published first: replace its store
            check_target(self.path, self.overwrite)
            if exchange(self._tmp, self.path):  # one atomic step: readers never find path missing
                shutil.rmtree(self._tmp, ignore_errors=True)  # the previous store, swapped into our directory
                break
            shutil.rmtree(old, ignore_errors=True)
            old.mkdir()
            if not _renamed(self.path, old / "store"):
                continue  # another writer moved it out first
            if _renamed(self._tmp, self.path):
                break
            # Another writer published between our two renames: the store moved out is older than theirs.
        else:
            raise RuntimeError(f"could not publish {self.path}: other writers kept replacing it; retry")
        self._cleanup.detach()
        shutil.rmtree(old, ignore_errors=True)
        self._claim.release()

    def abort(self) -> None:
        """Stop writing and delete the temporary directory; ``path`` is left as it was."""
        if self._closed:
            return
        self._closed = True
        for file in (self._values, self._offsets):
            if file is not None:
                file.close()
        self._cleanup()

    def __enter__(self) -> RaggedWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"RaggedWriter({str(self.path)!r}, num_samples={self._count}, total_rows={self._rows}, {state})"


_PUBLISH_TRIES = 64


def _discard(files: list[Any], claim: Claim) -> None:
    """Close the writer's files, remove its directory, release its claim (abort, or a writer garbage-collected)."""
    for file in files:
        file.close()
    claim.discard()


def _renamed(source: Path, target: Path) -> bool:
    """``os.rename``, or False when another writer got there first (the target is a non-empty directory, or the
    source is gone)."""
    try:
        os.rename(source, target)
    except FileNotFoundError:
        return False
    except OSError as error:
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True


def _progress_bar(samples: Iterable[Any]) -> Iterable[Any]:
    try:
        from tqdm.auto import tqdm
    except ImportError:
        raise ImportError("progress=True needs 'tqdm'; install it with: pip install 'shardwise[progress]'") from None
    total = len(samples) if isinstance(samples, Sized) else None
    return tqdm(samples, total=total, unit="sample", desc="writing ragged store")  # type: ignore[no-any-return]

