"""The ``server`` fixture: a real ``sparkpoint server`` on the real Redis, streams of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .control_plane import ServerProcess, running


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from running(ServerProcess(tmp_path / "data"))
