"""A real S3 API for the tests: moto's server on 127.0.0.1, a bucket per test, s3fs options.

The server speaks the S3 REST protocol over HTTP, so the code under test goes through s3fs,
aiobotocore and real requests exactly as against AWS. The driver's fsspec configuration for
``s3`` (endpoint and credentials) is what sinks and checkpoint storage capture and ship to
Spark executors, so :func:`s3_configured` sets it for the length of a test.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import fsspec
import fsspec.config
import pytest
from moto.server import ThreadedMotoServer

from .ports import free_port


@dataclass(frozen=True)
class S3Bucket:
    """A bucket of one test on the moto server; ``options`` are s3fs storage options."""

    name: str
    endpoint_url: str
    options: dict[str, Any]

    def url(self, *path: str) -> str:
        """``s3://<bucket>/<path>``."""
        return "/".join([f"s3://{self.name}", *path])

    def fs(self) -> fsspec.AbstractFileSystem:
        """An s3fs filesystem on the server (no listing cache: the tests read what others
        wrote)."""
        return fsspec.filesystem("s3", use_listings_cache=False, **self.options)


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on a free port of 127.0.0.1; yields its endpoint URL."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@contextmanager
def s3_configured(endpoint_url: str) -> Iterator[dict[str, Any]]:
    """Point fsspec's ``s3`` configuration at ``endpoint_url`` (dummy credentials) for the
    block; yields the storage options."""
    options: dict[str, Any] = {
        "endpoint_url": endpoint_url,
        "key": "sparkpoint-test",
        "secret": "sparkpoint-test",
    }
    saved = fsspec.config.conf.get("s3")
    fsspec.config.conf["s3"] = dict(options)
    try:
        yield options
    finally:
        if saved is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = saved


@contextmanager
def s3_bucket(endpoint_url: str) -> Iterator[S3Bucket]:
    """A new bucket on the server, with fsspec's ``s3`` configuration pointing there."""
    with s3_configured(endpoint_url) as options:
        bucket = S3Bucket(f"sparkpoint-{uuid.uuid4().hex[:12]}", endpoint_url, options)
        fs = bucket.fs()
        fs.mkdir(bucket.name)
        try:
            yield bucket
        finally:
            fs.rm(bucket.name, recursive=True)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """One moto S3 server for the test run; its endpoint URL."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint: str) -> Iterator[S3Bucket]:
    """A bucket of this test's own; fsspec's ``s3`` configuration points at the server."""
    with s3_bucket(s3_endpoint) as bucket:
        yield bucket
