"""Bounded inputs and outputs of the REST API: a number beyond ``sparkpoint.limits`` is a 400
naming the field (never a 500 from the database), a large subtask list comes in pages, and an
empty API token opens nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from .builders import GRAPH, add_checkpoint, add_job
from .conftest import AppFactory
from .test_api_commands import AUTH, RecordingControlPlane, commands_app

YEAR_MS = 31_536_000_000
INT_MAX = 2**31 - 1
LE_INT = f"Input should be less than or equal to {INT_MAX}"
TOO_LONG = "longer than the maximum of 365 d (31536000000 ms)"


@pytest.fixture
def api(
    make_client: AppFactory, sessions: sessionmaker[Session], service: RecordingControlPlane
) -> TestClient:
    return commands_app(make_client, sessions, service)


@pytest.fixture
def service() -> RecordingControlPlane:
    return RecordingControlPlane()


@pytest.mark.parametrize(
    ("method", "path", "body", "message"),
    [
        ("GET", "/jobs/job-1/checkpoints/details/9223372036854775808", None, LE_INT),
        ("GET", "/jobs/job-1/checkpoints/details/2147483648/subtasks/source", None, LE_INT),
        ("POST", "/jobs/job-1/restore", {"checkpoint_id": 13 * 10**28}, LE_INT),
    ],
)
def test_a_checkpoint_id_beyond_an_int_is_400(
    api: TestClient,
    service: RecordingControlPlane,
    method: str,
    path: str,
    body: Any,
    message: str,
) -> None:
    response = api.request(method, path, json=body, headers=AUTH)

    assert response.status_code == 400
    assert response.json() == {"errors": [f"checkpoint_id: {message}"]}
    assert service.calls == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"interval": 10**29}, f"interval: Input should be less than or equal to {YEAR_MS}"),
        ({"timeout": YEAR_MS + 1}, f"timeout: Input should be less than or equal to {YEAR_MS}"),
        ({"min_pause": 2**63}, f"min_pause: Input should be less than or equal to {YEAR_MS}"),
        ({"retained": 2**63}, f"retained: {LE_INT}"),
        ({"tolerable_failed_checkpoints": 2**31}, f"tolerable_failed_checkpoints: {LE_INT}"),
    ],
)
def test_checkpoint_settings_beyond_their_bound_are_400_naming_the_field(
    api: TestClient, service: RecordingControlPlane, body: dict[str, Any], message: str
) -> None:
    response = api.patch("/jobs/job-1/checkpoints/config", json=body, headers=AUTH)

    assert response.status_code == 400
    assert response.json() == {"errors": [message]}
    assert service.calls == []


def test_checkpoint_settings_at_their_bound_are_accepted(
    api: TestClient, service: RecordingControlPlane
) -> None:
    body = {"interval": YEAR_MS, "retained": INT_MAX}

    response = api.patch("/jobs/job-1/checkpoints/config", json=body, headers=AUTH)

    assert response.status_code == 200
    changes = {"interval_ms": YEAR_MS, "retained": INT_MAX}
    assert service.calls == [("update_checkpoint_config", ("job-1", changes))]


FIXED = "restart-strategy.fixed-delay."
RATE = "restart-strategy.failure-rate."


AT_MOST = f"must be at most {INT_MAX}"


@pytest.mark.parametrize(
    ("kind", "key", "value", "message"),
    [
        ("fixed-delay", FIXED + "attempts", 10**23, f"invalid value {10**23}: {AT_MOST}"),
        (
            "failure-rate",
            RATE + "max-failures-per-interval",
            2**63,
            f"invalid value {2**63}: {AT_MOST}",
        ),
        (
            "fixed-delay",
            FIXED + "delay",
            "99999999999999999999 d",
            f"invalid duration '99999999999999999999 d': {TOO_LONG}",
        ),
        (
            "failure-rate",
            RATE + "failure-rate-interval",
            YEAR_MS + 1,
            f"invalid duration {YEAR_MS + 1}: {TOO_LONG}",
        ),
    ],
)
def test_a_restart_strategy_beyond_its_bounds_is_400_naming_the_key(
    api: TestClient, service: RecordingControlPlane, kind: str, key: str, value: Any, message: str
) -> None:
    conf = {"restart-strategy.type": kind, key: value}

    response = api.put("/jobs/job-1/restart-strategy", json=conf, headers=AUTH)

    assert response.status_code == 400
    assert response.json() == {"errors": [f"{key}: {message}"]}
    assert service.calls == []


# ----------------------------------------------------------------------------- subtask pages


@pytest.fixture
def wide(sessions: sessionmaker[Session]) -> None:
    """Job ``job-1`` whose operator ``count`` has 3,000 subtasks; checkpoint 1 completed."""
    graph = {**GRAPH, "vertices": [{**GRAPH["vertices"][1], "parallelism": 3000}]}
    with sessions() as s:
        add_job(s, graph=graph)
        s.flush()
        add_checkpoint(s, 1)
        s.commit()


def _subtasks(client: TestClient, query: str = "") -> tuple[int, list[int]]:
    response = client.get(f"/jobs/job-1/checkpoints/details/1/subtasks/count{query}")
    assert response.status_code == 200, response.text
    body = response.json()
    return body["num_subtasks"], [entry["index"] for entry in body["subtasks"]]


@pytest.mark.usefixtures("wide")
def test_the_subtasks_come_1024_at_a_time_by_default(client: TestClient) -> None:
    assert _subtasks(client) == (3000, list(range(1024)))


@pytest.mark.usefixtures("wide")
def test_a_page_of_subtasks_from_an_offset(client: TestClient) -> None:
    assert _subtasks(client, "?offset=2990&limit=100") == (3000, list(range(2990, 3000)))
    assert _subtasks(client, "?offset=5&limit=2") == (3000, [5, 6])
    assert _subtasks(client, "?limit=32768") == (3000, list(range(3000)))


@pytest.mark.usefixtures("wide")
@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?limit=0", "limit: Input should be greater than or equal to 1"),
        ("?limit=32769", "limit: Input should be less than or equal to 32768"),
        ("?offset=-1", "offset: Input should be greater than or equal to 0"),
        ("?offset=99999999999999999999", "offset: Input should be less than 32768"),
    ],
)
def test_a_page_out_of_bounds_is_400(client: TestClient, query: str, message: str) -> None:
    response = client.get(f"/jobs/job-1/checkpoints/details/1/subtasks/count{query}")

    assert (response.status_code, response.json()) == (400, {"errors": [message]})


# ----------------------------------------------------------------------------- token


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer "}, AUTH])
def test_an_empty_token_authenticates_nothing(
    make_client: AppFactory,
    sessions: sessionmaker[Session],
    service: RecordingControlPlane,
    headers: dict[str, str],
) -> None:
    with sessions() as s:
        add_job(s)
        s.commit()
    client = make_client(api_token="", protect_reads=True, control_plane=service)

    write = client.post("/jobs/job-1/checkpoints", headers=headers)
    read = client.get("/jobs/job-1", headers=headers)

    assert (write.status_code, read.status_code) == (401, 401)
    assert write.json() == {"errors": ["the API token is empty: this call cannot be authenticated"]}
    assert read.json() == {
        "errors": ["the API token is empty: reads (protect_reads is on) cannot be authenticated"]
    }
    assert service.calls == []
