"""The ``harness`` fixture: a control plane on each database, with a real Redis."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint.transport import Streams, redis_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from service_harness import REDIS_URL, Harness


@pytest.fixture
def harness(tmp_path: Path, sessions: sessionmaker[Session]) -> Iterator[Harness]:
    client = redis_client(REDIS_URL)
    streams = Streams(prefix=f"test-{uuid.uuid4().hex[:8]}")
    yield Harness(tmp_path, sessions, client, streams)
    for key in client.scan_iter(f"{streams.prefix}:*"):
        client.delete(key)
    client.close()
