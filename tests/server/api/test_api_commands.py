"""Mutating routes: tokens, input validation, unknown jobs, and what reaches the service.

:class:`RecordingControlPlane` is a recording test double for these route-level tests only;
the control plane's own tests drive the real service through the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_server.api import ControlPlaneCommands

from .builders import add_checkpoint, add_job
from .conftest import AppFactory

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class RecordingControlPlane:
    """Records each command and answers ``req-<n>`` (or echoes configuration changes)."""

    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def _record(self, name: str, *args: Any) -> str:
        self.calls.append((name, args))
        return f"req-{len(self.calls)}"

    def trigger_checkpoint(self, job_id: str) -> str:
        return self._record("trigger_checkpoint", job_id)

    def trigger_savepoint(self, job_id: str, target_directory: str | None, cancel_job: bool) -> str:
        return self._record("trigger_savepoint", job_id, target_directory, cancel_job)

    def stop_with_savepoint(self, job_id: str, target_directory: str | None) -> str:
        return self._record("stop_with_savepoint", job_id, target_directory)

    def restore(self, job_id: str, checkpoint_id: int | None, savepoint_path: str | None) -> str:
        return self._record("restore", job_id, checkpoint_id, savepoint_path)

    def cancel(self, job_id: str) -> str:
        return self._record("cancel", job_id)

    def dispose_savepoint(self, path: str) -> dict[str, Any]:
        self._record("dispose_savepoint", path)
        return {"path": path, "files": 1}

    def update_checkpoint_config(self, job_id: str, changes: dict[str, int]) -> dict[str, Any]:
        self._record("update_checkpoint_config", job_id, changes)
        return dict(changes)

    def set_restart_strategy(
        self, job_id: str, conf: dict[str, str | int | float]
    ) -> dict[str, Any]:
        self._record("set_restart_strategy", job_id, conf)
        return dict(conf)


def _typed(service: RecordingControlPlane) -> ControlPlaneCommands:
    return service  # mypy checks that the double has the protocol's signatures


@pytest.fixture
def service() -> RecordingControlPlane:
    return RecordingControlPlane()


@pytest.fixture
def api(
    make_client: AppFactory, sessions: sessionmaker[Session], service: RecordingControlPlane
) -> TestClient:
    return commands_app(make_client, sessions, service)


def commands_app(
    make_client: AppFactory, sessions: sessionmaker[Session], service: RecordingControlPlane
) -> TestClient:
    """A token-protected app on a database with job ``job-1`` (checkpoints 1-3 completed, 4
    failed, savepoint 5) whose commands go to ``service``."""
    with sessions() as s:
        add_job(s)
        s.flush()
        for cid in (1, 2, 3):
            add_checkpoint(s, cid)
        add_checkpoint(s, 4, status="FAILED")
        add_checkpoint(s, 5, kind="savepoint", external_path="file:///sp/savepoint-job-1-5")
        s.commit()
    return make_client(api_token=TOKEN, control_plane=_typed(service))


# (method, path, a valid body, the call the service receives)
COMMANDS: list[tuple[str, str, Any, tuple[str, tuple[Any, ...]]]] = [
    ("POST", "/jobs/job-1/checkpoints", None, ("trigger_checkpoint", ("job-1",))),
    (
        "POST",
        "/jobs/job-1/savepoints",
        {"target-directory": "s3://b/sp", "cancel-job": True},
        ("trigger_savepoint", ("job-1", "s3://b/sp", True)),
    ),
    (
        "POST",
        "/jobs/job-1/stop",
        {"targetDirectory": "file:///sp"},
        ("stop_with_savepoint", ("job-1", "file:///sp")),
    ),
    ("POST", "/jobs/job-1/restore", {"checkpoint_id": 3}, ("restore", ("job-1", 3, None))),
    ("PATCH", "/jobs/job-1?mode=cancel", None, ("cancel", ("job-1",))),
]


@pytest.mark.parametrize(("method", "path", "body", "call"), COMMANDS)
def test_commands_need_the_token(
    api: TestClient,
    service: RecordingControlPlane,
    method: str,
    path: str,
    body: Any,
    call: tuple[str, tuple[Any, ...]],
) -> None:
    missing = api.request(method, path, json=body)
    wrong = api.request(method, path, json=body, headers={"Authorization": "Bearer nope"})

    assert missing.status_code == 401
    assert missing.json() == {
        "errors": ["a bearer token is required for this call: send 'Authorization: Bearer <token>'"]
    }
    assert wrong.status_code == 401
    assert wrong.json() == {"errors": ["the bearer token is wrong for this call"]}
    assert service.calls == []


@pytest.mark.parametrize(("method", "path", "body", "call"), COMMANDS)
def test_commands_reach_the_service_and_answer_202_with_the_request_id(
    api: TestClient,
    service: RecordingControlPlane,
    method: str,
    path: str,
    body: Any,
    call: tuple[str, tuple[Any, ...]],
) -> None:
    response = api.request(method, path, json=body, headers=AUTH)

    assert response.status_code == 202
    assert response.json()["request-id"] == "req-1"
    assert service.calls == [call]


@pytest.mark.parametrize(("method", "path", "body", "call"), COMMANDS)
def test_commands_on_an_unknown_job_are_404(
    api: TestClient,
    service: RecordingControlPlane,
    method: str,
    path: str,
    body: Any,
    call: tuple[str, tuple[Any, ...]],
) -> None:
    response = api.request(method, path.replace("job-1", "nope"), json=body, headers=AUTH)

    assert response.status_code == 404
    assert response.json() == {"errors": ["job nope not found"]}
    assert service.calls == []


def test_without_a_configured_token_commands_are_allowed(
    make_client: AppFactory, sessions: sessionmaker[Session], service: RecordingControlPlane
) -> None:
    with sessions() as s:
        add_job(s)
        s.commit()
    client = make_client(control_plane=service)

    response = client.post("/jobs/job-1/checkpoints", json={"checkpointType": "FULL"})

    assert (response.status_code, service.calls) == (202, [("trigger_checkpoint", ("job-1",))])


def test_without_a_service_commands_are_503(client: TestClient) -> None:
    response = client.post("/jobs/job-1/checkpoints")

    assert response.status_code == 503
    assert response.json() == {"errors": ["the coordination service is not running"]}


@pytest.mark.parametrize(
    ("method", "path", "body", "message"),
    [
        (
            "POST",
            "/jobs/job-1/checkpoints",
            {"checkpointType": "DELTA"},
            "checkpointType: Input should be 'CONFIGURED', 'FULL' or 'INCREMENTAL'",
        ),
        (
            "POST",
            "/jobs/job-1/checkpoints",
            {"kind": "full"},
            "kind: Extra inputs are not permitted; the fields are checkpointType",
        ),
        (
            "POST",
            "/jobs/job-1/savepoints",
            {"cancel-job": "yes"},
            "cancel-job: Input should be a valid boolean",
        ),
        (
            "POST",
            "/jobs/job-1/savepoints",
            {"target-directory": ""},
            "target-directory: String should have at least 1 character",
        ),
        (
            "POST",
            "/jobs/job-1/stop",
            {"targetDirectory": "/a", "target-directory": "/b"},
            "body: targetDirectory and target-directory differ; give one of them",
        ),
        (
            "POST",
            "/jobs/job-1/restore",
            {},
            "body: give exactly one of checkpoint_id and savepoint_path",
        ),
        (
            "POST",
            "/jobs/job-1/restore",
            {"checkpoint_id": 2, "savepoint_path": "/sp"},
            "body: give exactly one of checkpoint_id and savepoint_path",
        ),
        (
            "POST",
            "/jobs/job-1/restore",
            {"checkpoint_id": 0},
            "checkpoint_id: Input should be greater than or equal to 1",
        ),
        (
            "POST",
            "/jobs/job-1/restore",
            {"checkpoint_id": "2"},
            "checkpoint_id: Input should be a valid integer",
        ),
        ("POST", "/jobs/job-1/restore", None, "body: Field required"),
        (
            "PATCH",
            "/jobs/job-1?mode=stop",
            None,
            "mode: unknown mode 'stop'; the only mode is 'cancel' (to stop with a savepoint: "
            "POST /jobs/job-1/stop)",
        ),
    ],
)
def test_invalid_input_is_400_naming_the_field(
    api: TestClient,
    service: RecordingControlPlane,
    method: str,
    path: str,
    body: Any,
    message: str,
) -> None:
    response = api.request(method, path, json=body, headers=AUTH)

    assert response.status_code == 400
    assert response.json() == {"errors": [message]}
    assert service.calls == []


def test_malformed_json_is_400(api: TestClient) -> None:
    response = api.post(
        "/jobs/job-1/restore",
        content=b"{not json",
        headers={**AUTH, "Content-Type": "application/json"},
    )

    assert response.status_code == 400
    assert response.json()["errors"][0].startswith("body: JSON decode error")


# ----------------------------------------------------------------------------- restore warning


def test_restoring_an_older_checkpoint_warns_that_later_output_comes_again(
    api: TestClient,
) -> None:
    response = api.post("/jobs/job-1/restore", json={"checkpoint_id": 2}, headers=AUTH)

    assert response.status_code == 202
    assert response.json() == {
        "request-id": "req-1",
        "warning": "sinks cannot un-commit: restoring checkpoint 2 replays the input after it, "
        "so the output already committed by the later checkpoint(s) 3, 5 will be produced "
        "again",
    }


def test_restoring_the_latest_checkpoint_has_no_warning(api: TestClient) -> None:
    response = api.post(
        "/jobs/job-1/restore",
        json={"savepoint_path": "file:///sp/savepoint-job-1-5/"},
        headers=AUTH,
    )

    assert response.status_code == 202
    assert response.json() == {"request-id": "req-1", "warning": None}


def test_restoring_an_unknown_checkpoint_is_404(
    api: TestClient, service: RecordingControlPlane
) -> None:
    response = api.post("/jobs/job-1/restore", json={"checkpoint_id": 99}, headers=AUTH)

    assert response.status_code == 404
    assert response.json() == {"errors": ["checkpoint 99 of job job-1 not found"]}
    assert service.calls == []


# ----------------------------------------------------------------------------- configuration


def test_checkpoint_config_changes_reach_the_service_under_its_keys(
    api: TestClient, service: RecordingControlPlane
) -> None:
    response = api.patch(
        "/jobs/job-1/checkpoints/config",
        json={"interval": 250, "tolerable_failed_checkpoints": 0, "retained": 5},
        headers=AUTH,
    )

    assert response.status_code == 200
    assert service.calls == [
        (
            "update_checkpoint_config",
            ("job-1", {"interval_ms": 250, "tolerable_failures": 0, "retained": 5}),
        )
    ]
    assert response.json() == {
        "mode": "exactly_once",
        "interval": 250,
        "timeout": 60_000,
        "min_pause": 0,
        "max_concurrent": 1,
        "tolerable_failed_checkpoints": 0,
        "retained": 5,
        "state_backend": "rocksdb",
        "incremental": True,
        "checkpoint_storage": "filesystem",
        "checkpoint_dir": "file:///tmp/chk",
        "changeable": [
            "interval",
            "timeout",
            "min_pause",
            "tolerable_failed_checkpoints",
            "retained",
        ],
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"mode": "at_least_once"}, "mode: can change only when the job (re)starts"),
        (
            {"max_concurrent": 2, "interval": 5},
            "max_concurrent: can change only when the job (re)starts",
        ),
        (
            {"intervall": 5},
            "intervall: Extra inputs are not permitted; the fields are interval, timeout, "
            "min_pause, tolerable_failed_checkpoints, retained, mode, max_concurrent",
        ),
        (
            {},
            "body: nothing to change; give any of interval, timeout, min_pause, "
            "tolerable_failed_checkpoints, retained",
        ),
        ({"interval": -1}, "interval: Input should be greater than or equal to 0"),
        ({"timeout": 0}, "timeout: Input should be greater than or equal to 1"),
        ({"retained": 0}, "retained: Input should be greater than or equal to 1"),
        ({"min_pause": 1.5}, "min_pause: Input should be a valid integer"),
        ({"interval": True}, "interval: Input should be a valid integer"),
    ],
)
def test_invalid_checkpoint_config_changes_are_400_naming_the_field(
    api: TestClient, service: RecordingControlPlane, body: dict[str, Any], message: str
) -> None:
    response = api.patch("/jobs/job-1/checkpoints/config", json=body, headers=AUTH)

    assert response.status_code == 400
    assert response.json() == {"errors": [message]}
    assert service.calls == []


def test_checkpoint_config_of_an_unknown_job_is_404(api: TestClient) -> None:
    response = api.patch("/jobs/nope/checkpoints/config", json={"interval": 5}, headers=AUTH)

    assert response.status_code == 404


def test_a_restart_strategy_reaches_the_service_and_answers_the_get_shape(
    api: TestClient, service: RecordingControlPlane
) -> None:
    conf = {
        "restart-strategy.type": "failure-rate",
        "restart-strategy.failure-rate.max-failures-per-interval": 3,
        "restart-strategy.failure-rate.failure-rate-interval": "5 min",
    }

    response = api.put("/jobs/job-1/restart-strategy", json=conf, headers=AUTH)

    assert response.status_code == 200
    assert service.calls == [("set_restart_strategy", ("job-1", conf))]
    assert response.json() == {
        **conf,
        "description": "failure-rate: at most 3 failures per 5 min, restarts 1 s apart",
    }


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"restart-strategy.fixed-delay.attempts": 3},
            "restart-strategy.type: required; one of none, off, disable, fixed-delay, fixeddelay, "
            "failure-rate, failurerate, exponential-delay, exponentialdelay",
        ),
        (
            {"restart-strategy.type": "sometimes"},
            "restart-strategy.type: unknown restart strategy 'sometimes'; expected one of none, "
            "off, disable, fixed-delay, fixeddelay, failure-rate, failurerate, exponential-delay, "
            "exponentialdelay",
        ),
        (
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": -1},
            "restart-strategy.fixed-delay.attempts: invalid value -1: must be >= 0",
        ),
        (
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "soon"},
            "restart-strategy.fixed-delay.delay: invalid duration 'soon'; expected a number and a "
            "unit (ms, s, min, h, d), for example '10 s'",
        ),
        (
            {"restart-strategy.type": "none", "restart-strategy.fixed-delay.attempts": 3},
            "restart-strategy.fixed-delay.attempts: does not apply to restart-strategy.type 'none'",
        ),
        (
            {"restart-strategy.type": "none", "restart-strategy.fixed-delay.attempts": [3]},
            "restart-strategy.fixed-delay.attempts: must be a string or a number, got [3]",
        ),
    ],
)
def test_invalid_restart_strategies_are_400_naming_the_key(
    api: TestClient, service: RecordingControlPlane, conf: dict[str, Any], message: str
) -> None:
    response = api.put("/jobs/job-1/restart-strategy", json=conf, headers=AUTH)

    assert response.status_code == 400
    assert response.json() == {"errors": [message]}
    assert service.calls == []


def test_unknown_restart_strategy_keys_are_400_naming_them(api: TestClient) -> None:
    conf = {"restart-strategy.type": "none", "restart-strategy.bogus": 1, "other": "x"}

    response = api.put("/jobs/job-1/restart-strategy", json=conf, headers=AUTH)

    assert response.status_code == 400
    [message] = response.json()["errors"]
    assert message.startswith("other, restart-strategy.bogus: unknown restart strategy option;")


def test_a_savepoint_disposal_goes_to_the_control_plane_with_flinks_body(
    api: TestClient, service: RecordingControlPlane
) -> None:
    body = {"savepoint-path": "file:///sp/savepoint-7"}
    resp = api.post("/savepoint-disposal", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"path": "file:///sp/savepoint-7", "files": 1}
    assert service.calls == [("dispose_savepoint", ("file:///sp/savepoint-7",))]
    resp = api.post("/savepoint-disposal", json={"path": "/sp"}, headers=AUTH)
    assert resp.status_code == 400
    assert resp.json()["errors"] == [
        "savepoint-path: Field required",
        "path: Extra inputs are not permitted; the fields are savepoint-path",
    ]
    assert api.post("/savepoint-disposal", json=body).status_code == 401
