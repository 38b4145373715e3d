"""``GET /savepoints`` and ``GET /jobs/{id}/restores`` on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from .builders import T0, add_checkpoint, add_job, add_operation

SP4 = "file:///tmp/sp/job-1/savepoint-4"
SP7 = "file:///tmp/sp/job-2/savepoint-7"


def _data(sessions: sessionmaker[Session]) -> None:
    """job-1: checkpoint 1, savepoint 4 (restored twice, once into job-2), a failed savepoint
    5; job-2: a final savepoint 7 never restored, and a restore of checkpoint 3 of job-2."""
    with sessions() as s:
        add_job(s)
        add_job(s, "job-2")
        s.flush()
        add_checkpoint(s, 1)
        add_checkpoint(s, 4, kind="savepoint", external_path=SP4, state_size=4096)
        add_checkpoint(s, 5, kind="savepoint", status="FAILED", external_path=None)
        add_checkpoint(s, 7, "job-2", kind="savepoint", external_path=SP7, is_final=True)
        add_operation(
            s,
            "r-1",
            "restore",
            status="COMPLETED",
            checkpoint_id=4,
            location=SP4,
            attempt=2,
            created_at=T0 + 9000,
            updated_at=T0 + 9500,
        )
        add_operation(
            s,
            "r-2",
            "restore",
            "job-2",
            status="FAILED",
            checkpoint_id=4,
            location=SP4,
            created_at=T0 + 10_000,
            updated_at=T0 + 10_100,
            failure_cause="files missing",
        )
        add_operation(s, "r-3", "restore", "job-2", checkpoint_id=3, created_at=T0 + 11_000)
        add_operation(s, "s-1", "savepoint", checkpoint_id=4, location=SP4)
        s.commit()


def _ids(entries: list[dict[str, Any]], key: str) -> list[Any]:
    return [e[key] for e in entries]


def test_savepoints_list_completed_ones_with_the_restores_that_used_them(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _data(sessions)

    answer = client.get("/savepoints").json()

    assert answer["truncated"] is False
    assert [(e["job-id"], e["id"]) for e in answer["savepoints"]] == [("job-2", 7), ("job-1", 4)]
    sp7, sp4 = answer["savepoints"]
    assert sp7["is-final"] is True and sp7["restores"] == []
    assert sp4["location"] == SP4
    assert sp4["state-size"] == 4096
    assert sp4["completion-timestamp"] == T0 + 4050
    assert _ids(sp4["restores"], "request-id") == ["r-2", "r-1"]  # newest first, any job
    assert sp4["restores"][0] == {
        "request-id": "r-2",
        "job-id": "job-2",
        "status": "FAILED",
        "checkpoint-id": 4,
        "location": SP4,
        "attempt": None,
        "requested-at": T0 + 10_000,
        "updated-at": T0 + 10_100,
        "failure-cause": "files missing",
    }


def test_savepoints_of_one_job_and_a_limit(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _data(sessions)

    one_job = client.get("/savepoints", params={"job": "job-1"}).json()
    limited = client.get("/savepoints", params={"limit": 1}).json()
    unknown = client.get("/savepoints", params={"job": "nope"})

    assert [e["id"] for e in one_job["savepoints"]] == [4]
    assert [e["id"] for e in limited["savepoints"]] == [7] and limited["truncated"] is True
    assert unknown.status_code == 404
    assert "nope" in str(unknown.json())


def test_restores_of_a_job_newest_first(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    _data(sessions)

    job2 = client.get("/jobs/job-2/restores").json()
    job1 = client.get("/jobs/job-1/restores").json()

    assert _ids(job2["restores"], "request-id") == ["r-3", "r-2"]
    assert job2["restores"][0]["status"] == "IN_PROGRESS"
    assert _ids(job1["restores"], "request-id") == ["r-1"]
    assert job1["restores"][0]["attempt"] == 2
    assert client.get("/jobs/nope/restores").status_code == 404
    assert client.get("/jobs/job-2/restores", params={"limit": 0}).status_code == 400


def test_both_reads_are_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]

    assert "Savepoints" in str(paths["/savepoints"]["get"]["responses"]["200"])
    assert "JobRestores" in str(paths["/jobs/{job_id}/restores"]["get"]["responses"]["200"])
