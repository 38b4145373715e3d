"""The ``server`` fixture: a real ``sparkpoint server`` on the real Redis, streams of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkpoint.transport import redis_client

from .control_plane import REDIS_URL, ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "data")
    srv.data_dir.mkdir()
    srv.start()
    yield srv
    srv.stop()
    client = redis_client(REDIS_URL)
    for key in client.scan_iter(f"{srv.prefix}:*"):
        client.delete(key)
