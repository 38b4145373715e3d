"""Checkpoint reads: statistics, one checkpoint, one operator's subtasks, request status."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from .builders import T0, add_checkpoint, add_job, add_operation, add_subtask
from .conftest import AppFactory


@pytest.fixture
def history(sessions: sessionmaker[Session]) -> None:
    """Job ``job-1``: checkpoints 1, 2, 5 completed, savepoint 4, 3 failed, 6 in progress.

    Attempt 2 restored checkpoint 2 and carried 5 and 6 (epochs 11 and 13); checkpoint 3
    expired before any source injected its barrier (no epoch).
    """
    with sessions() as s:
        add_job(
            s,
            restarts=1,
            restored_checkpoint_id=2,
            restored_at=T0 + 5000,
            restored_path="file:///tmp/chk/job-1/chk-2",
            restored_is_savepoint=False,
        )
        s.flush()
        sizes = {1: (10.0, 100, 50, 0), 2: (20.0, 200, 100, 10), 5: (30.0, 300, 150, 20)}
        carried = {1: (1, 2), 2: (1, 4), 5: (2, 11)}  # checkpoint: (attempt, epoch)
        for cid, (e2e, state, checkpointed, buffered) in sizes.items():
            attempt, epoch = carried[cid]
            add_checkpoint(
                s,
                cid,
                attempt=attempt,
                epoch=epoch,
                end_to_end_duration=e2e,
                state_size=state,
                checkpointed_size=checkpointed,
                alignment_buffered=buffered,
            )
        add_checkpoint(
            s,
            3,
            status="FAILED",
            failure_reason="CHECKPOINT_EXPIRED",
            failure_message="checkpoint 3 expired before completing",
            discarded=True,
        )
        add_checkpoint(
            s,
            4,
            kind="savepoint",
            epoch=7,
            end_to_end_duration=40.0,
            state_size=400,
            checkpointed_size=200,
            alignment_buffered=30,
            external_path="file:///tmp/sp/savepoint-job-1-4",
        )
        add_checkpoint(s, 6, status="IN_PROGRESS", num_acknowledged_subtasks=4, attempt=2, epoch=13)
        add_operation(s, "r-restore-ok", "restore", status="COMPLETED", checkpoint_id=2)
        add_operation(s, "r-restore-bad", "restore", status="FAILED", failure_cause="gone")
        s.commit()


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
        "discarded": False,
        "epoch": None,
        "spark-job-group": None,
    }
    return {**entry, **changes}


IN_PROGRESS_6 = _entry(
    6,
    attempt=2,
    epoch=13,
    **{"spark-job-group": "sparkpoint-job-1-name-a2-e13"},
    status="IN_PROGRESS",
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
    latest_ack_timestamp=None,
    end_to_end_duration=None,
    state_size=0,
    checkpointed_size=0,
    num_acknowledged_subtasks=0,
    external_path=None,
    failure_reason="CHECKPOINT_EXPIRED",
    failure_message="checkpoint 3 expired before completing",
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
            },
        },
        "history": [IN_PROGRESS_6, COMPLETED_5],
    }


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
        "latest": {"completed": None, "savepoint": None, "failed": None, "restored": None},
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


@pytest.fixture
def acknowledgements(history: None, sessions: sessionmaker[Session]) -> None:
    """Checkpoint 6: both ``source`` subtasks and ``count`` 0 and 1 acknowledged, 2 not."""
    handles = [
        {
            "path": "file:///tmp/chk/job-1/chk-6/count-0",
            "size": 10,
            "checksum": "sha256:ab",
            "key_group_start": 0,
            "key_group_end": 42,
        },
        {"inline": "c2VjcmV0", "size": 6, "checksum": "sha256:cd"},
    ]
    with sessions() as s:
        add_subtask(s, 6, "source", 0, end_to_end_duration=40.0)
        add_subtask(s, 6, "source", 1, end_to_end_duration=45.0, alignment_buffered=5)
        add_subtask(s, 6, "count", 0, ack={"handles": handles}, state_size=300)
        add_subtask(
            s,
            6,
            "count",
            1,
            ack_timestamp=T0 + 60,
            clock_flagged=True,
            start_delay=4.0,
            sync_duration=1.0,
            async_duration=8.0,
            alignment_duration=3.0,
            alignment_buffered=7,
        )
        s.commit()


def _task(operator_id: str, name: str, **changes: Any) -> dict[str, Any]:
    task = {
        "id": operator_id,
        "name": name,
        "status": "COMPLETED",
        "latest_ack_timestamp": T0 + 40,
        "state_size": 200,
        "checkpointed_size": 100,
        "end_to_end_duration": 40.0,
        "alignment_buffered": 0,
        "num_subtasks": 2,
        "num_acknowledged_subtasks": 2,
    }
    return {**task, **changes}


SOURCE_TASK = _task("source", "source -> parse", end_to_end_duration=45.0, alignment_buffered=5)
COUNT_TASK = _task(
    "count",
    "count -> sink",
    status="IN_PROGRESS",
    latest_ack_timestamp=T0 + 60,
    state_size=400,
    alignment_buffered=7,
    num_subtasks=3,
)


@pytest.mark.usefixtures("acknowledgements")
def test_checkpoint_details_add_up_each_operator(client: TestClient) -> None:
    response = client.get("/jobs/job-1/checkpoints/details/6")

    assert response.status_code == 200
    assert response.json() == {
        **IN_PROGRESS_6,
        "tasks": {
            "source": SOURCE_TASK,
            "count": COUNT_TASK,  # 2 of 3 acknowledged: the checkpoint's status
        },
    }


@pytest.mark.usefixtures("acknowledgements")
def test_subtask_details_list_every_subtask_and_hide_inline_bytes(client: TestClient) -> None:
    response = client.get("/jobs/job-1/checkpoints/details/6/subtasks/count")

    assert response.status_code == 200
    body = response.json()
    assert "c2VjcmV0" not in response.text
    subtasks = body.pop("subtasks")
    assert body == {
        **COUNT_TASK,
        "summary": {
            "state_size": {"min": 100, "max": 300, "avg": 200.0},
            "checkpointed_size": {"min": 50, "max": 50, "avg": 50.0},
            "end_to_end_duration": {"min": 40.0, "max": 40.0, "avg": 40.0},
            "checkpoint_duration": {
                "sync": {"min": 1.0, "max": 3.0, "avg": 2.0},
                "async": {"min": 4.0, "max": 8.0, "avg": 6.0},
            },
            "alignment": {
                "buffered": {"min": 0, "max": 7, "avg": 3.5},
                "duration": {"min": 1.0, "max": 3.0, "avg": 2.0},
            },
            "start_delay": {"min": 2.0, "max": 4.0, "avg": 3.0},
        },
    }
    completed = {
        "index": 0,
        "status": "completed",
        "ack_timestamp": T0 + 40,
        "end_to_end_duration": 40.0,
        "state_size": 300,
        "checkpointed_size": 50,
        "checkpoint": {"sync": 3.0, "async": 4.0},
        "alignment": {"buffered": 0, "processed": 0, "persisted": 0, "duration": 1.0},
        "start_delay": 2.0,
        "unaligned_checkpoint": False,
        "aborted": False,
        "barrier_timestamp": T0 + 10,
        "clock_flagged": False,
        "declined_reason": None,
        "handles": [
            {
                "path": "file:///tmp/chk/job-1/chk-6/count-0",
                "size": 10,
                "checksum": "sha256:ab",
                "key_group_start": 0,
                "key_group_end": 42,
                "inline": False,
            },
            {
                "path": None,
                "size": 6,
                "checksum": "sha256:cd",
                "key_group_start": None,
                "key_group_end": None,
                "inline": True,
            },
        ],
    }
    assert subtasks[0] == completed
    assert subtasks[1] == {
        **completed,
        "index": 1,
        "ack_timestamp": T0 + 60,
        "state_size": 100,
        "checkpoint": {"sync": 1.0, "async": 8.0},
        "alignment": {"buffered": 7, "processed": 0, "persisted": 0, "duration": 3.0},
        "start_delay": 4.0,
        "clock_flagged": True,
        "handles": [],
    }
    assert subtasks[2] == {
        "index": 2,
        "status": "pending_or_failed",
        "ack_timestamp": None,
        "end_to_end_duration": None,
        "state_size": None,
        "checkpointed_size": None,
        "checkpoint": {"sync": None, "async": None},
        "alignment": {"buffered": None, "processed": 0, "persisted": 0, "duration": None},
        "start_delay": None,
        "unaligned_checkpoint": False,
        "aborted": False,
        "barrier_timestamp": None,
        "clock_flagged": False,
        "declined_reason": None,
        "handles": [],
    }


@pytest.mark.usefixtures("history")
def test_subtasks_of_a_failed_checkpoint_are_aborted_with_their_decline(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_subtask(s, 3, "source", 1, ack_timestamp=None, declined_reason="state too large")
        s.commit()

    body = client.get("/jobs/job-1/checkpoints/details/3/subtasks/source").json()

    assert body["status"] == "FAILED"
    assert body["num_acknowledged_subtasks"] == 0
    assert body["summary"]["state_size"] == {"min": None, "max": None, "avg": None}
    assert [
        (s["index"], s["status"], s["aborted"], s["declined_reason"]) for s in body["subtasks"]
    ] == [
        (0, "pending_or_failed", True, None),
        (1, "pending_or_failed", True, "state too large"),
    ]


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
