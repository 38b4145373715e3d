"""`sparkpoint run` connected to a (scripted) control plane: a killed driver is restarted and
the control plane, not the supervisor, names the checkpoint it restores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from sparkpoint import protocol as p
from sparkpoint.testing import line_counts
from sparkpoint.transport import Streams

from ..runtime.pv_harness import expected_every_lines
from ..runtime.scripted_control_plane import ScriptedControlPlane
from ..support.redis_server import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark


def test_a_killed_connected_driver_is_restarted_and_the_control_plane_fails_it_over(
    tmp_path: Path, client: redis.Redis, streams: Streams
) -> None:
    out = tmp_path / "out"
    exe = Path(sys.executable).with_name("sparkpoint")
    args = [
        *("run", "jobs/examples/pv_count.py", "--job-id", "crashy"),
        *("--redis-url", REDIS_URL, "--stream-prefix", streams.prefix),
        *("--checkpoint-dir", f"file://{tmp_path / 'chk'}", "--local-dir", str(tmp_path / "l")),
        *("--max-epoch-records", "1000", "--crash-after-checkpoint", "2"),
        *("--events", "12000", "--apps", "7", "--rate", "0", "--output", str(out)),
    ]
    with ScriptedControlPlane(client, streams) as cp:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}  # with its SPARKPOINT_JOB_KEY
        proc = subprocess.run(
            [str(exe), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
    assert cp.error is None
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "driver of job crashy died (killed by SIGKILL); starting a new driver: the control "
        "plane decides whether and when the job restarts"
    ) in proc.stderr
    assert "--from-checkpoint" not in proc.stderr
    # Two registrations, two incarnations; the second one was failed over to checkpoint 2,
    # whose sink transactions the killed driver never committed: the restore committed them.
    incarnations = [ev.incarnation for _, ev in cp.of_type(p.JobRegistered)]
    assert len(incarnations) == 2 and len(set(incarnations)) == 2
    restored = [(e.attempt, ev) for e, ev in cp.of_type(p.JobRestored)]
    assert [(a, r.checkpoint_id) for a, r in restored] == [(1, None), (2, 2)]
    assert restored[1][1].committed_transactions == 2
    assert line_counts(str(out)) == expected_every_lines()
    assert [ev.status for _, ev in cp.of_type(p.JobStatusChanged)][-1] is p.JobStatus.FINISHED
