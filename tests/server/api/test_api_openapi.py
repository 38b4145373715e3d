"""The OpenAPI document says what the server does: statuses, error bodies, the token, bodies.

Schemathesis (``test_api_openapi_fuzz.py``) checks the answers against the document; these
tests pin the document itself: which statuses each operation lists, that every error status
has the ``{"errors": [...]}`` body, which operations declare the bearer token under each
setting, and that an empty object is a valid body exactly where the server accepts one.
"""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_server.api.openapi import BEARER

from .builders import add_job
from .conftest import AppFactory, build_app
from .test_api_commands import RecordingControlPlane

TOKEN = "a-token-of-sixteen-chars"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MUTATING = {"post", "put", "patch", "delete"}
ERRORS_REF = {"$ref": "#/components/schemas/Errors"}

READ = {"200", "400", "404", "503"}
TRIGGER = {"202", "400", "401", "403", "404", "409", "503"}
CHANGE = {"200", "400", "401", "403", "404", "409", "503"}
#: Every operation's statuses on a server with a token and open reads (every one reads the
#: database: 503 while it is away).
STATUSES = {
    ("get", "/healthz"): {"200", "503"},
    ("get", "/metrics"): {"200", "503"},
    ("get", "/jobs"): {"200", "400", "503"},
    ("get", "/jobs/overview"): {"200", "503"},
    ("get", "/jobs/{job_id}"): READ,
    ("patch", "/jobs/{job_id}"): TRIGGER,
    ("get", "/jobs/{job_id}/metrics/throughput"): READ,
    ("get", "/jobs/{job_id}/exceptions"): READ,
    ("get", "/jobs/{job_id}/checkpoints"): READ,
    ("post", "/jobs/{job_id}/checkpoints"): TRIGGER,
    ("get", "/jobs/{job_id}/checkpoints/config"): READ,
    ("patch", "/jobs/{job_id}/checkpoints/config"): CHANGE,
    ("get", "/jobs/{job_id}/checkpoints/details/{checkpoint_id}"): READ,
    ("get", "/jobs/{job_id}/checkpoints/operators"): READ,
    ("get", "/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{operator_id}"): READ,
    ("get", "/jobs/{job_id}/checkpoints/{request_id}"): READ,
    ("post", "/jobs/{job_id}/savepoints"): TRIGGER,
    ("get", "/jobs/{job_id}/savepoints/{request_id}"): READ,
    ("post", "/jobs/{job_id}/stop"): TRIGGER,
    ("get", "/jobs/{job_id}/stop/{request_id}"): READ,
    ("post", "/jobs/{job_id}/restore"): TRIGGER | {"422"},  # a corrupt checkpoint
    ("get", "/jobs/{job_id}/restore/{request_id}"): READ,
    ("get", "/jobs/{job_id}/restart-strategy"): READ,
    ("put", "/jobs/{job_id}/restart-strategy"): CHANGE,
    ("post", "/jobs/{job_id}/key"): {"200", "400", "401", "403", "503"},
    ("post", "/tokens"): {"201", "400", "401", "403", "503"},
    ("get", "/tokens"): {"200", "401", "403", "503"},
    ("delete", "/tokens/{token_id}"): {"200", "400", "401", "403", "404", "503"},
    ("get", "/audit"): {"200", "400", "401", "403", "503"},
}
ADMIN = {("post", "/tokens"), ("get", "/tokens"), ("delete", "/tokens/{token_id}")}
ADMIN |= {("get", "/audit")}


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): operation
        for path, by_method in document["paths"].items()
        for method, operation in by_method.items()
    }


def document(**settings: Any) -> dict[str, Any]:
    openapi: dict[str, Any] = build_app(None, **settings).openapi()
    return openapi


def test_each_operation_lists_exactly_the_statuses_it_answers() -> None:
    listed = {
        key: set(op["responses"]) for key, op in operations(document(api_token=TOKEN)).items()
    }

    assert {key: listed.get(key) for key in STATUSES} == STATUSES


def test_every_operation_with_a_parameter_or_a_body_lists_400() -> None:
    for key, op in operations(document(api_token=TOKEN)).items():
        if op.get("parameters") or "requestBody" in op:
            assert "400" in op["responses"], key


def test_no_operation_lists_fastapis_422_for_invalid_input() -> None:
    doc = document(api_token=TOKEN)

    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert "ValidationError" not in schemas
    # Invalid input is a 400; a 422 is a checkpoint whose files fail their checks.
    assert [key for key, op in operations(doc).items() if "422" in op["responses"]] == [
        ("post", "/jobs/{job_id}/restore"),
        ("post", "/savepoint-disposal"),
    ]


def test_every_error_status_has_the_errors_body() -> None:
    doc = document(api_token=TOKEN)

    for (method, path), op in operations(doc).items():
        for status, response in op["responses"].items():
            if status < "400" or path == "/healthz":
                continue
            schema = response["content"]["application/json"]["schema"]
            assert schema == ERRORS_REF, (method, path, status)
    assert doc["components"]["schemas"]["Errors"]["properties"]["errors"] == {
        "type": "array",
        "items": {"type": "string"},
        "title": "Errors",
        "examples": [["checkpoint_id: Input should be greater than or equal to 1"]],
    }
    assert doc["components"]["schemas"]["Errors"]["required"] == ["errors"]


def test_every_successful_answer_has_a_body_schema() -> None:
    for (method, path), op in operations(document(api_token=TOKEN)).items():
        [status] = [s for s in op["responses"] if s.startswith("2")]
        content = op["responses"][status]["content"]
        if path == "/metrics":
            assert content == {"text/plain": {}}
            continue
        assert content["application/json"]["schema"], (method, path)


def test_mutating_operations_declare_the_token_and_reads_do_not() -> None:
    doc = document(api_token=TOKEN)

    for (method, path), op in operations(doc).items():
        if method in MUTATING or (method, path) in ADMIN:
            assert op["security"] == [{BEARER: []}], (method, path)
            assert "401" in op["responses"], (method, path)
        else:
            assert "security" not in op, (method, path)
            assert "401" not in op["responses"], (method, path)
    description = doc["components"]["securitySchemes"][BEARER]["description"]
    assert "reads are open (set `SPARKPOINT_PROTECT_READS` to protect them)" in description


def test_with_protect_reads_every_operation_but_the_health_check_declares_the_token() -> None:
    doc = document(api_token=TOKEN, protect_reads=True)

    for (method, path), op in operations(doc).items():
        if path == "/healthz":
            assert "security" not in op
            assert "401" not in op["responses"]
        else:
            assert op["security"] == [{BEARER: []}], (method, path)
            assert "401" in op["responses"], (method, path)
    description = doc["components"]["securitySchemes"][BEARER]["description"]
    assert "reads need it too (`SPARKPOINT_PROTECT_READS` is set)" in description


@pytest.mark.parametrize("protect_reads", [False, True])
def test_each_operation_names_the_role_it_needs(protect_reads: bool) -> None:
    doc = document(api_token=TOKEN, protect_reads=protect_reads)
    read = "viewer" if protect_reads else None

    roles = {key: op.get("x-required-role") for key, op in operations(doc).items()}

    assert roles == {
        key: None
        if key == ("get", "/healthz")
        else "admin"
        if key in ADMIN
        else "operator"
        if key[0] in MUTATING
        else read
        for key in roles
    }
    assert {k for k, role in roles.items() if role in {"operator", "admin"}} == {
        k for k, op in operations(doc).items() if "403" in op["responses"]
    }
    checkpoint = doc["paths"]["/jobs/{job_id}/checkpoints"]["post"]["description"]
    assert checkpoint.endswith("\n\nNeeds a token with the role `operator` (or higher).")


def test_without_a_token_no_operation_declares_one() -> None:
    doc = document(api_token=None)

    for key, op in operations(doc).items():
        assert "security" not in op, key
        if key in STATUSES and key != ("post", "/jobs/{job_id}/key"):  # refuses every call
            assert "401" not in op["responses"], key
    description = doc["components"]["securitySchemes"][BEARER]["description"]
    assert description == (
        "No token is configured (an app built without `sparkpoint server`, which always has "
        "one): no operation asks for it."
    )


def test_reads_answer_without_the_token_and_mutations_need_it(
    make_client: AppFactory, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s)
        s.commit()
    client = make_client(api_token=TOKEN, control_plane=RecordingControlPlane())

    assert client.get("/jobs/job-1/checkpoints/config").status_code == 200
    refused = client.post("/jobs/job-1/checkpoints")
    assert refused.status_code == 401
    assert refused.json() == {
        "errors": ["a bearer token is required for this call: send 'Authorization: Bearer <token>'"]
    }


@pytest.mark.parametrize(
    ("method", "path", "accepted"),
    [
        ("post", "/jobs/{job_id}/checkpoints", True),
        ("post", "/jobs/{job_id}/savepoints", True),  # to the default savepoint directory
        ("post", "/jobs/{job_id}/stop", True),
        ("post", "/jobs/{job_id}/restore", False),  # exactly one of checkpoint_id, savepoint_path
        ("patch", "/jobs/{job_id}/checkpoints/config", False),  # at least one setting
        ("put", "/jobs/{job_id}/restart-strategy", False),  # restart-strategy.type
    ],
)
def test_an_empty_object_is_a_valid_body_exactly_where_the_server_accepts_it(
    make_client: AppFactory,
    sessions: sessionmaker[Session],
    method: str,
    path: str,
    accepted: bool,
) -> None:
    with sessions() as s:
        add_job(s)
        s.commit()
    client = make_client(api_token=TOKEN, control_plane=RecordingControlPlane())
    doc = client.get("/openapi.json").json()
    body = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]

    answer = client.request(method, path.format(job_id="job-1"), json={}, headers=AUTH)

    assert jsonschema_rs.is_valid({**body, "components": doc["components"]}, {}) is accepted
    assert (answer.status_code < 300) is accepted, answer.json()
    if not accepted:
        assert answer.status_code == 400


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/jobs/job-1/restart-strategy", "GET, HEAD, PUT"),
        ("/jobs/job-1/checkpoints/config", "GET, HEAD, PATCH"),
        ("/jobs/job-1/checkpoints", "GET, HEAD, POST"),
        ("/jobs/job-1", "GET, HEAD, PATCH"),
        ("/jobs/overview", "GET, HEAD"),  # not the job `overview`: no PATCH to cancel it
    ],
)
def test_a_wrong_method_answers_405_allowing_every_method_of_the_path(
    make_client: AppFactory, path: str, allow: str
) -> None:
    answer = make_client(api_token=TOKEN).request("DELETE", path)

    assert answer.status_code == 405
    assert answer.headers["allow"] == allow
    assert answer.json() == {"errors": [f"Method not allowed: DELETE {path}"]}
