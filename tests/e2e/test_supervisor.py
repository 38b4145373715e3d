"""`sparkpoint run` as a supervisor, with stand-in driver processes (no Spark, seconds each).

The job file is a small script: the supervisor runs it in a real child process exactly as it
runs a real job's driver, so these tests see real deaths, real signals and real delays.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ..support.waiting import wait_for
from .control_plane import ROOT

#: A driver that appends one line per start to ``runs`` (when, and the previous driver's
#: failure), then acts as ``ACT`` says: die by SIGKILL, lose its Spark, or finish (a job of
#: ten records, run in the process: a job file that runs no job is refused).
DRIVER = """
import os, signal, sys, time
from pathlib import Path

state = Path(sys.argv[sys.argv.index("--state") + 1])
with (state / "runs").open("a") as f:
    f.write(f"{time.monotonic()} {os.environ.get('SPARKPOINT_PREVIOUS_DRIVER_FAILURE', '-')}\\n")
n = len((state / "runs").read_text().splitlines())
act = os.environ["ACT"].split(",")[min(n, len(os.environ["ACT"].split(","))) - 1]
if act == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if act == "refused":
    sys.exit(1)  # as a connected driver whose control plane refused it (no more restarts)
if act == "lost":
    from sparkpoint.runtime.spark import SparkLostError
    raise SparkLostError("the Spark JVM (pid 4242) exited with signal 9", "fake")
if act == "cancelable":
    from sparkpoint.runtime.authority import JobCanceledError
    got = []
    signal.signal(signal.SIGTERM, lambda s, _f: got.append(s))
    (state / "pid").write_text(str(os.getpid()))
    while not got:
        time.sleep(0.05)
    raise JobCanceledError("job fake canceled by SIGTERM", got[0])
if act == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    (state / "pid").write_text(str(os.getpid()))
    while True:
        time.sleep(0.05)
# finish: a job of ten records in this process (no Spark), as a driver that ran its job
from sparkpoint import FileSink, GeneratorSource, StreamExecutionEnvironment
from sparkpoint.options import JobOptions

env = StreamExecutionEnvironment(JobOptions(job_id="fake", local_dir=str(state / "job")))
env.from_source(GeneratorSource(events=10, apps=2, rate=0), uid="events").sink_to(
    FileSink(str(state / "out")), uid="sink"
)
env.execute("fake", in_process=True)
"""


def _start(
    tmp_path: Path, act: str, *options: str, standalone: bool = True
) -> subprocess.Popen[str]:
    job = tmp_path / "driver.py"
    job.write_text(DRIVER)
    (tmp_path / "runs").touch()
    (tmp_path / "tmp").mkdir(exist_ok=True)
    mode = ["--standalone"] if standalone else []
    # Its own --local-dir: a run's lock (run_lock.py) outlives a killed supervisor's driver.
    local = ["--local-dir", str(tmp_path / "local")]
    args = [*mode, *options, "--job-id", "fake", *local, "--state", str(tmp_path)]
    return subprocess.Popen(
        [sys.executable, "-m", "sparkpoint.cli", "run", str(job), *args],
        cwd=ROOT,
        env={**os.environ, "ACT": act, "TMPDIR": str(tmp_path / "tmp")},
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def _runs(tmp_path: Path) -> list[tuple[float, str]]:
    lines = (tmp_path / "runs").read_text().splitlines()
    return [(float(t), cause) for t, cause in (line.split(" ", 1) for line in lines)]


def test_driver_deaths_follow_the_restart_strategy_and_its_delay(tmp_path: Path) -> None:
    proc = _start(tmp_path, "kill", "--restart-attempts", "2", "--restart-delay", "0.5")
    rc, err = _finish(proc)
    runs = _runs(tmp_path)
    assert rc == 1, err
    assert len(runs) == 3  # the first start and two restarts, as fixed-delay attempts=2 says
    assert [cause for _, cause in runs] == ["-", "killed by SIGKILL", "killed by SIGKILL"]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(runs)]
    assert min(gaps) >= 0.5, gaps
    lines = [line for line in err.splitlines() if line.startswith("sparkpoint run: driver")]
    assert lines == [
        "sparkpoint run: driver of job fake died (killed by SIGKILL); restarting from the "
        "beginning (no checkpoint completed) (fixed-delay: restart 1 of 2 in 500 ms)",
        "sparkpoint run: driver of job fake died (killed by SIGKILL); restarting from the "
        "beginning (no checkpoint completed) (fixed-delay: restart 2 of 2 in 500 ms)",
        "sparkpoint run: driver of job fake died (killed by SIGKILL); not restarted: "
        "fixed-delay: failure 3 exceeds 2 attempts",
    ]


def test_without_checkpointing_the_default_strategy_restarts_nothing(tmp_path: Path) -> None:
    """Flink's default without checkpointing is no restart: a restart would redo the job."""
    rc, err = _finish(_start(tmp_path, "kill"))
    assert rc == 1
    assert len(_runs(tmp_path)) == 1
    assert "not restarted: restart strategy is none: the job fails" in err


def test_connected_the_control_plane_decides_and_the_supervisor_restarts_at_once(
    tmp_path: Path,
) -> None:
    """Connected: the job's restart strategy lives in the control plane (an operator may change
    it there); the supervisor starts a new driver at once, whose registration carries the
    cause, and ends when the control plane refuses one (exit 1)."""
    redis = ("--redis-url", "redis://127.0.0.1:6379/0")
    proc = _start(
        tmp_path, "kill,kill,refused", *redis, "--restart-attempts", "0", standalone=False
    )
    rc, err = _finish(proc)
    assert rc == 1, err
    assert [c for _, c in _runs(tmp_path)] == ["-", "killed by SIGKILL", "killed by SIGKILL"]
    assert err.count("the control plane decides whether and when the job restarts") == 2


def test_a_driver_that_lost_its_spark_is_restarted_with_the_cause(tmp_path: Path) -> None:
    rc, err = _finish(_start(tmp_path, "lost,finish", "--restart-delay", "0"))
    assert rc == 0, err
    cause = "job fake: lost the driver's Spark: the Spark JVM (pid 4242) exited with signal 9"
    assert [c for _, c in _runs(tmp_path)] == ["-", cause]
    assert f"sparkpoint run: driver of job fake died ({cause}); restarting" in err


def test_sigterm_is_forwarded_to_the_driver_and_nothing_restarts(tmp_path: Path) -> None:
    proc = _start(tmp_path, "cancelable", "--restart-delay", "0")
    pid = int(wait_for("the driver's pid", lambda: _read(tmp_path / "pid"), 30, 0.05))
    proc.send_signal(signal.SIGTERM)
    rc, err = _finish(proc)
    assert rc == 128 + signal.SIGTERM, err
    assert "job fake canceled by SIGTERM" in err
    assert len(_runs(tmp_path)) == 1
    assert not psutil.pid_exists(pid)


def test_a_supervisor_killed_by_sigkill_leaves_no_orphan_driver(tmp_path: Path) -> None:
    proc = _start(tmp_path, "cancelable", "--restart-delay", "0")
    pid = int(wait_for("the driver's pid", lambda: _read(tmp_path / "pid"), 30, 0.05))
    proc.kill()
    proc.wait(timeout=10)
    wait_for("the driver to cancel", lambda: not psutil.pid_exists(pid), 10, 0.05)
    # Nor a file: the termination log has no name to leave behind.
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_second_signal_kills_the_driver_at_once(tmp_path: Path) -> None:
    proc = _start(tmp_path, "stubborn", "--restart-delay", "0")
    pid = int(wait_for("the driver's pid", lambda: _read(tmp_path / "pid"), 30, 0.05))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert psutil.pid_exists(pid)  # it ignores the first one: it may finish its epoch
    proc.send_signal(signal.SIGINT)
    rc, _ = _finish(proc)
    assert rc == 128 + signal.SIGINT
    assert not psutil.pid_exists(pid)
    assert len(_runs(tmp_path)) == 1


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
