"""A real S3-compatible HTTP server (moto's standalone server) on 127.0.0.1, for tests and benchmarks.

``s3_endpoint()`` starts moto's threaded server on a free port, waits for it to answer (bounded),
yields its URL and stops it. Nothing is mocked in-process: clients talk HTTP to it.
``s3_endpoint(latency=0.03)`` delays every response by that many seconds before the server answers
(a sleep, no CPU): real object stores take tens of milliseconds to a first byte, moto on loopback
well under one, and a loader that downloads one object at a time only shows its cost with it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

START_TIMEOUT = 30.0
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def storage_options(endpoint: str) -> dict[str, Any]:
    """s3fs options for the endpoint: fake credentials, short timeouts, no instance cache."""
    return {
        "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "config_kwargs": {"connect_timeout": 5, "read_timeout": 20, "retries": {"max_attempts": 2}},
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }


class Gauge:
    """GET requests the server is answering now, the most at once (what a test asserts concurrency by), bytes sent,
    every request by method (``requests["HEAD"]``; a listing is a ``"LIST"``: a GET of the bucket), and the
    ``Range`` of every ranged GET. ``listed``: the part of ``sent`` that answered listings (not shard bytes)."""

    def __init__(self) -> None:
        self.now = self.peak = self.sent = self.listed = 0  # sent: bytes of every GET response body
        self.requests: collections.Counter[str] = collections.Counter()
        self.ranges: list[str] = []  # the Range header of every ranged GET, in order
        self._lock = threading.Lock()

    def seen(self, environ: Any) -> None:
        """Count one request (its method; ``LIST`` for a GET of the bucket itself: S3's ListObjects)."""
        method = _method(environ)
        with self._lock:
            self.requests[method] += 1
            if method == "GET" and environ.get("HTTP_RANGE"):
                self.ranges.append(environ["HTTP_RANGE"])

    def count(self, body: list[bytes], environ: Any) -> list[bytes]:
        """Add a GET response's body to ``sent`` (and ``listed`` for a listing); returns it."""
        nbytes = sum(len(chunk) for chunk in body)
        with self._lock:
            self.sent += nbytes
            if _method(environ) == "LIST":
                self.listed += nbytes
        return body

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


def _method(environ: Any) -> str:
    """A request's method, ``LIST`` for a GET of the bucket itself (S3's ListObjects)."""
    method: str = environ["REQUEST_METHOD"]
    if method == "GET" and environ.get("PATH_INFO", "").strip("/").count("/") == 0:
        return "LIST"
    return method


def _delayed(app: Any, latency: float, gauge: Gauge | None) -> Any:
    """A WSGI app that answers like ``app`` after sleeping ``latency`` seconds (the request's thread only)."""

    def delayed(environ: Any, start_response: Any) -> Any:
        if gauge is not None:
            gauge.seen(environ)
        if gauge is None or environ["REQUEST_METHOD"] != "GET":
            time.sleep(latency)
            return app(environ, start_response)
        with gauge:
            time.sleep(latency)
            return gauge.count(list(app(environ, start_response)), environ)  # the body is sent in the gauge

    return delayed


@contextlib.contextmanager
def s3_endpoint(latency: float = 0.0, gauge: Gauge | None = None) -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 for the duration of the block; yields ``http://127.0.0.1:PORT``.

    ``latency``: seconds every request waits before it is served (0: none); ``gauge`` counts the GETs
    being answered.
    """
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class Server(ThreadedMotoServer):  # type: ignore[misc]
        def _server_entry(self) -> None:  # moto's, with the app wrapped for a latency or a gauge
            app = DomainDispatcherApplication(create_backend_app)
            served = _delayed(app, latency, gauge) if latency or gauge is not None else app
            self._server = make_server(self._ip_address, self._port, served, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)
    port = free_port()
    server = Server(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"moto's S3 server did not answer on {endpoint} within {START_TIMEOUT:g} s") from None
                time.sleep(0.05)
        yield endpoint
    finally:
        server.stop()


def make_bucket(endpoint: str, bucket: str) -> Any:
    """Create ``bucket`` on the endpoint; returns an s3fs filesystem bound to it."""
    import boto3
    import s3fs

    # boto3, not s3fs.mkdir: s3fs sends a location constraint that us-east-1 refuses.
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return s3fs.S3FileSystem(**storage_options(endpoint))
