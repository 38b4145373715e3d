"""Two real ``sparkpoint server`` processes on one data directory: the second is refused.

Both use the embedded Redis (no ``REDIS_URL``), the case where a second server used to stop
the live one's Redis as an orphan and delete its ``redis.url``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sparkpoint.transport import redis_client

from .control_plane import ROOT, ServerProcess, free_port


class EmbeddedRedisServer(ServerProcess):
    """A server that runs its own embedded Redis in its data directory."""

    def env(self) -> dict[str, str]:
        env = super().env()
        env.pop("REDIS_URL", None)
        env.pop("DATABASE_URL", None)
        return env


@pytest.fixture
def live(tmp_path: Path) -> Iterator[EmbeddedRedisServer]:
    srv = EmbeddedRedisServer(tmp_path / "data")
    srv.data_dir.mkdir()
    srv.start()
    yield srv
    srv.stop()


def _second_server(live: EmbeddedRedisServer) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("sparkpoint")
    return subprocess.run(
        [str(exe), "server", "--port", str(free_port())],
        cwd=ROOT,
        env=live.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_second_server_on_the_same_data_directory_is_refused_touching_nothing(
    live: EmbeddedRedisServer,
) -> None:
    url_file = live.data_dir / "redis.url"
    url = url_file.read_text()
    before = {p.name: p.stat().st_mtime_ns for p in live.data_dir.iterdir()}
    assert live.proc is not None

    second = _second_server(live)

    assert second.returncode == 2
    assert second.stdout == ""
    assert second.stderr.splitlines() == [
        f"sparkpoint server: data directory {live.data_dir.resolve()} is in use by another "
        f"sparkpoint server (pid {live.proc.pid}); stop that one, or give this one another "
        "SPARKPOINT_DATA_DIR"
    ]
    assert url_file.read_text() == url  # the live server's Redis is untouched
    assert {p.name: p.stat().st_mtime_ns for p in live.data_dir.iterdir()} == before
    client = redis_client(url.strip())
    try:
        assert client.ping()
    finally:
        client.close()
    assert httpx.get(f"{live.url}/healthz", timeout=5).status_code == 200


def test_a_killed_server_leaves_no_stale_lock(live: EmbeddedRedisServer) -> None:
    live.kill()  # SIGKILL: no cleanup at all; its Redis is an orphan now
    successor = EmbeddedRedisServer(live.data_dir, prefix=live.prefix)
    successor.start()
    try:
        assert httpx.get(f"{successor.url}/healthz", timeout=5).status_code == 200
        assert successor.proc is not None
        lock = (live.data_dir / "server.lock").read_text()
        assert lock == f"{successor.proc.pid}\n"
    finally:
        successor.stop()
