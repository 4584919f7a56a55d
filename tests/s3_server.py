"""A real S3-compatible HTTP server (moto's standalone server) on 127.0.0.1, for tests and benchmarks.

``s3_endpoint()`` starts ``moto.server.ThreadedMotoServer`` on a free port, waits for it to answer
(bounded), yields its URL and stops it. Nothing is mocked in-process: clients talk HTTP to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
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


@contextlib.contextmanager
def s3_endpoint() -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 for the duration of the block; yields ``http://127.0.0.1:PORT``."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
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
