"""Error answers in Flink's shape: unknown routes, bad input, internal errors, tokens."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from tests.support.ports import free_port

from sparkpoint_server.api.errors import public_cause, validation_messages
from sparkpoint_server.errors import ConflictError
from sparkpoint_server.storage.db import create_db_engine

from .builders import add_job
from .conftest import AppFactory, build_app


def test_an_unknown_route_is_404_naming_the_path(client: TestClient) -> None:
    response = client.get("/jobs/job-1/nothing/here")

    assert response.status_code == 404
    assert response.json() == {"errors": ["Not found: /jobs/job-1/nothing/here"]}


def test_a_wrong_method_is_405(client: TestClient) -> None:
    response = client.delete("/jobs")

    assert response.status_code == 405
    assert response.json() == {"errors": ["Method not allowed: DELETE /jobs"]}


def test_a_bad_path_parameter_is_400_naming_it(client: TestClient) -> None:
    response = client.get("/jobs/job-1/checkpoints/details/abc")

    assert response.status_code == 400
    assert response.json() == {
        "errors": [
            "checkpoint_id: Input should be a valid integer, unable to parse string as an integer"
        ]
    }


def test_a_control_plane_error_keeps_its_status_and_message(
    sessions: sessionmaker[Session],
) -> None:
    app = build_app(sessions)

    @app.get("/conflict")
    def conflict() -> None:
        raise ConflictError("job job-1 is FINISHED: cannot trigger a checkpoint")

    response = TestClient(app).get("/conflict")

    assert response.status_code == 409
    assert response.json() == {"errors": ["job job-1 is FINISHED: cannot trigger a checkpoint"]}


def test_any_other_error_is_a_logged_500_without_a_stack_trace(
    sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    app = build_app(sessions)

    @app.get("/broken")
    def broken() -> None:
        raise KeyError("secret detail")

    with caplog.at_level(logging.ERROR, logger="sparkpoint_server.api.errors"):
        response = TestClient(app, raise_server_exceptions=False).get("/broken")

    assert response.status_code == 500
    assert response.json() == {"errors": ["internal error: KeyError"]}
    assert "secret detail" not in response.text
    record = next(r for r in caplog.records if r.name == "sparkpoint_server.api.errors")
    assert record.getMessage() == "internal error on GET /broken"
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_validation_messages_name_the_field_without_its_source() -> None:
    errors = [
        {"loc": ("body", "target-directory"), "msg": "String should have at least 1 character"},
        {"loc": ("query", "limit"), "msg": "Input should be greater than or equal to 1"},
        {"loc": ("body",), "msg": "Value error, give exactly one of a and b"},
        {
            "loc": ("body", 12),
            "msg": "JSON decode error",
            "type": "json_invalid",
            "ctx": {"error": "Expecting value"},
        },
    ]

    assert validation_messages(errors) == [
        "target-directory: String should have at least 1 character",
        "limit: Input should be greater than or equal to 1",
        "body: give exactly one of a and b",
        "body: JSON decode error (Expecting value)",
    ]


# ----------------------------------------------------------------------------- tokens


@pytest.fixture
def job(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        add_job(s)
        s.commit()


@pytest.mark.usefixtures("job")
def test_reads_are_open_unless_protected(make_client: AppFactory) -> None:
    client = make_client(api_token="s3cret")

    assert client.get("/jobs").status_code == 200
    assert client.get("/jobs/job-1/checkpoints").status_code == 200


@pytest.mark.usefixtures("job")
@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (
            {},
            "a bearer token is required for reads (protect_reads is on): send "
            "'Authorization: Bearer <token>'",
        ),
        (
            {"Authorization": "Basic czNjcmV0"},
            "a bearer token is required for reads "
            "(protect_reads is on): send 'Authorization: Bearer <token>'",
        ),
        (
            {"Authorization": "Bearer wrong"},
            "the bearer token is wrong for reads (protect_reads is on)",
        ),
    ],
)
def test_protected_reads_need_the_token(
    make_client: AppFactory, headers: dict[str, str], message: str
) -> None:
    client = make_client(api_token="s3cret", protect_reads=True)

    response = client.get("/jobs/job-1", headers=headers)

    assert response.status_code == 401
    assert response.json() == {"errors": [message]}
    assert response.headers["www-authenticate"] == "Bearer"
    ok = client.get("/jobs/job-1", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


def test_the_openapi_document_lists_every_route(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]

    assert set(paths) == {
        "/healthz",
        "/metrics",
        "/jobs",
        "/jobs/overview",
        "/jobs/{job_id}",
        "/jobs/{job_id}/metrics/throughput",
        "/jobs/{job_id}/exceptions",
        "/jobs/{job_id}/checkpoints",
        "/jobs/{job_id}/checkpoints/config",
        "/jobs/{job_id}/checkpoints/details/{checkpoint_id}",
        "/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{operator_id}",
        "/jobs/{job_id}/checkpoints/{request_id}",
        "/jobs/{job_id}/savepoints",
        "/jobs/{job_id}/savepoints/{request_id}",
        "/jobs/{job_id}/stop",
        "/jobs/{job_id}/stop/{request_id}",
        "/jobs/{job_id}/restore",
        "/jobs/{job_id}/restore/{request_id}",
        "/jobs/{job_id}/restart-strategy",
        "/jobs/{job_id}/key",
        "/tokens",
        "/tokens/{token_id}",
        "/audit",
        "/jobs/{job_id}/checkpoints/operators",
        "/jobs/{job_id}/restores",
        "/savepoints",
        "/savepoint-disposal",
    }
    assert all(
        op.get("summary") and op.get("description")
        for methods in paths.values()
        for op in methods.values()
    )
    assert client.get("/docs").status_code == 200


@pytest.mark.parametrize(
    ("database", "cause"),
    [
        ("postgresql", "Connection refused"),  # PostgreSQL stopped: nothing listens
        ("sqlite", "unable to open database file"),  # its directory gone (a lost mount)
    ],
)
def test_a_database_away_answers_503_naming_it_never_500(
    database: str, cause: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    url = (
        f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"
        if database == "postgresql"
        else f"sqlite:///{tmp_path / 'gone' / 'sparkpoint.db'}"
    )
    engine = create_db_engine(url)
    client = TestClient(build_app(sessionmaker(engine)), raise_server_exceptions=False)

    for path in ("/jobs", "/jobs/overview", "/jobs/job-1/checkpoints", "/jobs/job-1/exceptions"):
        response = client.get(path)

        assert response.status_code == 503, (path, response.text)
        assert response.headers["Retry-After"] == "5"
        [message] = response.json()["errors"]
        assert message.startswith("the control plane's database is unavailable: "), message
        assert cause in message and message.endswith("; retry")
        assert "SELECT" not in message  # no statement, no values
        assert "127.0.0.1" not in message and str(port) not in message  # nor where it is
    assert not any(r.exc_info for r in caplog.records)  # one line each, no stack trace
    if database == "postgresql":  # the operator's log names it
        assert any(f"port {port}" in r.getMessage() for r in caplog.records)
    health = client.get("/healthz")
    assert health.status_code == 503 and cause in health.text
    assert "127.0.0.1" not in health.text and str(port) not in health.text
    engine.dispose()


@pytest.mark.parametrize(
    ("cause", "public"),
    [
        (
            'connection failed: connection to server at "10.1.2.3", port 5433 failed: timeout',
            'connection failed: connection to server at "…", port … failed: timeout',
        ),
        (
            'FATAL:  password authentication failed for user "sparkpoint"',
            'FATAL:  password authentication failed for user "…"',
        ),
        ("invalid dsn: host=db.internal user=ops", "invalid dsn: host=… user=…"),
        ("database or disk is full", "database or disk is full"),
    ],
)
def test_a_database_cause_in_an_answer_names_no_host_port_or_user(cause: str, public: str) -> None:
    assert public_cause(cause) == public
