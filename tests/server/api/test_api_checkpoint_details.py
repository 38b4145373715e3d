"""``GET /jobs/{id}/checkpoints/details/{n}[/subtasks/{operator}]``: per operator, per subtask."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from .builders import T0, add_subtask
from .test_api_checkpoints import IN_PROGRESS_6

SHARED_5 = "file:///tmp/chk/job-1/shared/count-0-native-c5-000007.sst"  # reused
SHARED_6 = "file:///tmp/chk/job-1/shared/count-0-native-c6-000009.sst"  # uploaded by 6


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
        {
            "path": "file:///tmp/chk/job-1/chk-6/count-0-native/_manifest.json",
            "size": 300,
            "checksum": "sha256:ef",
            "key_group_start": 0,
            "key_group_end": 42,
            "format": "rocksdb-native-v1",
            "shared": [
                {"path": SHARED_5, "size": 1000, "checksum": "sha256:01"},
                {"path": SHARED_6, "size": 24, "checksum": "sha256:02"},
            ],
        },
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
                "format": None,
                "shared_files": 0,
                "shared_size": 0,
                "shared": [],
            },
            {
                "path": None,
                "size": 6,
                "checksum": "sha256:cd",
                "key_group_start": None,
                "key_group_end": None,
                "inline": True,
                "format": None,
                "shared_files": 0,
                "shared_size": 0,
                "shared": [],
            },
            {
                "path": "file:///tmp/chk/job-1/chk-6/count-0-native/_manifest.json",
                "size": 300,
                "checksum": "sha256:ef",
                "key_group_start": 0,
                "key_group_end": 42,
                "inline": False,
                "format": "rocksdb-native-v1",
                "shared_files": 2,
                "shared_size": 1024,
                "shared": [{"path": SHARED_5, "size": 1000}, {"path": SHARED_6, "size": 24}],
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


@pytest.mark.usefixtures("acknowledgements")
def test_subtask_details_match_their_openapi_schema_with_native_handles(
    client: TestClient,
) -> None:
    doc = client.get("/openapi.json").json()
    path = "/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{operator_id}"
    schema = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
    handle = doc["components"]["schemas"]["StateHandleEntry"]
    assert {"format", "shared_files", "shared_size", "shared"} <= set(handle["required"])

    body = client.get("/jobs/job-1/checkpoints/details/6/subtasks/count").json()

    assert body["subtasks"][0]["handles"][2]["shared_files"] == 2
    validator = jsonschema_rs.validator_for({**schema["schema"], "components": doc["components"]})
    assert validator.is_valid(body)
    body["subtasks"][0]["handles"][2]["shared"][0]["size"] = "1000"
    assert not validator.is_valid(body)
