"""Flink's jobs overview (``GET /jobs/overview``): every job as Flink's ``JobDetails``,
newest first, with its subtasks counted per execution state; and the path is not a job id.

Most jobs are rows as the control plane writes them (``builders.py``); one is registered,
run and canceled through a real control plane (the real Redis) and read through the API.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_harness import Harness
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint import protocol as p

from .builders import T0, add_job, add_status
from .conftest import NOW, AppFactory

#: Flink's execution states, the keys of a job's ``tasks`` in the overview.
EXECUTION_STATES = (
    "created",
    "scheduled",
    "deploying",
    "running",
    "finished",
    "canceling",
    "canceled",
    "failed",
    "reconciling",
    "initializing",
)


def tasks(total: int, **counts: int) -> dict[str, int]:
    """Flink's ``tasks`` of a job: 0 in every execution state but ``counts``; ``total``."""
    return {**dict.fromkeys(EXECUTION_STATES, 0), **counts, "total": total}


@pytest.fixture
def three_jobs(sessions: sessionmaker[Session]) -> None:
    """``done`` ran from T0 to T0 + 30 s, ``stopped`` was canceled at T0 + 40 s, ``live`` (one
    vertex of parallelism 4) runs since T0 + 20 s; each with its status transitions."""
    with sessions() as s:
        add_job(s, "done", status="FINISHED", end_time=T0 + 30_000)
        add_job(s, "stopped", status="CANCELED", start_time=T0 + 10_000, end_time=T0 + 40_000)
        one_vertex = {"vertices": [{"id": "source", "parallelism": 4}], "edges": []}
        add_job(s, "live", start_time=T0 + 20_000, graph=one_vertex)
        s.flush()
        transitions = {
            "done": [("CREATED", 0), ("RUNNING", 1_000), ("FINISHED", 30_000)],
            "stopped": [
                ("CREATED", 10_000),
                ("RUNNING", 11_000),
                ("CANCELLING", 39_000),
                ("CANCELED", 40_000),
            ],
            "live": [("CREATED", 20_000), ("RUNNING", 21_000)],
        }
        for job_id, statuses in transitions.items():
            for status, after in statuses:
                add_status(s, status, T0 + after, job_id=job_id)
        s.commit()


@pytest.mark.usefixtures("three_jobs")
def test_the_overview_shows_every_job_newest_first_as_flinks_job_details(
    client: TestClient,
) -> None:
    response = client.get("/jobs/overview")

    assert response.status_code == 200
    assert response.json() == {
        "jobs": [
            {
                "jid": "live",
                "name": "live-name",
                "state": "RUNNING",
                "start-time": T0 + 20_000,
                "end-time": -1,  # still running
                "duration": NOW - T0 - 20_000,  # until now
                "last-modification": T0 + 21_000,
                "tasks": tasks(4, running=4),
            },
            {
                "jid": "stopped",
                "name": "stopped-name",
                "state": "CANCELED",
                "start-time": T0 + 10_000,
                "end-time": T0 + 40_000,
                "duration": 30_000,
                "last-modification": T0 + 40_000,
                "tasks": tasks(5, canceled=5),  # GRAPH: parallelism 2 and 3
            },
            {
                "jid": "done",
                "name": "done-name",
                "state": "FINISHED",
                "start-time": T0,
                "end-time": T0 + 30_000,
                "duration": 30_000,
                "last-modification": T0 + 30_000,
                "tasks": tasks(5, finished=5),
            },
        ]
    }
    listed = [job["id"] for job in client.get("/jobs").json()["jobs"]]
    assert listed == ["live", "stopped", "done"]  # the order of GET /jobs


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("CREATED", "created"),
        ("RUNNING", "running"),
        ("FAILING", "canceling"),
        ("RESTARTING", "canceled"),
        ("FAILED", "failed"),
        ("CANCELLING", "canceling"),
        ("CANCELED", "canceled"),
        ("FINISHED", "finished"),
    ],
)
def test_the_overview_counts_every_subtask_in_the_state_its_jobs_status_implies(
    client: TestClient, sessions: sessionmaker[Session], status: str, state: str
) -> None:
    with sessions() as s:
        add_job(s, status=status)
        s.commit()

    [job] = client.get("/jobs/overview").json()["jobs"]

    assert job["tasks"] == tasks(5, **{state: 5})
    assert job["last-modification"] == T0  # no transition recorded: its start


def test_the_overview_is_not_taken_for_a_job_id(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    empty = client.get("/jobs/overview")
    assert (empty.status_code, empty.json()) == (200, {"jobs": []})

    with sessions() as s:
        # Refused as a job id at registration; a row stored before that still lists here.
        add_job(s, "overview")
        s.commit()

    assert [job["jid"] for job in client.get("/jobs/overview").json()["jobs"]] == ["overview"]
    assert client.get("/jobs/overview/checkpoints/config").status_code == 200
    cancel = client.patch("/jobs/overview")  # not a cancel of the job `overview`
    assert (cancel.status_code, cancel.headers["allow"]) == (405, "GET, HEAD")
    assert cancel.json() == {"errors": ["Method not allowed: PATCH /jobs/overview"]}


def test_a_job_canceled_through_the_control_plane_shows_each_step_in_the_overview(
    harness: Harness, make_client: AppFactory
) -> None:
    harness.start()  # registered and RUNNING at T0 (the harness's clock)
    client = make_client(control_plane=harness.plane)

    def overview() -> dict[str, Any]:
        [job] = client.get("/jobs/overview").json()["jobs"]
        return {k: job[k] for k in ("state", "end-time", "last-modification", "tasks")}

    harness.clock.advance(5_000)
    assert client.patch(f"/jobs/{harness.job_id}").status_code == 202
    cancelling = overview()
    harness.clock.advance(1_000)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))  # the driver stopped

    assert cancelling == {
        "state": "CANCELLING",
        "end-time": -1,
        "last-modification": T0 + 5_000,
        "tasks": tasks(4, canceling=4),  # the harness's two vertices of parallelism 2
    }
    assert overview() == {
        "state": "CANCELED",
        "end-time": T0 + 6_000,
        "last-modification": T0 + 6_000,
        "tasks": tasks(4, canceled=4),
    }
    assert client.get("/jobs/overview").json()["jobs"][0]["duration"] == 6_000
