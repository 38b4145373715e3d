"""Checkpoint reads: statistics, one checkpoint, one operator's subtasks, request status."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from .builders import T0, add_heartbeat, add_job, add_operation
from .conftest import AppFactory


def _entry(cid: int, **changes: Any) -> dict[str, Any]:
    trigger = T0 + 1000 * cid
    entry = {
        "id": cid,
        "status": "COMPLETED",
        "is_savepoint": False,
        "checkpoint_type": "CHECKPOINT",
        "attempt": 1,
        "is_final": False,
        "trigger_timestamp": trigger,
        "latest_ack_timestamp": trigger + 40,
        "end_to_end_duration": 50.0,
        "state_size": 1000,
        "checkpointed_size": 500,
        "alignment_buffered": 0,
        "num_subtasks": 5,
        "num_acknowledged_subtasks": 5,
        "external_path": f"file:///tmp/chk/job-1/chk-{cid}",
        "failure_message": None,
        "failure_reason": None,
        "failure_timestamp": None,
        "discarded": False,
        "epoch": None,
        "spark-job-group": None,
        "committed": True,
        "commit_timestamp": trigger + 53,
    }
    return {**entry, **changes}


IN_PROGRESS_6 = _entry(
    6,
    attempt=2,
    epoch=13,
    **{"spark-job-group": "sparkpoint-job-1-name-a2-e13"},
    status="IN_PROGRESS",
    committed=False,
    commit_timestamp=None,
    latest_ack_timestamp=None,
    end_to_end_duration=None,
    state_size=0,
    checkpointed_size=0,
    num_acknowledged_subtasks=4,
    external_path=None,
)
COMPLETED_5 = _entry(
    5,
    attempt=2,
    epoch=11,
    **{"spark-job-group": "sparkpoint-job-1-name-a2-e11"},
    end_to_end_duration=30.0,
    state_size=300,
    checkpointed_size=150,
    alignment_buffered=20,
)
SAVEPOINT_4 = _entry(
    4,
    epoch=7,
    **{"spark-job-group": "sparkpoint-job-1-name-a1-e7"},
    is_savepoint=True,
    checkpoint_type="SAVEPOINT",
    end_to_end_duration=40.0,
    state_size=400,
    checkpointed_size=200,
    alignment_buffered=30,
    external_path="file:///tmp/sp/savepoint-job-1-4",
)
FAILED_3 = _entry(
    3,
    status="FAILED",
    committed=False,
    commit_timestamp=None,
    latest_ack_timestamp=None,
    end_to_end_duration=None,
    state_size=0,
    checkpointed_size=0,
    num_acknowledged_subtasks=0,
    external_path=None,
    failure_reason="CHECKPOINT_EXPIRED",
    failure_message="checkpoint 3 expired before completing",
    failure_timestamp=T0 + 3050,
    discarded=True,
)


def _summary(values: list[float], p50: float) -> dict[str, float]:
    return {
        "min": min(values),
        "max": max(values),
        "avg": sum(values) / len(values),
        "p50": p50,
        "p90": max(values),
        "p95": max(values),
        "p99": max(values),
        "p999": max(values),
    }


@pytest.mark.usefixtures("history")
def test_checkpoint_statistics_have_flinks_shape(client: TestClient) -> None:
    response = client.get("/jobs/job-1/checkpoints", params={"limit": 2})

    assert response.status_code == 200
    assert response.json() == {
        "counts": {"restored": 1, "total": 6, "in_progress": 1, "completed": 4, "failed": 1},
        "summary": {
            # Commons Math's estimate: p50 of 4 values sits halfway between the 2nd and 3rd.
            "end_to_end_duration": _summary([10, 20, 30, 40], p50=25.0),
            "state_size": _summary([100, 200, 300, 400], p50=250.0),
            "checkpointed_size": _summary([50, 100, 150, 200], p50=125.0),
            "alignment_buffered": _summary([0, 10, 20, 30], p50=15.0),
        },
        "latest": {
            "completed": COMPLETED_5,
            "savepoint": SAVEPOINT_4,
            "failed": {
                **FAILED_3,
                "failure_timestamp": T0 + 3050,
                "failure_message": "checkpoint 3 expired before completing",
            },
            "restored": {
                "id": 2,
                "restore_timestamp": T0 + 5000,
                "is_savepoint": False,
                "external_path": "file:///tmp/chk/job-1/chk-2",
                "state_restore_duration": 120.5,
                "first_record_timestamp": T0 + 5900,
                "epoch_reported": False,  # no heartbeat of the job's attempt stored here
            },
            # No restore request and no --from-checkpoint: the newest retained checkpoint.
            "failover": {
                "id": 5,
                "is_savepoint": False,
                "external_path": "file:///tmp/chk/job-1/chk-5",
                "origin": None,
                "passed_over": [],
            },
            "origin_of": [],  # no other job started from one of its checkpoints
        },
        "history": [IN_PROGRESS_6, COMPLETED_5],
    }


@pytest.mark.usefixtures("history")
def test_the_latest_restore_says_once_the_restored_attempt_has_reported_an_epoch(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    def reported() -> bool:
        restored = client.get("/jobs/job-1/checkpoints").json()["latest"]["restored"]
        return bool(restored["epoch_reported"])

    assert not reported()
    with sessions() as s:
        add_heartbeat(s, 7, 1)  # an epoch of another attempt says nothing about this one
        s.commit()
    assert not reported()
    with sessions() as s:
        add_heartbeat(s, 1, 12)  # the job's attempt (the restored one) ended an epoch
        s.commit()
    assert reported()


@pytest.mark.usefixtures("history")
def test_each_checkpoint_names_the_epoch_and_spark_job_group_that_carried_its_barrier(
    client: TestClient,
) -> None:
    def carried(entry: dict[str, Any]) -> tuple[int | None, str | None]:
        return entry["epoch"], entry["spark-job-group"]

    body = client.get("/jobs/job-1/checkpoints").json()
    assert {entry["id"]: carried(entry) for entry in body["history"]} == {
        6: (13, "sparkpoint-job-1-name-a2-e13"),
        5: (11, "sparkpoint-job-1-name-a2-e11"),
        4: (7, "sparkpoint-job-1-name-a1-e7"),
        3: (None, None),  # it expired before a source injected its barrier
        2: (4, "sparkpoint-job-1-name-a1-e4"),
        1: (2, "sparkpoint-job-1-name-a1-e2"),
    }
    # The latest entries that are not on a one-entry history page are read on their own.
    latest = client.get("/jobs/job-1/checkpoints", params={"limit": 1}).json()["latest"]
    assert carried(latest["completed"]) == (11, "sparkpoint-job-1-name-a2-e11")
    assert carried(latest["savepoint"]) == (7, "sparkpoint-job-1-name-a1-e7")
    assert carried(latest["failed"]) == (None, None)
    details = client.get("/jobs/job-1/checkpoints/details/2").json()
    assert carried(details) == (4, "sparkpoint-job-1-name-a1-e4")


@pytest.mark.usefixtures("history")
def test_history_length_defaults_to_the_servers_setting(make_client: AppFactory) -> None:
    client = make_client(default_history=3)

    history = client.get("/jobs/job-1/checkpoints").json()["history"]

    assert [entry["id"] for entry in history] == [6, 5, 4]


def test_a_job_without_checkpoints_has_empty_statistics(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s)
        s.commit()

    body = client.get("/jobs/job-1/checkpoints").json()

    empty = dict.fromkeys(("min", "max", "avg", "p50", "p90", "p95", "p99", "p999"))
    assert body == {
        "counts": {"restored": 0, "total": 0, "in_progress": 0, "completed": 0, "failed": 0},
        "summary": {
            "end_to_end_duration": empty,
            "state_size": empty,
            "checkpointed_size": empty,
            "alignment_buffered": empty,
        },
        "latest": {
            "completed": None,
            "savepoint": None,
            "failed": None,
            "restored": None,
            "failover": {  # the beginning
                "id": None,
                "is_savepoint": False,
                "external_path": None,
                "origin": None,
                "passed_over": [],
            },
            "origin_of": [],
        },
        "history": [],
    }


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/jobs/nope/checkpoints", "job nope not found"),
        ("/jobs/nope/checkpoints/details/1", "job nope not found"),
        ("/jobs/job-1/checkpoints/details/99", "checkpoint 99 of job job-1 not found"),
        (
            "/jobs/job-1/checkpoints/details/99/subtasks/count",
            "checkpoint 99 of job job-1 not found",
        ),
        (
            "/jobs/job-1/checkpoints/details/6/subtasks/nope",
            "operator nope not found in job job-1 (checkpoint 6); its operators: source, count",
        ),
        (
            "/jobs/job-1/checkpoints/r-restore-ok",
            "checkpoint request r-restore-ok of job job-1 not found",
        ),
        (
            "/jobs/job-1/savepoints/r-restore-ok",
            "savepoint request r-restore-ok of job job-1 not found",
        ),
        ("/jobs/job-2/restore/r-restore-ok", "restore request r-restore-ok of job job-2 not found"),
    ],
)
@pytest.mark.usefixtures("history")
def test_unknown_things_are_404_naming_them(client: TestClient, path: str, message: str) -> None:
    response = client.get(path)

    assert response.status_code == 404
    assert response.json() == {"errors": [message]}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit: Input should be greater than or equal to 1"),
        ("limit=10001", "limit: Input should be less than or equal to 10000"),
        (
            "limit=ten",
            "limit: Input should be a valid integer, unable to parse string as an integer",
        ),
    ],
)
def test_a_bad_limit_is_400_naming_it(client: TestClient, query: str, message: str) -> None:
    response = client.get(f"/jobs/job-1/checkpoints?{query}")

    assert response.status_code == 400
    assert response.json() == {"errors": [message]}


@pytest.mark.usefixtures("history")
def test_request_status_has_flinks_asynchronous_operation_shape(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_operation(s, "r-chk", "checkpoint")
        add_operation(
            s, "r-sp", "savepoint", status="COMPLETED", checkpoint_id=4, location="file:///sp/4"
        )
        add_operation(s, "r-stop", "stop", status="FAILED", failure_cause="declined: too big")
        s.commit()

    assert client.get("/jobs/job-1/checkpoints/r-chk").json() == {
        "status": {"id": "IN_PROGRESS"},
        "operation": None,
        "failed": False,
    }
    assert client.get("/jobs/job-1/savepoints/r-sp").json() == {
        "status": {"id": "COMPLETED"},
        "operation": {"location": "file:///sp/4", "checkpointId": 4},
        "failed": False,
    }
    assert client.get("/jobs/job-1/stop/r-stop").json() == {
        "status": {"id": "COMPLETED"},
        "operation": {
            "failure-cause": {"class": "CheckpointFailure", "stack-trace": "declined: too big"}
        },
        "failed": True,
    }
    assert client.get("/jobs/job-1/restore/r-restore-ok").json() == {
        "status": {"id": "COMPLETED"},
        "operation": {"location": None, "checkpointId": 2},
        "failed": False,
    }
    assert client.get("/jobs/job-1/restore/r-restore-bad").json()["operation"] == {
        "failure-cause": {"class": "RestoreFailure", "stack-trace": "gone"}
    }
