"""The whole product: ``sparkpoint server`` + the real Redis + the PV job on local Spark.

Checkpoints complete and show up in the REST API with per-subtask details and the Spark job
group of the epoch that carried each barrier, in the Spark application that the driver
reported; a savepoint completes at a location that exists; a restore to an earlier checkpoint
completes and the job continues to the end; the committed output is exactly what that restore
implies: every line of a failure-free run once, plus, per app, the counts between the restored
checkpoint and the last checkpoint committed before the restore a second time (sinks cannot
un-commit). The job runs in another directory than the server, with a relative checkpoint
directory: its checkpoints are whole in the job's directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.testing import line_counts

from ..support.waiting import wait_for
from .control_plane import REDIS_URL, ROOT, ServerProcess, completed_checkpoints, first_job

pytestmark = pytest.mark.spark

EVENTS, APPS, RATE = 24_000, 5, 1_500  # about 16 s of input


def _counts_at(positions: dict[str, int]) -> Counter[str]:
    """Events per app that the source delivered before these split positions."""
    src = GeneratorSource(events=EVENTS, apps=APPS, rate=0)
    out: Counter[str] = Counter()
    for i, split in enumerate(src.split_ids()):
        ids = np.asarray(src.read(i, 0, positions[split]).column("app_id"))
        out.update(Counter(ids.tolist()))
    return out


def _positions(external_path: str) -> dict[str, int]:
    with open(external_path.removeprefix("file://") + "/_metadata") as fh:
        meta = json.load(fh)
    out: dict[str, int] = {}
    for ack in meta["acks"]:
        out.update(ack["source_positions"])
    return out


def _line(app: str, pv: int) -> str:
    return f'{{"app_id": "{app}", "pv": {pv}}}'


def test_pv_job_checkpoints_savepoint_and_restore_through_the_control_plane(
    server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    job = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("sparkpoint")),
            "run",
            str(ROOT / "jobs/examples/pv_count.py"),
            "--redis-url",
            REDIS_URL,
            "--stream-prefix",
            server.prefix,
            # Relative, in another directory than the server's: the driver's, made absolute.
            "--checkpoint-dir",
            "chk",
            "--checkpoint-interval",
            "0.5",
            "--retained",
            "20",
            "--epoch-target-ms",
            "250",
            "--local-dir",
            str(tmp_path / "local"),
            "--events",
            str(EVENTS),
            "--apps",
            str(APPS),
            "--rate",
            str(RATE),
            "--output",
            str(out),
        ],
        cwd=tmp_path,
        env=server.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with server.api() as api:
            job_id = first_job(api)

            def completed() -> list[dict[str, Any]]:
                return completed_checkpoints(api, job_id)

            # 1. Checkpoints complete, with per-subtask details.
            first = wait_for(
                "two completed checkpoints", lambda: len(completed()) >= 2 and completed()
            )
            restore_to = min(h["id"] for h in first)
            # ... each naming the epoch that carried its barrier and that epoch's Spark job
            # group, in the Spark application that the running driver reported.
            running = api.get(f"/jobs/{job_id}").json()
            spark = running["spark"]
            assert spark["application-id"]
            assert spark["ui-url"] and spark["ui-url"].startswith("http://")
            for h in first:
                assert isinstance(h["epoch"], int)
                assert h["spark-job-group"] == (
                    f"sparkpoint-{running['name']}-a{h['attempt']}-e{h['epoch']}"
                )
            details = api.get(f"/jobs/{job_id}/checkpoints/details/{restore_to}").json()
            assert details["status"] == "COMPLETED"
            assert details["num_acknowledged_subtasks"] == details["num_subtasks"] == 4
            earliest = next(h for h in first if h["id"] == restore_to)
            assert (details["epoch"], details["spark-job-group"]) == (
                earliest["epoch"],
                earliest["spark-job-group"],
            )
            for operator_id in details["tasks"]:
                sub = api.get(
                    f"/jobs/{job_id}/checkpoints/details/{restore_to}/subtasks/{operator_id}"
                ).json()
                assert [s["index"] for s in sub["subtasks"]] == [0, 1]
                assert all(s["status"] == "completed" for s in sub["subtasks"])
                assert all(s["checkpoint"]["sync"] is not None for s in sub["subtasks"])
            # 2. A savepoint completes at a location that exists.
            target = tmp_path / "savepoints"
            rid = api.post(
                f"/jobs/{job_id}/savepoints", json={"target-directory": str(target)}
            ).json()["request-id"]
            sp = wait_for(
                "the savepoint",
                lambda: (
                    (s := api.get(f"/jobs/{job_id}/savepoints/{rid}").json())["status"]["id"]
                    == "COMPLETED"
                    and s
                ),
            )
            # Every checkpoint whole where the driver was: _metadata beside the state.
            assert all(h["external_path"].startswith(f"file://{tmp_path}/chk/") for h in first)
            metadata = Path(earliest["external_path"].removeprefix("file://")) / "_metadata"
            assert metadata.is_file()
            assert not (ROOT / "chk").exists()  # nothing where the server runs
            location = sp["operation"]["location"]
            assert location.startswith(f"file://{target}/")
            assert (Path(location.removeprefix("file://")) / "_metadata").is_file()
            # 3. Restore to the earliest completed checkpoint.
            answer = api.post(f"/jobs/{job_id}/restore", json={"checkpoint_id": restore_to})
            assert answer.status_code == 202, answer.text
            assert answer.json()["warning"]  # later checkpoints were committed
            rid = answer.json()["request-id"]
            wait_for(
                "the restore",
                lambda: (
                    api.get(f"/jobs/{job_id}/restore/{rid}").json()["status"]["id"] == "COMPLETED"
                ),
            )
            history = api.get(f"/jobs/{job_id}/checkpoints?limit=1000").json()["history"]
            before = [h for h in history if h["attempt"] == 1 and h["status"] == "COMPLETED"]
            last_committed = max(before, key=lambda h: h["id"])
            restored = next(h for h in history if h["id"] == restore_to)
            restored_at = _counts_at(_positions(restored["external_path"]))
            committed_at = _counts_at(_positions(last_committed["external_path"]))
            # 4. The job continues: new checkpoints of attempt 2, then FINISHED.
            assert job.wait(timeout=240) == 0, job.stdout.read() if job.stdout else ""
            final = api.get(f"/jobs/{job_id}").json()
            assert (final["state"], final["attempt"]) == ("FINISHED", 2)
            assert final["spark"] == spark  # the same driver: the same Spark application
            history = api.get(f"/jobs/{job_id}/checkpoints?limit=1000").json()["history"]
            assert any(h["attempt"] == 2 and h["status"] == "COMPLETED" for h in history)
    finally:
        if job.poll() is None:
            job.kill()
    # 5. Exactly the output the restore implies.
    src = GeneratorSource(events=EVENTS, apps=APPS)
    totals = _counts_at({s: src.total(i) or 0 for i, s in enumerate(src.split_ids())})
    expected = Counter(_line(app, k) for app, n in totals.items() for k in range(1, n + 1))
    expected.update(
        _line(app, k) for app in totals for k in range(restored_at[app] + 1, committed_at[app] + 1)
    )
    assert sum(committed_at.values()) > sum(restored_at.values())  # something was replayed
    assert line_counts(str(out)) == expected
