"""Sparkpoint on a real Spark standalone cluster: a master and two worker JVMs on 127.0.0.1,
``sparkpoint run --master spark://...`` as a separate process, one worker killed (SIGKILL, its
executor with it) while an epoch's task runs on it.

The epoch fails with the lost executor as its cause, the job restores its latest checkpoint on
the executor left, and the committed output is exact: for the PV job (keyed counts) and for the
window job (keyed state with event-time timers). The driver's heartbeats list the executors and
their hosts, the lost one with Spark's reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from examples import window_count
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.testing import committed_lines, line_counts

from ..runtime.pv_harness import expected_every_lines
from .standalone import HOST, StandaloneCluster

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.long]  # make test-long, not CI
EVENTS, RATE = 3_000, 300.0  # 10 s of paced source
RUN_TIMEOUT_S = 240.0
LOST = re.compile(r"executor (\d+) on 127\.0\.0\.1 lost: ")


def _run_killing_a_worker(
    cluster: StandaloneCluster, base: Path, job: str, job_args: list[str]
) -> tuple[str, list[dict[str, Any]], str]:
    """``sparkpoint run`` of ``job`` on the cluster; once a checkpoint completed, SIGKILL the
    worker whose executor runs a task. Returns the job's stderr, its events and the id of the
    executor that was lost."""
    stderr, events = base / "stderr", base / "events.jsonl"
    cmd = [
        str(Path(sys.executable).with_name("sparkpoint")),
        "run",
        job,
        "--standalone",
        "--master",
        cluster.url,
        "--checkpoint-dir",
        f"file://{base / 'chk'}",  # one disk: every executor and the driver see it
        "--checkpoint-interval",
        "0.5",
        "--max-epoch-records",
        "300",
        "--local-dir",
        str(base / "local"),
        "--restart-delay",
        "0",
        "--events-log",
        str(events),
        *job_args,
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": HOST}
    with stderr.open("w") as err_file:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err_file, text=True
        )
        try:
            killed = _kill_a_busy_worker(cluster, proc, stderr)
            proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = stderr.read_text()
    assert proc.returncode == 0, text[-3000:]
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    return text, lines, killed


def _kill_a_busy_worker(cluster: StandaloneCluster, proc: subprocess.Popen[str], log: Path) -> str:
    """Once a checkpoint completed, freeze worker 1 and its executor (SIGSTOP): the epoch under
    way or the next one waits for a task there, which the driver's Spark UI shows. Then SIGKILL
    them, mid-task for sure. Returns the executor's id."""
    worker = cluster.worker_daemons[0]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    frozen = False
    text = ""
    while proc.poll() is None and time.monotonic() < deadline:
        text = log.read_text()
        ui = re.search(r"Spark application (\S+), Spark UI (\S+)", text)
        if ui is not None and "checkpoint 1 completed" in text:
            if not frozen:
                worker.freeze()
                frozen = True
            app_id, ui_url = ui.groups()
            busy = _busy_executor(app_id, ui_url, worker.ui_port)
            if busy is not None:
                worker.kill()
                return busy
        time.sleep(0.1)
    worker.kill()
    pytest.fail(f"no task ran on the frozen executor before the job ended:\n{text[-2000:]}")


def _busy_executor(app_id: str, ui: str, worker_ui_port: int) -> str | None:
    """The id of the executor of the worker whose UI is at ``worker_ui_port`` if it runs a
    task now (the driver's REST API links each executor's logs on its worker's UI)."""
    url = f"{ui.rstrip('/')}/api/v1/applications/{app_id}/executors"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            executors = json.load(answer)
    except OSError:
        return None
    for e in executors:
        logs = e.get("executorLogs", {}).get("stderr", "")
        if f":{worker_ui_port}/logPage" in logs and e["activeTasks"] > 0:
            return str(e["id"])
    return None


def _assert_recovered_from_the_lost_executor(
    text: str, events: list[dict[str, Any]], killed: str
) -> None:
    """One failure, caused by the killed worker's executor, and one restore."""
    failures = [e["payload"]["cause"] for e in events if e["type"] == "task_failed"]
    assert len(failures) == 1, failures
    lost = LOST.match(failures[0])
    assert lost is not None, failures
    assert lost[1] == killed, failures
    [line] = [line for line in text.splitlines() if "ERROR: attempt 1 failed in epoch" in line]
    assert f"executor {killed} on 127.0.0.1 lost: " in line
    assert "1 restores" in text
    # The heartbeats after the restore list the executors: the lost one with Spark's reason.
    [*_, last] = [e["payload"]["executors"] for e in events if e["type"] == "heartbeat"]
    by_id = {e["executor_id"]: e for e in last}
    assert by_id[killed]["active"] is False and by_id[killed]["remove_reason"], last
    assert any(e["active"] and e["host"] == HOST for e in last), last


def test_pv_job_on_a_standalone_cluster_survives_a_killed_worker(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = ["--events", str(EVENTS), "--apps", "7", "--rate", str(RATE), "--output", str(out)]
    text, events, killed = _run_killing_a_worker(
        cluster, tmp_path, "jobs/examples/pv_count.py", args
    )
    _assert_recovered_from_the_lost_executor(text, events, killed)
    assert line_counts(str(out)) == expected_every_lines(EVENTS)


def _expected_windows(events: int, apps: int, rate: float) -> Counter[str]:
    """Each (app, sliding window) with its count, from the source's own records."""
    source = GeneratorSource(events=events, apps=apps, rate=rate)
    counts: Counter[tuple[str, int]] = Counter()
    for split in range(source.splits):
        batch = source.read(split, 0, source.total(split) or 0)
        times = np.asarray(batch.column("event_time")).tolist()
        for app, t in zip(batch.column("app_id").tolist(), times, strict=True):
            last = t - t % window_count.SLIDE_MS
            first = last - window_count.WINDOW_MS + window_count.SLIDE_MS
            for start in range(first, last + 1, window_count.SLIDE_MS):
                counts[(app, start)] += 1
    return Counter(
        json.dumps(
            {"app_id": a, "window_start": s, "window_end": s + window_count.WINDOW_MS, "count": n},
            sort_keys=True,
        )
        for (a, s), n in counts.items()
    )


def test_window_job_with_timers_on_a_standalone_cluster_survives_a_killed_worker(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """Open windows are keyed state and fire on event-time timers: both are restored."""
    out = tmp_path / "out"
    args = ["--events", str(EVENTS), "--apps", "4", "--rate", str(RATE), "--output", str(out)]
    text, events, killed = _run_killing_a_worker(
        cluster, tmp_path, "jobs/examples/window_count.py", args
    )
    _assert_recovered_from_the_lost_executor(text, events, killed)
    committed = Counter(
        json.dumps(json.loads(line), sort_keys=True) for line in committed_lines(str(out))
    )
    assert committed == _expected_windows(EVENTS, 4, RATE)
