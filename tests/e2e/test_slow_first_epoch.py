"""A connected job whose first epoch outlasts the checkpoint timeout loses no checkpoint.

``slow_start_job.py`` spends 5 s loading a model in its first epoch, and checkpoints every
0.5 s time out after 2 s, none tolerated. A barrier triggered while that epoch runs rides the
next one, so it would expire and fail the job over at every start (it did: the first
checkpoint expired, then the job restored from the beginning). The control plane triggers no
periodic checkpoint of an attempt before its first epoch ended, as Flink triggers none before
all tasks run: every checkpoint completes, the job never restarts, and its committed output
is an uninterrupted run's.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from sparkpoint.testing import line_counts

from .control_plane import REDIS_URL, ServerProcess

pytestmark = pytest.mark.spark

EVENTS = 12_000
JOB = Path(__file__).with_name("slow_start_job.py")


def test_a_first_epoch_longer_than_the_checkpoint_timeout_expires_no_checkpoint(
    server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [
            str(Path(sys.executable).with_name("sparkpoint")),
            "run",
            str(JOB),
            "--job-id",
            "slow-start",
            "--redis-url",
            REDIS_URL,
            "--stream-prefix",
            server.prefix,
            "--checkpoint-dir",
            str(tmp_path / "chk"),
            "--local-dir",
            str(tmp_path / "local"),
            "--checkpoint-interval",
            "0.5",
            "--checkpoint-timeout",
            "2",
            "--",
            "--events",
            str(EVENTS),
            "--rate",
            "2000",
            "--load",
            "5",
            "--marker",
            str(tmp_path / "loaded"),
            "--output",
            str(out),
        ],
        cwd=tmp_path,
        env=server.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "loaded").exists()  # the load ran
    with server.api() as api:
        job = api.get("/jobs/slow-start").json()
        counts = api.get("/jobs/slow-start/checkpoints").json()["counts"]
    assert (job["state"], job["attempt"], job["restarts"]) == ("FINISHED", 1, 0), job
    assert counts["failed"] == 0 and counts["completed"] >= 2, counts
    # An uninterrupted run's output: every app's counts 1..n, each once.
    lines = line_counts(str(out))
    assert set(lines.values()) == {1}
    per_app: dict[str, list[int]] = defaultdict(list)
    for line in lines:
        app, pv = line.removeprefix('{"app_id": "').removesuffix("}").split('", "pv": ')
        per_app[app].append(int(pv))
    assert sum(len(v) for v in per_app.values()) == EVENTS
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in per_app.values())
