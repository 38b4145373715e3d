"""The audit log: every mutating call, allowed or refused, with who, what, when and the
outcome; ``GET /audit``'s filters, order and paging; the bounded retention."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_server.api.audit_trail import summarize_body
from sparkpoint_server.storage.models import AuditEntry

from .builders import add_job
from .conftest import NOW, AppFactory
from .test_api_commands import RecordingControlPlane

ADMIN_SECRET = "bootstrap-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_SECRET}"}


@pytest.fixture
def make_app(make_client: AppFactory, sessions: sessionmaker[Session]) -> AppFactory:
    with sessions() as s:
        add_job(s)
        add_job(s, "job-2")
        s.commit()

    def make(**kwargs: Any) -> TestClient:
        return make_client(api_token=ADMIN_SECRET, control_plane=RecordingControlPlane(), **kwargs)

    return make


def entries(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/audit", params=params, headers=ADMIN)
    assert answer.status_code == 200, answer.json()
    found: list[dict[str, Any]] = answer.json()["entries"]
    return found


def test_an_allowed_call_is_recorded_with_who_what_when_and_the_outcome(
    make_app: AppFactory,
) -> None:
    client = make_app()
    operator = client.post(
        "/tokens", json={"name": "deploy bot", "role": "operator"}, headers=ADMIN
    ).json()

    client.post(
        "/jobs/job-1/savepoints",
        json={"target-directory": "/tmp/sp", "cancel-job": False},
        headers={"Authorization": f"Bearer {operator['secret']}"},
    )

    [savepoint, created] = entries(client)
    assert savepoint == {
        "id": created["id"] + 1,
        "time": NOW,
        "token-id": operator["id"],
        "token-name": "deploy bot",
        "role": "operator",
        "method": "POST",
        "path": "/jobs/job-1/savepoints",
        "job-id": "job-1",
        "request": '{"target-directory":"/tmp/sp","cancel-job":false}',
        "status": 202,
        "request-id": "req-1",
    }
    assert created == {
        "id": created["id"],
        "time": NOW,
        "token-id": "bootstrap",
        "token-name": "bootstrap admin",
        "role": "admin",
        "method": "POST",
        "path": "/tokens",
        "job-id": None,
        "request": '{"name":"deploy bot","role":"operator"}',
        "status": 201,
        "request-id": None,
    }
    assert operator["secret"] not in str(entries(client))


def test_refused_calls_are_recorded_too(make_app: AppFactory) -> None:
    client = make_app()
    viewer = client.post("/tokens", json={"name": "wall", "role": "viewer"}, headers=ADMIN).json()

    client.post("/jobs/job-1/checkpoints")  # no token: 401
    client.patch("/jobs/job-1", headers={"Authorization": "Bearer not-a-token"})  # 401
    client.post(
        "/jobs/job-2/stop", json={}, headers={"Authorization": f"Bearer {viewer['secret']}"}
    )
    client.patch("/jobs/job-1/checkpoints/config", json={"interval": -1}, headers=ADMIN)  # 400
    client.post("/jobs/nope/checkpoints", headers=ADMIN)  # 404
    client.post("/no/such/path", headers=ADMIN)  # 404, no route

    shown = [
        (e["token-name"], e["role"], e["method"], e["path"], e["job-id"], e["status"])
        for e in entries(client)
    ]
    assert shown == [
        ("bootstrap admin", "admin", "POST", "/no/such/path", None, 404),
        ("bootstrap admin", "admin", "POST", "/jobs/nope/checkpoints", "nope", 404),
        ("bootstrap admin", "admin", "PATCH", "/jobs/job-1/checkpoints/config", "job-1", 400),
        ("wall", "viewer", "POST", "/jobs/job-2/stop", "job-2", 403),
        ("invalid token", None, "PATCH", "/jobs/job-1", "job-1", 401),
        ("anonymous", None, "POST", "/jobs/job-1/checkpoints", "job-1", 401),
        ("bootstrap admin", "admin", "POST", "/tokens", None, 201),
    ]
    assert entries(client)[3]["token-id"] == viewer["id"]
    assert entries(client)[2]["request"] == '{"interval":-1}'


def test_reads_are_not_recorded(make_app: AppFactory) -> None:
    client = make_app()

    client.get("/jobs/job-1")
    client.get("/audit", headers=ADMIN)

    assert entries(client) == []


def test_the_audit_log_filters_by_job_and_pages_newest_first(make_app: AppFactory) -> None:
    client = make_app()
    for job in ("job-1", "job-2", "job-1", "job-1"):
        client.post(f"/jobs/{job}/checkpoints", headers=ADMIN)

    everything = entries(client)
    of_job_1 = client.get("/audit", params={"job": "job-1"}, headers=ADMIN).json()
    page = client.get("/audit", params={"job": "job-1", "limit": 1, "offset": 1}, headers=ADMIN)

    assert [e["request-id"] for e in everything] == ["req-4", "req-3", "req-2", "req-1"]
    assert [e["request-id"] for e in of_job_1["entries"]] == ["req-4", "req-3", "req-1"]
    assert of_job_1["total"] == 3
    assert [e["request-id"] for e in page.json()["entries"]] == ["req-3"]
    assert page.json()["total"] == 3
    assert [e["id"] for e in everything] == sorted((e["id"] for e in everything), reverse=True)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"limit": 0}, "limit: Input should be greater than or equal to 1"),
        ({"limit": 1001}, "limit: Input should be less than or equal to 1000"),
        ({"offset": -1}, "offset: Input should be greater than or equal to 0"),
    ],
)
def test_invalid_paging_answers_400(
    make_app: AppFactory, params: dict[str, Any], message: str
) -> None:
    answer = make_app().get("/audit", params=params, headers=ADMIN)

    assert answer.status_code == 400
    assert answer.json() == {"errors": [message]}


def test_the_audit_log_keeps_its_newest_rows(
    make_app: AppFactory, sessions: sessionmaker[Session]
) -> None:
    client = make_app(audit_retention=3)
    for _ in range(5):
        client.post("/jobs/job-1/checkpoints", headers=ADMIN)

    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(AuditEntry)) == 3
    assert [e["request-id"] for e in entries(client)] == ["req-5", "req-4", "req-3"]


@pytest.mark.parametrize(
    ("body", "summary"),
    [
        (b"", None),
        (
            b'{"name":"x","token":"abc","nested":{"password":"p"}}',
            '{"name":"x","token":"<redacted>","nested":{"password":"<redacted>"}}',
        ),
        (b"not json at all", "<15 bytes, not JSON>"),
        (b'{"a":"' + b"x" * 600 + b'"}', '{"a":"' + "x" * 493 + "…"),
    ],
)
def test_a_body_is_summarised_bounded_and_without_secrets(body: bytes, summary: str | None) -> None:
    assert summarize_body(body, len(body)) == summary


def test_a_body_larger_than_what_is_looked_at_is_not_recorded() -> None:
    assert summarize_body(b"{" * 4096, 10_000) == "<10000 bytes, not recorded>"
