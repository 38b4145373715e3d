"""What `sparkpoint run --fail-after` prints: the failure and the restore, no Python traceback.

The injected failure fails one source task of the first epoch while the other one is still
writing its 100,000 records; Spark kills that one and closes its Python worker's socket, and
PySpark's daemon would print the worker's ``BrokenPipeError`` traceback on the console. This
runs a separate process because the console is the Spark JVM's stderr too (the daemon's
output goes through it), which a test cannot capture from the test run's shared SparkSession.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.slow]

# The JVM's own line at start-up (Java 17+ with Spark's vector module), not Sparkpoint's.
_JVM_START = "WARNING: Using incubator modules: jdk.incubator.vector"


def test_injected_failure_prints_no_traceback_of_the_killed_task(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("sparkpoint")),
            "run",
            "jobs/examples/pv_count.py",
            "--standalone",
            "--master",
            "local[2]",
            "--checkpoint-interval",
            "0.2",
            "--checkpoint-dir",
            f"file://{tmp_path / 'chk'}",
            "--local-dir",
            str(tmp_path / "local"),
            "--restart-delay",
            "0",
            # The first epoch reads this much of each split: the failure at offset 2000 comes
            # while the other split's task still writes (killed, it prints no traceback).
            "--min-epoch-records",
            "100000",
            "--events",
            "200000",
            "--apps",
            "7",
            "--rate",
            "0",
            "--output",
            str(tmp_path / "out"),
            "--fail-after",
            "2000",
        ],
        cwd=ROOT,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == f"pv-count: committed output in {tmp_path / 'out'}\n"
    lines = proc.stderr.splitlines()
    prefix = lines[-1].split(": ", 1)[0]  # "sparkpoint <short job id>"
    # Only Sparkpoint's lines: no BrokenPipeError from the killed task's Python worker.
    others = [line for line in lines if not line.startswith(f"{prefix}: ")]
    assert others in ([], [_JVM_START]), proc.stderr
    [failure] = [line for line in lines if "ERROR: " in line]
    spark_log = Path(failure.split("(Spark's log: ")[1].removesuffix(")"))
    # The task's wall clock when it raised the failure: the driver hears of it a moment later.
    raised = re.search(r"\) at unix time (\d+\.\d{3}) \(Spark's log", failure)
    assert raised is not None, failure
    assert failure == (
        f"{prefix}: ERROR: attempt 1 failed in epoch 0 (events[0]): InjectedFailure: injected "
        "failure in source events[0] at offset 2000 of generator-0 (job attempt 1, epoch 0) "
        f"at unix time {raised[1]} (Spark's log: {spark_log})"
    )
    assert (
        f"{prefix}: WARNING: attempt 2 restored from the beginning (no checkpoint completed yet); "
        "0 transactions committed again, 0 uncommitted parts aborted"
    ) in lines
    assert re.fullmatch(rf"{prefix}: FINISHED: 200,000 records in .*, 1 restores", lines[-1])
    # The other task was killed while it wrote: its worker's end is a line of Spark's log.
    log = spark_log.read_text()
    assert "TaskKilled" in log
    assert re.search(
        r" WARN PythonDaemon: Python worker \d+ ended: the JVM closed its connection \(its task "
        r"was killed or failed\): (BrokenPipeError|ConnectionResetError): ",
        log,
    ), log[-3000:]
