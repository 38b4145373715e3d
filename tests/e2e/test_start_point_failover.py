"""A job started from a savepoint that fails before its first checkpoint restores that
savepoint again, through the real control plane: its committed output, together with the
stopped job's, is exactly a failure-free run's (restarting from the beginning instead would
count the savepoint's events twice)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.testing import line_counts

from ..runtime.pv_harness import APPS, EVENTS, expected_every_lines
from ..support.waiting import wait_for
from .control_plane import REDIS_URL, ROOT, ServerProcess

pytestmark = pytest.mark.spark


def _pv(server: ServerProcess, tmp_path: Path, name: str, *extra: str) -> subprocess.Popen[str]:
    """The PV job (every record's count) as a user starts it, connected to ``server``."""
    return subprocess.Popen(
        [
            str(Path(sys.executable).with_name("sparkpoint")),
            "run",
            "jobs/examples/pv_count.py",
            "--redis-url",
            REDIS_URL,
            "--stream-prefix",
            server.prefix,
            "--checkpoint-dir",
            f"file://{tmp_path / 'chk'}",
            "--local-dir",
            str(tmp_path / "local" / name),
            "--epoch-target-ms",
            "250",
            *extra,
            "--",
            "--events",
            str(EVENTS),
            "--apps",
            str(APPS),
            "--rate",
            "1500",
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=server.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finished(job: subprocess.Popen[str]) -> str:
    output, _ = job.communicate(timeout=240)
    assert job.returncode == 0, output[-4000:]
    return output


def test_a_job_started_from_a_savepoint_fails_over_to_it_exactly_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    first = _pv(server, tmp_path, "first", "--checkpoint-interval", "0.5")
    try:
        with server.api() as api:
            job_id = wait_for(
                "the job to register", lambda: [j["id"] for j in api.get("/jobs").json()["jobs"]]
            )[0]

            def completed() -> list[dict[str, Any]]:
                history = api.get(f"/jobs/{job_id}/checkpoints").json()["history"]
                return [h for h in history if h["status"] == "COMPLETED"]

            wait_for("a completed checkpoint", completed)
            answer = api.post(
                f"/jobs/{job_id}/stop", json={"targetDirectory": str(tmp_path / "savepoints")}
            )
            assert answer.status_code == 202, answer.text
            _finished(first)
            rid = answer.json()["request-id"]
            stop = api.get(f"/jobs/{job_id}/stop/{rid}").json()
            assert stop["status"]["id"] == "COMPLETED", stop
            location = stop["operation"]["location"]
    finally:
        if first.poll() is None:
            first.kill()
    with open(location.removeprefix("file://") + "/_metadata") as fh:
        positions = {k: v for a in json.load(fh)["acks"] for k, v in a["source_positions"].items()}
    assert 0 < sum(positions.values()) < EVENTS  # stopped early
    # The second job fails 100 records after the savepoint's position in its first split,
    # long before its first checkpoint (every 30 s), so that no checkpoint of its own exists.
    fail_at = positions[min(positions)] + 100  # the first split's (split ids sort in order)
    second = _pv(
        server,
        tmp_path,
        "second",
        "--checkpoint-interval",
        "30",
        "--from-checkpoint",
        location,
        "--fail-after",
        str(fail_at),
    )
    output = _finished(second)
    assert "injected failure" in output
    assert line_counts(str(tmp_path / "out")) == expected_every_lines(EVENTS)
    with server.api() as api:
        jobs = api.get("/jobs").json()["jobs"]
        [resumed] = [j["id"] for j in jobs if j["id"] != job_id]
        final = api.get(f"/jobs/{resumed}").json()
        assert (final["state"], final["attempt"]) == ("FINISHED", 2)
        history = api.get(f"/jobs/{resumed}/checkpoints").json()
        restored = history["latest"]["restored"]
        assert restored["external_path"] == location, restored
