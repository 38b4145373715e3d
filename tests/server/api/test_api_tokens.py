"""Roles and tokens: each role against representative operations, tokens that are revoked or
expired, secrets that are never stored, and the admin API that manages them.

The settings' token (``SPARKPOINT_API_TOKEN``) is the bootstrap admin; the others are created
through ``POST /tokens`` as an operator would, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_server.storage.access import secret_digest
from sparkpoint_server.storage.models import ApiToken

from .builders import add_job
from .conftest import AppFactory
from .test_api_commands import RecordingControlPlane

ADMIN_SECRET = "bootstrap-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_SECRET}"}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def create(client: TestClient, role: str, name: str = "", **extra: Any) -> dict[str, Any]:
    answer = client.post(
        "/tokens", json={"name": name or f"ci {role}", "role": role, **extra}, headers=ADMIN
    )
    assert answer.status_code == 201, answer.json()
    created: dict[str, Any] = answer.json()
    return created


@pytest.fixture
def app_client(make_client: AppFactory, sessions: sessionmaker[Session]) -> TestClient:
    with sessions() as s:
        add_job(s)
        s.commit()
    return make_client(
        api_token=ADMIN_SECRET, protect_reads=True, control_plane=RecordingControlPlane()
    )


#: (method, path, body): a read, every kind of mutating call on a job, the admin resources.
READ = ("GET", "/jobs/job-1", None)
OPERATOR_CALLS = [
    ("POST", "/jobs/job-1/checkpoints", None),
    ("POST", "/jobs/job-1/savepoints", {}),
    ("POST", "/jobs/job-1/stop", {}),
    ("PATCH", "/jobs/job-1", None),
    ("PATCH", "/jobs/job-1/checkpoints/config", {"interval": 5000}),
    ("PUT", "/jobs/job-1/restart-strategy", {"restart-strategy.type": "none"}),
]
ADMIN_CALLS = [
    ("GET", "/tokens", None),
    ("GET", "/audit", None),
    ("POST", "/tokens", {"name": "x", "role": "viewer"}),
]
NEEDS = {"viewer": 0, "operator": 1, "admin": 2}


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
def test_each_role_may_do_what_its_role_allows_and_gets_403_naming_the_role_otherwise(
    app_client: TestClient, role: str
) -> None:
    token = create(app_client, role)
    headers = bearer(token["secret"])
    rank = NEEDS[role]

    outcomes = {}
    for needed, calls in (("viewer", [READ]), ("operator", OPERATOR_CALLS), ("admin", ADMIN_CALLS)):
        for method, path, body in calls:
            answer = app_client.request(method, path, json=body, headers=headers)
            outcomes[(method, path)] = answer.status_code
            if NEEDS[needed] > rank:
                assert answer.json() == {
                    "errors": [
                        f"this call needs a token with the role {needed} (or higher); "
                        f"token {token['id']} has the role {role}"
                    ]
                }, (method, path)

    expected = {}
    for needed, calls in (("viewer", [READ]), ("operator", OPERATOR_CALLS), ("admin", ADMIN_CALLS)):
        for method, path, _ in calls:
            ok = (
                201
                if path == "/tokens" and method == "POST"
                else (
                    202 if method in {"POST"} or (method, path) == ("PATCH", "/jobs/job-1") else 200
                )
            )
            expected[(method, path)] = ok if NEEDS[needed] <= rank else 403
    assert outcomes == expected


def test_the_bootstrap_token_is_an_admin_and_operator(app_client: TestClient) -> None:
    assert app_client.post("/jobs/job-1/checkpoints", headers=ADMIN).status_code == 202
    assert app_client.get("/audit", headers=ADMIN).status_code == 200


def test_admin_resources_need_a_token_even_when_reads_are_open(
    make_client: AppFactory,
) -> None:
    client = make_client(api_token=ADMIN_SECRET)
    viewer = create(client, "viewer")

    assert client.get("/jobs").status_code == 200
    assert client.get("/tokens").status_code == 401
    assert client.get("/audit").status_code == 401
    assert client.get("/audit", headers=bearer(viewer["secret"])).status_code == 403


def test_a_revoked_token_answers_401_from_then_on(app_client: TestClient) -> None:
    token = create(app_client, "operator")
    headers = bearer(token["secret"])
    assert app_client.post("/jobs/job-1/checkpoints", headers=headers).status_code == 202

    revoked = app_client.delete(f"/tokens/{token['id']}", headers=ADMIN)

    assert revoked.status_code == 200
    assert revoked.json()["revoked"] is not None
    assert revoked.json()["revoked-by"] == "bootstrap admin (bootstrap)"
    refused = app_client.post("/jobs/job-1/checkpoints", headers=headers)
    assert refused.status_code == 401
    assert refused.json() == {"errors": [f"the bearer token {token['id']} is revoked"]}
    assert refused.headers["www-authenticate"] == "Bearer"
    assert app_client.get("/jobs/job-1", headers=headers).status_code == 401
    again = app_client.delete(f"/tokens/{token['id']}", headers=ADMIN)
    assert again.json()["revoked"] == revoked.json()["revoked"]


def test_an_expired_token_answers_401(app_client: TestClient) -> None:
    token = create(app_client, "operator", expires_in=60)
    headers = bearer(token["secret"])
    assert app_client.post("/jobs/job-1/checkpoints", headers=headers).status_code == 202

    app_client.app.state.clock.advance(60_000)  # type: ignore[attr-defined]

    refused = app_client.post("/jobs/job-1/checkpoints", headers=headers)
    assert refused.status_code == 401
    assert refused.json() == {"errors": [f"the bearer token {token['id']} has expired"]}


def test_an_unknown_token_answers_401(app_client: TestClient) -> None:
    refused = app_client.post("/jobs/job-1/checkpoints", headers=bearer("spt_unknown"))

    assert refused.status_code == 401
    assert refused.json() == {"errors": ["the bearer token is wrong for this call"]}


def test_the_secret_is_answered_once_and_only_its_sha256_is_stored(
    app_client: TestClient, sessions: sessionmaker[Session]
) -> None:
    token = create(app_client, "viewer", name="grafana", expires_in=3600)

    with sessions() as s:
        [row] = s.scalars(select(ApiToken)).all()
        stored = {c.name: getattr(row, c.name) for c in ApiToken.__table__.columns}
    assert token["secret"].startswith("spt_") and len(token["secret"]) >= 40
    assert token["secret"] not in str(stored)
    assert stored["secret_sha256"] == secret_digest(token["secret"])
    assert stored["name"] == "grafana"
    assert stored["role"] == "viewer"
    assert stored["created_by"] == "bootstrap admin (bootstrap)"
    assert stored["expires_at"] == stored["created_at"] + 3_600_000
    listed = app_client.get("/tokens", headers=ADMIN).json()
    assert listed == {"tokens": [{k: v for k, v in token.items() if k != "secret"}]}
    assert token["secret"] not in str(listed)


def test_tokens_created_by_an_admin_token_name_it(app_client: TestClient) -> None:
    admin = create(app_client, "admin", name="ops lead")

    answer = app_client.post(
        "/tokens", json={"name": "ci", "role": "operator"}, headers=bearer(admin["secret"])
    )

    assert answer.json()["created-by"] == f"ops lead ({admin['id']})"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "x", "role": "root"}, "role: Input should be 'viewer', 'operator' or 'admin'"),
        ({"name": "", "role": "viewer"}, "name: String should have at least 1 character"),
        (
            {"name": "x", "role": "viewer", "expires_in": 0},
            "expires_in: Input should be greater than or equal to 1",
        ),
        (
            {"name": "x", "role": "viewer", "secret": "mine"},
            "secret: Extra inputs are not permitted; the fields are name, role, expires_in",
        ),
    ],
)
def test_an_invalid_token_request_answers_400(
    app_client: TestClient, body: dict[str, Any], message: str
) -> None:
    answer = app_client.post("/tokens", json=body, headers=ADMIN)

    assert answer.status_code == 400
    assert answer.json() == {"errors": [message]}


def test_revoking_an_unknown_token_answers_404(app_client: TestClient) -> None:
    answer = app_client.delete("/tokens/0123456789abcdef", headers=ADMIN)

    assert answer.status_code == 404
    assert answer.json() == {"errors": ["token 0123456789abcdef not found"]}


def test_an_admin_read_without_a_token_says_a_token_is_required_for_this_call(
    make_client: AppFactory,
) -> None:
    answer = make_client(api_token=ADMIN_SECRET).get("/tokens")

    assert answer.json() == {
        "errors": ["a bearer token is required for this call: send 'Authorization: Bearer <token>'"]
    }
