"""A connected job outlives its control plane's Redis down for longer than a driver retries,
and rides out a Redis that refuses writes for a while (its disk full).

Through the real control plane, ``sparkpoint run`` and Spark, on a Redis server of the test's
own (append-only file on, so that it comes back with its streams, as a production Redis
does): Redis is killed once the job has completed a checkpoint and started again 20 s later,
past the 8 s a driver retries Redis here (``SPARKPOINT_REDIS_RETRY_WINDOW``; 30 s by default).
The driver used to give up, exit 1,
and tell the control plane FAILED as soon as Redis was back: the job failed for good. Now the
driver ends as lost (exit 75), ``sparkpoint run`` starts the next, which waits for Redis,
registers, and the control plane fails the job over to its latest checkpoint: the committed
output equals a failure-free run's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.testing import line_counts

from ..runtime.pv_harness import EVENTS, expected_every_lines
from ..support.own_redis import OwnRedis
from ..support.waiting import wait_for
from .control_plane import ServerProcess, completed_checkpoints
from .test_origin_failover import _pv

pytestmark = [pytest.mark.spark, pytest.mark.long]  # make test-long, not CI

RETRY_WINDOW_S = 8  # the drivers' window in the outage (the refusal keeps the default, 30 s)
OUTAGE_S = 20.0
REFUSAL_S = 6.0


@dataclass
class OwnRedisServer(ServerProcess):
    redis_url: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return {**super().env(), "REDIS_URL": self.redis_url, **self.extra_env}


def _through(
    fault: Callable[[], None],
    own_redis: OwnRedis,
    tmp_path: Path,
    job_id: str,
    extra_env: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """Run the PV job connected through ``own_redis`` (with ``extra_env``), call ``fault``
    once a checkpoint has completed; the job must end with exit 0 and output equal to a
    failure-free run's. Returns what ``sparkpoint run`` said, the job, and its exception
    history."""
    server = OwnRedisServer(
        tmp_path / "data", redis_url=own_redis.url, extra_env=dict(extra_env or {})
    )
    server.data_dir.mkdir()
    server.start()
    events = 3 * EVENTS  # 24 s of input: the job is reading when the fault comes
    run = ("--job-id", job_id, "--checkpoint-interval", "0.5")
    job = _pv(server, tmp_path, job_id, *run, events=events, redis_url=own_redis.url)
    try:
        with server.api() as api:
            wait_for("the job to register", lambda: api.get(f"/jobs/{job_id}").status_code == 200)
            wait_for("a completed checkpoint", lambda: completed_checkpoints(api, job_id))
            fault()
            said, _ = job.communicate(timeout=300)
            assert job.returncode == 0, said[-5000:]
            final = api.get(f"/jobs/{job_id}").json()
            entries = api.get(f"/jobs/{job_id}/exceptions").json()["exceptionHistory"]["entries"]
    finally:
        if job.poll() is None:
            job.kill()
        server.stop()
    assert line_counts(str(tmp_path / "out")) == expected_every_lines(events)
    return said, final, entries


def test_a_connected_job_outlives_its_redis_down_longer_than_a_driver_retries(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    def outage() -> None:
        own_redis.kill()
        time.sleep(OUTAGE_S)  # the outage itself: longer than a driver retries Redis
        own_redis.start()

    window = {"SPARKPOINT_REDIS_RETRY_WINDOW": str(RETRY_WINDOW_S)}
    said, final, entries = _through(outage, own_redis, tmp_path, "outage", window)

    assert "sparkpoint run: driver of job outage died (lost the control plane's Redis: " in said
    assert (final["state"], final["attempt"]) == ("FINISHED", 2), final
    assert any("lost the control plane's Redis" in e["stacktrace"] for e in entries), entries


def test_a_connected_job_rides_out_its_redis_refusing_writes_while_its_disk_fails(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    """A Redis whose disk fills (or fails) refuses every write with ``MISCONF`` until it can
    write again. The driver used to take that refusal as final: exit 1, the job lost for good.
    Now it retries it as it retries an unreachable Redis, and the job goes on, unrestarted."""

    def refusal() -> None:
        own_redis.refuse_writes()
        time.sleep(REFUSAL_S)  # the fault itself: within the 30 s a driver retries Redis
        own_redis.accept_writes()

    said, final, entries = _through(refusal, own_redis, tmp_path, "refused")

    waited = [line for line in said.splitlines() if "refusing): " in line]
    assert waited and "MISCONF" in waited[0], said[-5000:]  # the driver saw it and waited
    assert (final["state"], final["attempt"]) == ("FINISHED", 1), final
    assert entries == []
