"""A failover restores the checkpoint the job's line started from when no checkpoint completed
since, through the real control plane, its driver and Spark:

- a job started from a savepoint fails before its first checkpoint: it restores the savepoint
  again, and its committed output with the stopped job's is a failure-free run's (restarting
  from the beginning would count the savepoint's events twice);
- a job restored to an older checkpoint loses its driver before its next checkpoint: the new
  driver restores that checkpoint again, not the newer one the restore went back past (which
  would silently undo the restore);
- a job started from a running job's checkpoint loses its driver after the owner's retention
  dropped that checkpoint: the owner kept it for the other job, which restores it again.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.testing import line_counts

from ..runtime.pv_harness import APPS, EVENTS, expected_every_lines
from ..support.waiting import wait_for
from .control_plane import REDIS_URL, ROOT, ServerProcess, completed_checkpoints, first_job

pytestmark = [pytest.mark.spark, pytest.mark.long]  # make test-long, not CI


def _pv(
    server: ServerProcess | None,
    tmp_path: Path,
    name: str,
    *extra: str,
    events: int = EVENTS,
    output: str = "out",
    redis_url: str = REDIS_URL,
) -> subprocess.Popen[str]:
    """The PV job (every record's count) as a user starts it, connected to ``server`` (through
    ``redis_url``), or standalone when ``server`` is None; ``name`` names its --local-dir."""
    where = (
        ["--redis-url", redis_url, "--stream-prefix", server.prefix]
        if server is not None
        else ["--standalone"]
    )
    return subprocess.Popen(
        [
            str(Path(sys.executable).with_name("sparkpoint")),
            "run",
            "jobs/examples/pv_count.py",
            *where,
            "--checkpoint-dir",
            f"file://{tmp_path / 'chk'}",
            "--local-dir",
            str(tmp_path / "local" / name),
            "--epoch-target-ms",
            "250",
            *extra,
            "--",
            "--events",
            str(events),
            "--apps",
            str(APPS),
            "--rate",
            "1500",
            "--output",
            str(tmp_path / output),
        ],
        cwd=ROOT,
        env=server.env() if server is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finished(job: subprocess.Popen[str]) -> str:
    output, _ = job.communicate(timeout=240)
    assert job.returncode == 0, output[-4000:]
    return output


def _stopped(api: Any, job_id: str, job: subprocess.Popen[str], tmp_path: Path) -> str:
    """Stop the running job ``job_id`` with a savepoint, as a user does through the API; its
    ``sparkpoint run`` must end with exit 0. Returns the savepoint's location."""
    answer = api.post(
        f"/jobs/{job_id}/stop", json={"targetDirectory": str(tmp_path / "savepoints")}
    )
    assert answer.status_code == 202, answer.text
    _finished(job)
    stop = api.get(f"/jobs/{job_id}/stop/{answer.json()['request-id']}").json()
    assert stop["status"]["id"] == "COMPLETED", stop
    return str(stop["operation"]["location"])


def _lines_between(before: Counter[str], until: Counter[str]) -> Counter[str]:
    """With ``--emit every``: the lines of each app's counts after ``before`` up to ``until``."""
    return Counter(
        f'{{"app_id": "{app}", "pv": {k}}}'
        for app, n in until.items()
        for k in range(before[app] + 1, n + 1)
    )


@pytest.mark.parametrize("rerun", [False, True], ids=["a-new-job", "the-same-job-run-again"])
def test_a_job_started_from_a_savepoint_fails_over_to_it_exactly_once(
    server: ServerProcess, tmp_path: Path, rerun: bool
) -> None:
    """``rerun``: the stopped job itself is run again from its savepoint (``--job-id``, the
    control plane's RERUN) instead of a new job; ``--fail-after`` fails attempt 1 only, so the
    run again (attempt 2) does not fail: its output with the stopped run's is still exact."""
    first = _pv(server, tmp_path, "first", "--checkpoint-interval", "0.5")
    try:
        with server.api() as api:
            job_id = first_job(api)
            wait_for("a completed checkpoint", lambda: completed_checkpoints(api, job_id))
            location = _stopped(api, job_id, first, tmp_path)
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
        *(["--job-id", job_id] if rerun else []),
        "--checkpoint-interval",
        "30",
        "--from-checkpoint",
        location,
        *([] if rerun else ["--fail-after", str(fail_at)]),
    )
    output = _finished(second)
    assert ("injected failure" in output) is not rerun
    assert line_counts(str(tmp_path / "out")) == expected_every_lines(EVENTS)
    with server.api() as api:
        jobs = [j["id"] for j in api.get("/jobs").json()["jobs"]]
        [resumed] = [job_id] if rerun else [j for j in jobs if j != job_id]
        assert len(jobs) == (1 if rerun else 2)
        final = api.get(f"/jobs/{resumed}").json()
        assert (final["state"], final["attempt"]) == ("FINISHED", 2)
        history = api.get(f"/jobs/{resumed}/checkpoints").json()
        restored = history["latest"]["restored"]
        assert restored["external_path"] == location, restored


def _counts_at(location: str, events: int) -> Counter[str]:
    """Events per app that the sources had delivered at the checkpoint at ``location``."""
    with open(location.removeprefix("file://") + "/_metadata") as fh:
        positions = {k: v for a in json.load(fh)["acks"] for k, v in a["source_positions"].items()}
    src = GeneratorSource(events=events, apps=APPS, rate=0)
    out: Counter[str] = Counter()
    for i, split in enumerate(src.split_ids()):
        out.update(np.asarray(src.read(i, 0, positions[split]).column("app_id")).tolist())
    return out


def test_a_driver_lost_after_a_restore_to_an_older_checkpoint_restores_it_again(
    server: ServerProcess, tmp_path: Path
) -> None:
    events = 2 * EVENTS  # 16 s of input: it is far from its end when its driver dies
    job = _pv(
        server,
        tmp_path,
        "rewound",
        "--checkpoint-interval",
        "0.5",
        "--retained",
        "20",
        events=events,
    )
    try:
        with server.api() as api:
            job_id = first_job(api)

            def completed() -> list[dict[str, Any]]:
                return completed_checkpoints(api, job_id)

            wait_for("three completed checkpoints", lambda: len(completed()) >= 3, 120)
            # No checkpoint from now on until the driver is gone: the restored one stays the
            # newest of the job's line.
            answer = api.patch(f"/jobs/{job_id}/checkpoints/config", json={"interval": 600_000})
            assert answer.status_code == 200, answer.text
            before = completed()
            older, newest = before[-1], max(before, key=lambda h: h["id"])
            assert older["id"] < newest["id"]
            answer = api.post(f"/jobs/{job_id}/restore", json={"checkpoint_id": older["id"]})
            assert answer.status_code == 202, answer.text
            rid = answer.json()["request-id"]
            wait_for(
                "the restore",
                lambda: (
                    api.get(f"/jobs/{job_id}/restore/{rid}").json()["status"]["id"] == "COMPLETED"
                ),
            )
            # Read now: retention deletes both once newer checkpoints complete.
            restored_at = _counts_at(older["external_path"], events)
            committed_at = _counts_at(newest["external_path"], events)

            def restored() -> dict[str, Any]:
                latest = api.get(f"/jobs/{job_id}/checkpoints").json()["latest"]
                return dict(latest["restored"])

            requested = restored()
            assert requested["id"] == older["id"]
            # The driver dies (kill -9); `sparkpoint run` starts another, which registers.
            [driver] = psutil.Process(job.pid).children()
            driver.send_signal(signal.SIGKILL)
            again = wait_for(
                "the next driver's restore",
                lambda: (
                    (r := restored())["restore_timestamp"] > requested["restore_timestamp"] and r
                ),
                120,
            )
            assert api.get(f"/jobs/{job_id}").json()["attempt"] == 3
            assert again["id"] == older["id"], again
            assert not [h for h in completed() if h["id"] > newest["id"]]
            answer = api.patch(f"/jobs/{job_id}/checkpoints/config", json={"interval": 500})
            assert answer.status_code == 200, answer.text
            output = _finished(job)
            final = api.get(f"/jobs/{job_id}").json()
            assert (final["state"], final["attempt"]) == ("FINISHED", 3)
    finally:
        if job.poll() is None:
            job.kill()
    # Both drivers said so when the settings changed: the first at the PATCH, the second at
    # its registration (its command line said 0.5 s); then the PATCH back.
    changed = "the control plane's checkpoint settings: interval"
    assert output.count(f"{changed} 600 s") == 2, output
    assert f"{changed} 0.5 s" in output
    # Every line of a failure-free run once, and, per app, the counts between the restored
    # checkpoint and the newest one committed before the restore again (sinks cannot
    # un-commit); the lines of the lost driver's attempt were never committed.
    expected = expected_every_lines(events)
    expected.update(
        f'{{"app_id": "{app}", "pv": {k}}}'
        for app in committed_at
        for k in range(restored_at[app] + 1, committed_at[app] + 1)
    )
    assert sum(committed_at.values()) > sum(restored_at.values())
    assert line_counts(str(tmp_path / "out")) == expected


def test_a_checkpoint_another_job_started_from_is_kept_for_its_failover(
    server: ServerProcess, tmp_path: Path
) -> None:
    """The owner retains one checkpoint; the other job starts from it into its own output,
    the owner goes on past it, the other job's driver dies before a checkpoint of its own:
    its failover restores the owner's checkpoint by its path, which the owner kept for it.
    Both jobs are stopped with a savepoint once that was seen, so that neither depends on how
    long the other takes to start (the owner used to end first on a loaded machine)."""
    events = 100 * EVENTS  # 800 s of input: both jobs run until stopped
    owner = _pv(
        server, tmp_path, "owner", "--checkpoint-interval", "0.5", "--retained", "1", events=events
    )
    started: subprocess.Popen[str] | None = None
    try:
        with server.api() as api:
            owner_id = first_job(api)
            wait_for("two checkpoints", lambda: len(completed_checkpoints(api, owner_id)) >= 2)
            # The owner's newest checkpoint stays its newest until the other job registered:
            # nothing protects a checkpoint the control plane has not read yet.
            answer = api.patch(f"/jobs/{owner_id}/checkpoints/config", json={"interval": 600_000})
            assert answer.status_code == 200, answer.text
            wait_for(
                "the owner's checkpoints in flight to end",
                lambda: (
                    api.get(f"/jobs/{owner_id}/checkpoints").json()["counts"]["in_progress"] == 0
                ),
            )
            origin = completed_checkpoints(api, owner_id)[0]
            restored_at = _counts_at(origin["external_path"], events)
            started = _pv(
                server,
                tmp_path,
                "started",
                "--checkpoint-interval",
                "600",
                "--from-checkpoint",
                origin["external_path"],
                events=events,
                output="out-started",
            )

            def other_job() -> list[str]:
                assert started is not None and started.poll() is None, _finished(started)
                return [j["id"] for j in api.get("/jobs").json()["jobs"] if j["id"] != owner_id]

            def running(job_id: str, attempt: int) -> bool:
                job = api.get(f"/jobs/{job_id}").json()
                return (job["state"], job["attempt"]) == ("RUNNING", attempt)

            started_id = wait_for("the other job", other_job)[0]
            wait_for("the other job to run", lambda: running(started_id, 1))
            answer = api.patch(f"/jobs/{owner_id}/checkpoints/config", json={"interval": 500})
            assert answer.status_code == 200, answer.text
            wait_for(
                "two newer checkpoints of the owner",
                lambda: completed_checkpoints(api, owner_id)[0]["id"] >= origin["id"] + 2,
            )
            kept = api.get(f"/jobs/{owner_id}/checkpoints").json()["latest"]["origin_of"]
            assert [(k["id"], k["jobs"]) for k in kept] == [(origin["id"], [started_id])], kept
            requested = api.get(f"/jobs/{started_id}/checkpoints").json()["latest"]["restored"]
            [driver] = psutil.Process(started.pid).children()
            driver.send_signal(signal.SIGKILL)

            def restored_again() -> dict[str, Any] | None:
                latest = api.get(f"/jobs/{started_id}/checkpoints").json()["latest"]
                r = latest["restored"]
                return r if r["restore_timestamp"] > requested["restore_timestamp"] else None

            again = wait_for("the other job's failover", restored_again, 120)
            assert (again["id"], again["external_path"]) == (origin["id"], origin["external_path"])
            wait_for("the other job to run again", lambda: running(started_id, 2))
            started_until = _counts_at(_stopped(api, started_id, started, tmp_path), events)
            final = api.get(f"/jobs/{started_id}").json()
            assert (final["state"], final["attempt"]) == ("FINISHED", 2)
            # Once no live job relies on it, the owner's retention deletes it as it meant to.
            gone = Path(origin["external_path"].removeprefix("file://"))
            wait_for("the kept checkpoint's deletion", lambda: not gone.exists(), 60)
            owner_until = _counts_at(_stopped(api, owner_id, owner, tmp_path), events)
    finally:
        for job in (owner, started):
            if job is not None and job.poll() is None:
                job.kill()
    # The owner's output is every line up to its savepoint; the other job's is every line
    # after the checkpoint it started from up to its own savepoint (its failed attempt
    # committed nothing, and a restore commits the owner's pending transactions in the
    # owner's output).
    assert line_counts(str(tmp_path / "out")) == _lines_between(Counter(), owner_until)
    after = _lines_between(restored_at, started_until)
    assert sum(after.values()) > 0
    assert line_counts(str(tmp_path / "out-started")) == after
