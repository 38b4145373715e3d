"""A driver process killed while nobody reports it: the real control plane fails its job over.

A real ``sparkpoint server`` (heartbeat timeout 2 s) and a real driver process of the PV job
that registers, obeys its first restore and then takes long to start (as Spark start-up
does; no Spark here). Its heartbeats keep the job alive through that wait; once the process
is SIGKILLed the job goes RESTARTING with a HEARTBEAT_TIMEOUT failure in its exception
history.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..support.waiting import wait_for
from .control_plane import REDIS_URL, ROOT, ServerProcess, running

TIMEOUT_S = 2.0

DRIVER = textwrap.dedent(
    """
    import sys, time
    from examples import pv_count
    from sparkpoint.checkpointing.config import CheckpointConfig
    from sparkpoint.graph import StreamExecutionEnvironment
    from sparkpoint.options import JobOptions
    from sparkpoint.runtime.driver import JobDriver

    job_id, prefix, redis_url, base = sys.argv[1:5]
    options = JobOptions(
        job_id=job_id,
        standalone=False,
        redis_url=redis_url,
        stream_prefix=prefix,
        checkpoint=CheckpointConfig(interval_ms=1000),  # the default restart: exponential-delay
        checkpoint_dir=f"file://{base}/chk",
        local_dir=f"{base}/local",
    )
    env = StreamExecutionEnvironment(options)
    pv_count.build(env, ["--events", "10", "--output", f"{base}/out"])
    JobDriver(env.graph, options).authority.prepare()
    print("started", flush=True)
    time.sleep(3600)  # a Spark start-up that takes its time, until the process is killed
    """
)


class ShortHeartbeatServer(ServerProcess):
    def env(self) -> dict[str, str]:
        return {**super().env(), "SPARKPOINT_HEARTBEAT_TIMEOUT": str(TIMEOUT_S)}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ShortHeartbeatServer]:
    yield from running(ShortHeartbeatServer(tmp_path / "data"))


def test_a_killed_driver_fails_its_job_over_after_the_heartbeat_timeout(
    server: ShortHeartbeatServer, tmp_path: Path
) -> None:
    job_id = f"hb-{uuid.uuid4().hex[:8]}"
    log = open(tmp_path / "driver.log", "wb")  # the child writes to it
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, job_id, server.prefix, REDIS_URL, str(tmp_path)],
        cwd=ROOT,
        env={
            **server.env(),
            "SPARKPOINT_HEARTBEAT_INTERVAL": "0.2",
            "PYTHONPATH": str(ROOT / "jobs"),  # the example jobs
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with server.api() as api:

            def job() -> Any:
                response = api.get(f"/jobs/{job_id}")
                return response.json() if response.status_code == 200 else None

            registered = wait_for(f"the job registered (see {log.name})", job, timeout_s=60)
            assert registered["state"] == "CREATED"
            waited_until = time.monotonic() + 2 * TIMEOUT_S
            while time.monotonic() < waited_until:  # the driver is alive: no failover
                assert job()["state"] == "CREATED"
                time.sleep(0.2)
            assert job()["driver"]["heartbeat-interval"] == 200
            driver.send_signal(signal.SIGKILL)
            driver.wait(timeout=30)
            wait_for("the failover", lambda: job()["state"] == "RESTARTING", timeout_s=30)
            [entry] = api.get(f"/jobs/{job_id}/exceptions").json()["exceptionHistory"]["entries"]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
        log.close()
    assert entry["exceptionName"] == "HEARTBEAT_TIMEOUT"
    assert "no heartbeat from the driver (incarnation " in entry["stacktrace"]
    assert "for 2 s (the last one arrived at " in entry["stacktrace"]
    assert entry["action"].startswith("restart in ")
