"""`sparkpoint run` of the PV job under real deaths: its Spark JVM killed, SIGTERM, restores.

Processes are killed from outside, as the OOM killer or a user would: the supervisor is
``sparkpoint run``, its child is the driver (Python), the driver's child is the Spark JVM.
Committed output (files under ``--output`` not starting with ``.`` or ``_``) must equal a
failure-free run's, line for line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sparkpoint.testing import line_counts

from ..runtime.pv_harness import expected_every_lines
from ..support.waiting import wait_for
from .control_plane import ROOT

pytestmark = [pytest.mark.spark, pytest.mark.long]  # make test-long, not CI


def _pv(tmp_path: Path, *extra: str) -> list[str]:
    """``sparkpoint run`` of the PV job: 12,000 events, 7 apps, small epochs, 0.2 s checkpoints."""
    return [
        sys.executable,
        "-m",
        "sparkpoint.cli",
        "run",
        "jobs/examples/pv_count.py",
        "--standalone",
        "--job-id",
        "pv",
        "--checkpoint-dir",
        f"file://{tmp_path / 'chk'}",
        "--checkpoint-interval",
        "0.2",
        "--max-epoch-records",
        "1000",
        "--local-dir",
        str(tmp_path / "local"),
        "--events-log",
        str(tmp_path / "events.jsonl"),
        "--master",
        "local[2]",
        "--events",
        "12000",
        "--apps",
        "7",
        "--output",
        str(tmp_path / "out"),
        *extra,
    ]


def _start(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    cmd = _pv(tmp_path, *extra)
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        _pv(tmp_path, *extra), cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


def _driver(supervisor: subprocess.Popen[str]) -> psutil.Process | None:
    children = psutil.Process(supervisor.pid).children()
    return children[0] if children else None


def _jvm(driver: psutil.Process | None) -> psutil.Process | None:
    try:
        return next((c for c in driver.children() if c.name() == "java"), None) if driver else None
    except psutil.NoSuchProcess:
        return None


def _completed(tmp_path: Path) -> list[int]:
    job = tmp_path / "chk" / "pv"
    if not job.is_dir():
        return []
    return sorted(int(d.name[4:]) for d in job.glob("chk-*") if (d / "_metadata").exists())


def _events(tmp_path: Path, kind: str) -> list[dict]:
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


def test_standalone_checkpoints_in_memory_are_refused(tmp_path: Path) -> None:
    job = ["run", "jobs/examples/pv_count.py", "--standalone", "--job-id", "pv"]
    options = ["--checkpoint-interval", "1", "--output", str(tmp_path / "out")]
    proc = subprocess.run(
        [sys.executable, "-m", "sparkpoint.cli", *job, *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "sparkpoint run: invalid configuration: job pv: --standalone with "
        "--checkpoint-interval > 0 needs --checkpoint-dir: checkpoints kept in memory die with "
        "a crashed driver, and its restart would repeat the output they committed"
    ]


def test_a_killed_spark_jvm_restarts_the_driver_at_start_and_mid_run(tmp_path: Path) -> None:
    """The JVM dies while the SparkSession starts, then (in the next driver) after a checkpoint
    completed: each time the driver ends as lost, and the supervisor restarts it."""
    sup = _start(tmp_path, "--restart-attempts", "3", "--restart-delay", "0", "--rate", "3000")
    try:
        # Step 1: the first driver's JVM, as soon as it exists.
        first = wait_for("the first JVM", lambda: _jvm(_driver(sup)), 60, 0.02)
        first.kill()
        # Step 2: the second driver's JVM, once a checkpoint of that driver completed.
        second = wait_for(
            "a second JVM", lambda: (j := _jvm(_driver(sup))) and j.pid != first.pid and j, 60
        )
        wait_for("a completed checkpoint", lambda: _completed(tmp_path), 60, 0.05)
        second.kill()
        _, err = sup.communicate(timeout=120)
    finally:
        sup.kill()
    assert sup.returncode == 0, err[-3000:]
    deaths = [line for line in err.splitlines() if line.startswith("sparkpoint run: driver")]
    assert len(deaths) == 2, err[-3000:]
    assert all("lost the driver's Spark: " in line for line in deaths), deaths
    assert "restarting from the beginning" in deaths[0]
    assert "restarting from file://" in deaths[1]
    assert "Traceback" not in err, err[-3000:]  # pyspark's accumulator server keeps quiet
    assert line_counts(str(tmp_path / "out")) == expected_every_lines()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_cancels_at_an_epoch_boundary_and_a_restore_finishes_the_job(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGINT too (Ctrl-C): the SparkContext installs pyspark's own SIGINT handler, which
    would raise KeyboardInterrupt in the middle of an epoch; the driver's handler wins."""
    sup = _start(tmp_path, "--rate", "1000")
    try:
        wait_for("a completed checkpoint", lambda: _completed(tmp_path), 60, 0.05)
        driver = _driver(sup)
        jvm = _jvm(driver)
        assert driver is not None and jvm is not None
        sup.send_signal(signum)
        _, err = sup.communicate(timeout=30)
    finally:
        sup.kill()
    assert sup.returncode == 128 + signum, err[-3000:]
    assert f"sparkpoint run: job pv canceled by {signum.name}" in err
    assert "Traceback" not in err, err[-3000:]
    wait_for(
        "the driver and its JVM to end",
        lambda: not driver.is_running() and not jvm.is_running(),
        10,
    )
    statuses = [e["payload"]["status"] for e in _events(tmp_path, "job_status")]
    assert statuses[-3:] == ["RUNNING", "CANCELLING", "CANCELED"]
    latest = _completed(tmp_path)[-1]
    assert line_counts(str(tmp_path / "out")) != expected_every_lines()
    # The canceled run left nothing that a restore of its latest checkpoint cannot finish.
    done = _run(tmp_path, "--from-checkpoint", str(tmp_path / "chk" / "pv" / f"chk-{latest}"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert line_counts(str(tmp_path / "out")) == expected_every_lines()


def test_restoring_an_older_checkpoint_continues_ids_and_attempts(tmp_path: Path) -> None:
    first = _run(tmp_path, "--retained", "100")
    assert first.returncode == 0, first.stderr[-3000:]
    ids = _completed(tmp_path)
    assert len(ids) >= 4
    attempts = {e["attempt"] for e in _events(tmp_path, "checkpoint_completed")}
    (tmp_path / "events.jsonl").unlink()
    older = tmp_path / "chk" / "pv" / f"chk-{ids[1]}"
    again = _run(tmp_path, "--retained", "100", "--from-checkpoint", str(older))
    assert again.returncode == 0, again.stderr[-3000:]
    triggered = [e["payload"]["checkpoint_id"] for e in _events(tmp_path, "checkpoint_triggered")]
    assert triggered and min(triggered) == max(ids) + 1
    restored = _events(tmp_path, "job_restored")
    assert restored[0]["payload"]["checkpoint_id"] == ids[1]
    assert restored[0]["attempt"] == max(attempts) + 1
