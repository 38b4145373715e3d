"""``sparkpoint list | cancel | restore ...`` against a real control plane."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sparkpoint import protocol as p
from sparkpoint.transport import RedisEventSink, Streams, redis_client

from .control_plane import REDIS_URL, ROOT, ServerProcess, wait_for


def _cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**server.env(), "SPARKPOINT_API_URL": server.url}
    return subprocess.run(
        [str(Path(sys.executable).with_name("sparkpoint")), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_list_cancel_and_errors_through_the_command_line(server: ServerProcess) -> None:
    sink = RedisEventSink(redis_client(REDIS_URL), Streams(prefix=server.prefix))
    vertex = p.VertexModel(id="source", name="source", parallelism=1, operators=["source"])
    sink.publish(
        [
            p.envelope(
                "job-cli",
                0,
                0,
                p.JobRegistered(
                    job_name="pv", vertices=[vertex], edges=[], config={}, incarnation="d1"
                ),
            ),
            p.envelope("job-cli", 1, 0, p.JobStatusChanged(status=p.JobStatus.RUNNING)),
        ]
    )
    listed = wait_for(
        "the job in `sparkpoint list`",
        lambda: "RUNNING" in (out := _cli(server, "list")).stdout and out,
    )
    assert "job-cli" in listed.stdout and "pv" in listed.stdout
    cancel = _cli(server, "cancel", "job-cli")
    assert cancel.returncode == 0 and "cancelling job job-cli" in cancel.stdout
    assert "CANCELLING" in _cli(server, "list").stdout
    unknown = _cli(server, "restore", "no-such-job", "--checkpoint", "3")
    assert unknown.returncode == 1 and "job no-such-job not found" in unknown.stderr
    wrong = _cli(server, "savepoint", "job-cli", "relative/dir")
    assert wrong.returncode == 1 and "target-directory" in wrong.stderr
