"""One shard from storage to the cache: the whole-shard download, its checks, and which errors are retried.

The download (one streamed ``GET``, or only the ranges the shard's pieces lack: NOTE [ Head first ]
in ``head.py``) is checked against the shard's indexed identity (``fetch.check_unchanged``) and
size before it is renamed into place. A missing or changed shard is a :class:`ShardError` at once;
a transient error (:func:`transient_errors`: a connection reset, a timeout, a truncated transfer) is
retried with backoff; any other error (a programming error, a bad argument) is raised as it is,
neither retried nor wrapped.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .fetch import PART, check_unchanged, for_sample, remove_leftovers
from .formats import ShardError
from .head import fetch_rest, fetch_whole, ledger_path

T = TypeVar("T")

_CLIENT_ERRORS = (  # (module, name): the base of a storage client's transport errors that are no OSError
    ("aiohttp", "ClientError"),  # s3fs, gcsfs, adlfs and fsspec's http: ServerDisconnectedError, ClientPayloadError...
    ("botocore.exceptions", "BotoCoreError"),  # EndpointConnectionError, ReadTimeoutError, IncompleteReadError...
    ("urllib3.exceptions", "HTTPError"),  # ProtocolError, ReadTimeoutError (clients over requests or urllib3)
)


def transient_errors() -> tuple[type[BaseException], ...]:
    """The errors a download retries: ``OSError`` (resets, truncated transfers, and Python 3.11's timeouts),
    ``asyncio.TimeoutError`` (fsspec's ``FSTimeoutError``; no OSError on 3.10), ``http.client.HTTPException``,
    and the transport errors of the storage clients in use (:data:`_CLIENT_ERRORS`).

    A client's errors are looked up among the modules already imported: a client that is not
    imported raises none, and nothing is imported for it. Cost: a few dict lookups, on an error only.
    """
    found: list[type[BaseException]] = [OSError, asyncio.TimeoutError, http.client.HTTPException]
    for module, name in _CLIENT_ERRORS:
        base = getattr(sys.modules.get(module), name, None)
        if isinstance(base, type) and issubclass(base, BaseException):
            found.append(base)
    return tuple(found)


def download(fs: Any, url: str, final: Path, size: int, version: str | None, sample: int | None, *,
             retries: int, backoff: float, timeout: float = 600.0, keep_ledger: bool = False) -> int:
    """Fetch shard ``url`` into ``final`` (renamed into place whole), checked against its size and ``version``.

    Returns the bytes downloaded. The caller holds ``final``'s file lock. ``keep_ledger``: the ledger
    of its pieces stays (NOTE [ Head first ]: the rows promised are read from ``final`` while a file
    is derived from it); the caller removes it.

    Raises:
        ShardError: the shard is missing or changed (at once), or could not be fetched whole
            after ``retries`` more attempts (``backoff`` seconds before the first, doubled, at most 8 s).
        Exception: any error that is not transient (:func:`transient_errors`), as it is, at once.
    """
    part = final.with_name(f"{final.name}{PART}{os.getpid()}")

    def attempt() -> int:
        try:
            # Pieces fetched first (NOTE [ Head first ] in head.py): only the rest, into their sparse file.
            rest = fetch_rest(fs, url, final, size, timeout)
            if rest is None:
                # get_file, not a read loop over fs.open: one streamed GET, about 2x faster a 1 MB shard
                # from S3 (no HEAD, no block cache; measured in docs/benchmarks/sharded-sources.md).
                fs.get_file(url, str(part))
                filled = part
            else:
                filled = rest[0]
            with open(filled, "rb+") as target:
                length = os.fstat(target.fileno()).st_size
                os.fsync(target.fileno())
            check_unchanged(fs, url, version, sample)  # not retried: a rewritten shard stays rewritten
            _check_length(url, sample, length, size)
            os.replace(filled, final)  # atomic: readers see the whole shard or nothing
            remove_leftovers(final, keep=ledger_path(final) if keep_ledger else None)
            return length if rest is None else rest[1]
        finally:
            part.unlink(missing_ok=True)

    return _retried(attempt, url, sample, retries, backoff)


def fetch(fs: Any, url: str, final: Path, size: int, version: str | None, sample: int | None, *,
          retries: int, backoff: float, timeout: float = 600.0) -> tuple[bytes | bytearray, int]:
    """Shard ``url`` whole in memory, checked against its size and ``version``: ``(its bytes, bytes fetched)``.

    What :func:`download` does, without a file: its pieces fetched first are read from ``final``'s
    sparse file (NOTE [ Head first ]), the rest fetched with one ranged ``GET`` each (a ranged
    ``GET`` of the whole shard when it has none: no ``HEAD`` first). The sparse file and its ledger
    stay (readers of the rows promised read them until the caller's file is in place); the caller
    removes them. The caller holds ``final``'s file lock. Raises as :func:`download` does.
    """

    def attempt() -> tuple[bytes | bytearray, int]:
        data, fetched = fetch_whole(fs, url, final, size, timeout)
        check_unchanged(fs, url, version, sample)  # not retried: a rewritten shard stays rewritten
        _check_length(url, sample, len(data), size)
        return data, fetched

    return _retried(attempt, url, sample, retries, backoff)


def _check_length(url: str, sample: int | None, length: int, size: int) -> None:
    """Raise ``OSError`` (retried) for a transfer of another length than the shard's (the same identity: truncated)."""
    if length != size:
        raise OSError(f"shard {url} {for_sample(sample)}has {length} bytes, but its metadata says {size}")


def _retried(attempt: Callable[[], T], url: str, sample: int | None, retries: int, backoff: float) -> T:
    """``attempt()``, again after a transient error, at most ``retries`` more times (backoff doubled, at most 8 s)."""
    delay = backoff
    for tried in range(retries + 1):
        try:
            return attempt()
        except FileNotFoundError as error:
            raise ShardError(f"shard {url} {for_sample(sample)}does not exist (was it moved or deleted?)") from error
        except ShardError:
            raise
        except transient_errors() as error:
            if tried == retries:
                raise ShardError(
                    f"could not fetch shard {url} {for_sample(sample)}after {tried + 1} attempts: {error}"
                ) from error
            time.sleep(delay)
            delay = min(2 * delay, 8.0)
    raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns or raises
