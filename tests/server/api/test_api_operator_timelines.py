"""``GET /jobs/{id}/checkpoints/operators``: each operator's checkpoints over time.

Runs on SQLite and PostgreSQL (the ``sessions`` fixture); the data is the ``history`` fixture
(checkpoints 1-6 of ``job-1``, whose graph has ``source`` with 2 subtasks and ``count`` with 3)
plus subtask rows written here.
"""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from .builders import T0, add_checkpoint, add_job, add_subtask

PATH = "/jobs/job-1/checkpoints/operators"


@pytest.fixture
def subtasks(history: None, sessions: sessionmaker[Session]) -> None:
    """Checkpoint 5 (triggered at T0 + 5000): ``count`` subtask 2 is the slow one.

    Checkpoint 6 (in progress, T0 + 6000): both ``source`` subtasks acknowledged, ``count``
    only subtask 0; plus rows of an operator ``gone`` that the graph no longer has.
    """
    with sessions() as s:
        for i in range(2):
            add_subtask(s, 5, "source", i, ack_timestamp=T0 + 5020 + i, end_to_end_duration=20.0)
        add_subtask(s, 5, "count", 0, ack_timestamp=T0 + 5030, end_to_end_duration=30.0)
        add_subtask(s, 5, "count", 1, ack_timestamp=T0 + 5031, end_to_end_duration=31.0)
        add_subtask(
            s,
            5,
            "count",
            2,
            ack_timestamp=T0 + 5090,
            end_to_end_duration=90.0,
            sync_duration=12.0,
            async_duration=40.0,
            alignment_duration=25.0,
            start_delay=9.0,
            state_size=700,
            checkpointed_size=70,
        )
        for i in range(2):
            add_subtask(s, 6, "source", i, ack_timestamp=T0 + 6010, end_to_end_duration=10.0)
        add_subtask(s, 6, "count", 0, ack_timestamp=T0 + 6015, end_to_end_duration=15.0)
        add_subtask(s, 6, "gone", 0, ack_timestamp=T0 + 6005, end_to_end_duration=5.0)
        s.commit()


def by_id(entries: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {e["id"]: e for e in entries}


def test_each_operator_has_one_entry_per_checkpoint_oldest_first(
    client: TestClient, subtasks: None
) -> None:
    answer = client.get(PATH).json()

    assert [c["id"] for c in answer["checkpoints"]] == [1, 2, 3, 4, 5, 6]
    assert [o["id"] for o in answer["operators"]] == ["source", "count", "gone"]
    for operator in answer["operators"]:
        assert [c["id"] for c in operator["checkpoints"]] == [1, 2, 3, 4, 5, 6]
    assert answer["checkpoints"][3] == {
        "id": 4,
        "status": "COMPLETED",
        "is_savepoint": True,
        "checkpoint_type": "SAVEPOINT",
        "trigger_timestamp": T0 + 4000,
        "end_to_end_duration": 40.0,
        "num_subtasks": 5,
        "num_acknowledged_subtasks": 5,
    }


def test_an_operator_entry_has_the_slowest_subtask_parts_and_its_end_to_end(
    client: TestClient, subtasks: None
) -> None:
    count = by_id(client.get(PATH).json()["operators"])["count"]

    assert by_id(count["checkpoints"])[5] == {
        "id": 5,
        "status": "COMPLETED",
        "trigger_timestamp": T0 + 5000,
        "latest_ack_timestamp": T0 + 5090,
        "end_to_end_duration": 90.0,  # latest ack - trigger
        "sync_duration": 12.0,
        "async_duration": 40.0,
        "alignment_duration": 25.0,
        "start_delay": 9.0,
        "state_size": 100 + 100 + 700,
        "checkpointed_size": 50 + 50 + 70,
        "num_subtasks": 3,
        "num_acknowledged_subtasks": 3,
        "slowest_subtask": {"index": 2, "end_to_end_duration": 90.0},
    }


def test_an_operator_that_has_not_acknowledged_every_subtask_has_the_checkpoint_status(
    client: TestClient, subtasks: None
) -> None:
    operators = by_id(client.get(PATH).json()["operators"])

    source_6 = by_id(operators["source"]["checkpoints"])[6]
    count_6 = by_id(operators["count"]["checkpoints"])[6]
    assert (source_6["status"], source_6["end_to_end_duration"]) == ("COMPLETED", 10.0)
    assert (count_6["status"], count_6["num_acknowledged_subtasks"]) == ("IN_PROGRESS", 1)
    assert count_6["slowest_subtask"] == {"index": 0, "end_to_end_duration": 15.0}


def test_a_checkpoint_without_rows_of_an_operator_gives_an_empty_entry(
    client: TestClient, subtasks: None
) -> None:
    operators = by_id(client.get(PATH).json()["operators"])

    failed = by_id(operators["source"]["checkpoints"])[3]
    assert failed["status"] == "FAILED"
    assert failed["end_to_end_duration"] is None
    assert failed["num_acknowledged_subtasks"] == 0
    assert failed["slowest_subtask"] is None
    assert (failed["sync_duration"], failed["state_size"]) == (None, 0)


def test_an_operator_no_longer_in_the_graph_is_listed_after_the_graph(
    client: TestClient, subtasks: None
) -> None:
    gone = client.get(PATH).json()["operators"][-1]

    assert (gone["id"], gone["name"], gone["parallelism"]) == ("gone", "gone", 0)
    assert by_id(gone["checkpoints"])[6]["num_subtasks"] == 1  # from its rows


def test_limit_takes_the_newest_checkpoints(client: TestClient, subtasks: None) -> None:
    answer = client.get(PATH, params={"limit": 2}).json()

    assert [c["id"] for c in answer["checkpoints"]] == [5, 6]
    assert [c["id"] for c in answer["operators"][1]["checkpoints"]] == [5, 6]


def test_a_job_without_checkpoints_lists_its_operators_with_no_entries(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s, "fresh")
        s.commit()

    answer = client.get("/jobs/fresh/checkpoints/operators").json()

    assert answer == {
        "checkpoints": [],
        "operators": [
            {"id": "source", "name": "source -> parse", "parallelism": 2, "checkpoints": []},
            {"id": "count", "name": "count -> sink", "parallelism": 3, "checkpoints": []},
        ],
    }


def test_an_unknown_job_is_404(client: TestClient, history: None) -> None:
    answer = client.get("/jobs/nope/checkpoints/operators")

    assert answer.status_code == 404
    assert "nope" in answer.json()["errors"][0]


@pytest.mark.parametrize("limit", ["0", "1001", "-3", "ten"])
def test_a_limit_out_of_bounds_is_400_naming_it(
    client: TestClient, history: None, limit: str
) -> None:
    answer = client.get(PATH, params={"limit": limit})

    assert answer.status_code == 400
    assert answer.json()["errors"][0].startswith("limit: ")


def test_a_thousand_checkpoints_is_the_bound(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s, "long")
        s.flush()
        for cid in range(1, 1006):
            add_checkpoint(s, cid, job_id="long")
        add_subtask(s, 1005, "source", 0, job_id="long", ack_timestamp=T0 + 1_005_030)
        s.commit()

    answer = client.get("/jobs/long/checkpoints/operators", params={"limit": 1000}).json()

    assert [c["id"] for c in answer["checkpoints"]] == list(range(6, 1006))
    source_last = answer["operators"][0]["checkpoints"][-1]
    assert (source_last["id"], source_last["end_to_end_duration"]) == (1005, 30.0)


def test_the_route_does_not_take_operators_for_a_request_id(
    client: TestClient, subtasks: None
) -> None:
    assert client.get(PATH).status_code == 200
    # a request id still reaches the trigger status route
    assert client.get("/jobs/job-1/checkpoints/no-such-request").status_code == 404


def test_the_answer_matches_the_documented_schema(client: TestClient, subtasks: None) -> None:
    document = client.get("/openapi.json").json()
    operation = document["paths"]["/jobs/{job_id}/checkpoints/operators"]["get"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    validator = jsonschema_rs.validator_for({**schema, "components": document["components"]})

    answer = client.get(PATH).json()

    assert validator.is_valid(answer), list(validator.iter_errors(answer))[:3]
    assert {p["name"] for p in operation["parameters"]} == {"job_id", "limit"}
