"""The real Redis of the tests and stream names of one test only.

``REDIS_TEST_URL`` (default ``redis://127.0.0.1:6379/0``; ``.ci/run`` starts one there when
none answers). The ``client`` and ``streams`` fixtures in ``tests/conftest.py`` use these.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from sparkpoint.transport import Streams, redis_client

REDIS_URL = os.environ.get("REDIS_TEST_URL", "redis://127.0.0.1:6379/0")


@contextmanager
def redis_connection() -> Iterator[redis.Redis]:
    conn = redis_client(REDIS_URL)
    try:
        yield conn
    finally:
        conn.close()


@contextmanager
def streams_of_one_test(client: redis.Redis, label: str = "test") -> Iterator[Streams]:
    """Stream names under a prefix of their own; their keys are deleted afterwards."""
    names = Streams(prefix=f"{label}-{uuid.uuid4().hex}")
    try:
        yield names
    finally:
        keys = list(client.scan_iter(match=f"{names.prefix}:*"))
        if keys:
            client.delete(*keys)
