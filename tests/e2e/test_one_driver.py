"""A second ``sparkpoint run --job-id J`` while J's driver runs is refused before it touches
the job, through the real control plane, drivers and Spark: it used to register as a restarted
driver, the control plane failed the running job over to it, both read the job's commands from
one consumer group, and the job completed no checkpoint until the heartbeat timeout gave the
second one up. The running job goes on as if nothing happened. And a driver paused for longer
than its lease lives, which another driver took over meanwhile, stops when it wakes without
touching the job."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from sparkpoint.testing import line_counts

from ..runtime.pv_harness import EVENTS, expected_every_lines
from ..support.waiting import wait_for
from .control_plane import ServerProcess, completed_checkpoints
from .test_origin_failover import _finished, _pv

pytestmark = [pytest.mark.spark, pytest.mark.long]  # make test-long, not CI


def test_a_second_driver_of_a_running_job_is_refused_and_the_job_runs_on(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Leases live 3 s (heartbeats every second): the second driver waits 4 s for the first.
    monkeypatch.setenv("SPARKPOINT_HEARTBEAT_INTERVAL", "1")
    run = ("--job-id", "once", "--checkpoint-interval", "0.5")
    first = _pv(server, tmp_path, "first", *run, events=3 * EVENTS)  # 24 s of input
    try:
        with server.api() as api:
            wait_for("the job to register", lambda: api.get("/jobs/once").status_code == 200)
            wait_for("a completed checkpoint", lambda: completed_checkpoints(api, "once"))
            started = time.monotonic()
            second = _pv(server, tmp_path, "second", *run, "--control-plane-timeout", "3")
            said, _ = second.communicate(timeout=120)
            waited = time.monotonic() - started
            assert first.poll() is None, "the first driver ended before the second was refused"
            assert second.returncode == 1, said
            assert "runs with another driver (pid " in said
            assert "waiting for it to end (0 s of 4 s;" in said
            assert "sparkpoint run: job once is running with another driver (pid " in said
            assert "a job runs one driver at a time. Stop that one first" in said
            assert 4 <= waited < 60
            output = _finished(first)
            job = api.get("/jobs/once").json()
            assert (job["state"], job["attempt"]) == ("FINISHED", 1)
            history = api.get("/jobs/once/checkpoints").json()
            assert history["counts"]["restored"] == 0 and history["counts"]["failed"] == 0
    finally:
        if first.poll() is None:
            first.kill()
    assert "RESTARTING" not in output
    assert line_counts(str(tmp_path / "out")) == expected_every_lines(3 * EVENTS)


def _driver_of(supervisor: subprocess.Popen[str]) -> psutil.Process:
    """The driver process that ``sparkpoint run`` started (its Python child, not the JVM)."""
    children = psutil.Process(supervisor.pid).children()
    [driver] = [c for c in children if "sparkpoint.cli" in " ".join(c.cmdline())]
    return driver


def test_a_paused_driver_that_another_took_over_from_stops_when_it_wakes(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first driver is paused (SIGSTOP: a VM paused, a process cut off from Redis) for
    longer than its lease lives (3 s), a second driver of the job takes it over and the control
    plane fails the job over to it. Woken, the first reads no command meant for the second
    (they share the job's consumer group) and ends, exit 1, naming the driver that runs the
    job; the second finishes it, and the output is a failure-free run's."""
    monkeypatch.setenv("SPARKPOINT_HEARTBEAT_INTERVAL", "1")
    run = ("--job-id", "paused", "--checkpoint-interval", "0.5")
    first = _pv(server, tmp_path, "first", *run, events=3 * EVENTS)
    second: subprocess.Popen[str] | None = None
    try:
        with server.api() as api:
            wait_for("the job to register", lambda: api.get("/jobs/paused").status_code == 200)
            wait_for("a completed checkpoint", lambda: completed_checkpoints(api, "paused"))
            driver = _driver_of(first)
            driver.send_signal(signal.SIGSTOP)
            newest = completed_checkpoints(api, "paused")[0]["id"]
            try:
                second = _pv(
                    server,
                    tmp_path,
                    "second",
                    *run,
                    "--control-plane-timeout",
                    "20",
                    events=3 * EVENTS,
                )
                wait_for(
                    "the job to fail over to the second driver",
                    lambda: (
                        api.get("/jobs/paused").json()["attempt"] >= 2
                        and completed_checkpoints(api, "paused")[0]["id"] > newest
                    ),
                )
            finally:
                driver.send_signal(signal.SIGCONT)
            said, _ = first.communicate(timeout=60)
            assert first.returncode == 1, said[-4000:]
            assert "sparkpoint run: job paused was taken over by another driver (pid " in said
            output = _finished(second)
            job = api.get("/jobs/paused").json()
            assert job["state"] == "FINISHED", job
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
    assert "taken over" not in output
    assert line_counts(str(tmp_path / "out")) == expected_every_lines(3 * EVENTS)


def test_a_second_standalone_run_of_a_job_is_refused_and_the_first_runs_on(
    tmp_path: Path,
) -> None:
    """Two ``sparkpoint run --standalone --job-id J`` with one checkpoint directory used to
    write each other's checkpoints and output: both failed, with wrong counts and duplicate
    lines committed. The second is refused at once by the first's run lock."""

    def run() -> subprocess.Popen[str]:  # one --local-dir for both: the lock is there
        return _pv(None, tmp_path, "alone", *args, events=2 * EVENTS)

    args = ("--job-id", "alone", "--checkpoint-interval", "0.5")
    first = run()
    try:
        wait_for(
            "a completed checkpoint",
            lambda: list((tmp_path / "chk" / "alone").glob("chk-*/_metadata")),
        )
        second = run()
        said, _ = second.communicate(timeout=120)
        assert second.returncode == 1, said
        assert "sparkpoint run: job alone is running standalone in another process (pid " in said
        assert first.poll() is None, "the first run ended before the second was refused"
        output = _finished(first)
    finally:
        if first.poll() is None:
            first.kill()
    assert "RESTARTING" not in output
    assert line_counts(str(tmp_path / "out")) == expected_every_lines(2 * EVENTS)
