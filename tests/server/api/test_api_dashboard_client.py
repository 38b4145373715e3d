"""The dashboard's API client against the real REST API: what it sends, what it returns, and the
errors it raises (the dashboard shows their messages as they are)."""

from __future__ import annotations

import socket

import pytest
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_dashboard.api_client import ApiClient, ApiRequestError, ApiUnreachableError

from .conftest import AppFactory
from .test_api_commands import TOKEN, RecordingControlPlane, commands_app


@pytest.fixture
def service() -> RecordingControlPlane:
    return RecordingControlPlane()


@pytest.fixture
def dashboard_client(
    make_client: AppFactory, sessions: sessionmaker[Session], service: RecordingControlPlane
) -> ApiClient:
    """The client on the real API (job-1: checkpoints 1-3 completed, 4 failed, savepoint 5)
    whose commands reach a recording control plane."""
    return ApiClient("http://testserver", http=commands_app(make_client, sessions, service))


def test_reads_return_the_api_answers(dashboard_client: ApiClient) -> None:
    assert [j["id"] for j in dashboard_client.jobs()] == ["job-1"]
    assert dashboard_client.job("job-1")["jid"] == "job-1"
    history = dashboard_client.checkpoints("job-1", limit=2)["history"]
    assert [c["id"] for c in history] == [5, 4]
    assert dashboard_client.checkpoint("job-1", 3)["status"] == "COMPLETED"


def test_an_unknown_job_or_checkpoint_is_an_error_naming_it(dashboard_client: ApiClient) -> None:
    with pytest.raises(ApiRequestError) as job_err:
        dashboard_client.job("nope")
    assert (job_err.value.status, job_err.value.message) == (404, "job nope not found")
    with pytest.raises(ApiRequestError) as cp_err:
        dashboard_client.checkpoint("job-1", 99)
    assert cp_err.value.status == 404
    assert "99" in cp_err.value.message


@pytest.mark.parametrize(
    ("act", "call"),
    [
        (lambda c: c.trigger_checkpoint("job-1", TOKEN), ("trigger_checkpoint", ("job-1",))),
        (
            lambda c: c.trigger_savepoint("job-1", "file:///sp", TOKEN),
            ("trigger_savepoint", ("job-1", "file:///sp", False)),
        ),
        (
            lambda c: c.trigger_savepoint("job-1", "", TOKEN),
            ("trigger_savepoint", ("job-1", None, False)),
        ),
        (
            lambda c: c.stop_with_savepoint("job-1", "file:///sp", TOKEN),
            ("stop_with_savepoint", ("job-1", "file:///sp")),
        ),
        (
            lambda c: c.restore("job-1", TOKEN, checkpoint_id=3),
            ("restore", ("job-1", 3, None)),
        ),
        (
            lambda c: c.restore("job-1", TOKEN, savepoint_path="file:///sp/savepoint-job-1-5"),
            ("restore", ("job-1", None, "file:///sp/savepoint-job-1-5")),
        ),
        (lambda c: c.cancel("job-1", TOKEN), ("cancel", ("job-1",))),
    ],
)
def test_actions_reach_the_control_plane(
    dashboard_client: ApiClient,
    service: RecordingControlPlane,
    act,
    call,  # type: ignore[no-untyped-def]
) -> None:
    answer = act(dashboard_client)

    assert answer["request-id"] == "req-1"
    assert service.calls == [call]


def test_an_action_without_the_token_is_refused_and_sends_nothing(
    dashboard_client: ApiClient, service: RecordingControlPlane
) -> None:
    with pytest.raises(ApiRequestError) as err:
        dashboard_client.trigger_checkpoint("job-1", "")
    assert err.value.status == 401
    with pytest.raises(ApiRequestError) as wrong:
        dashboard_client.trigger_checkpoint("job-1", "not-the-token")
    assert wrong.value.status in (401, 403)
    assert service.calls == []


def test_an_unreachable_control_plane_is_its_own_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ApiClient(f"http://127.0.0.1:{port}", timeout_s=1.0)
    try:
        with pytest.raises(ApiUnreachableError, match=f"127.0.0.1:{port}"):
            client.jobs()
    finally:
        client.close()


def test_the_audit_log_reads_with_an_admin_token_and_names_the_role_otherwise(
    dashboard_client: ApiClient,
) -> None:
    dashboard_client.trigger_checkpoint("job-1", TOKEN)
    viewer = dashboard_client.call(
        "POST", "/tokens", TOKEN, json={"name": "wall screen", "role": "viewer"}
    )

    log = dashboard_client.audit(TOKEN, limit=10, job="job-1")
    with pytest.raises(ApiRequestError) as refused:
        dashboard_client.audit(viewer["secret"])

    assert [(e["path"], e["status"]) for e in log["entries"]] == [("/jobs/job-1/checkpoints", 202)]
    assert refused.value.status == 403
    assert "needs a token with the role admin" in refused.value.message
