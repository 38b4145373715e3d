"""Numbers beyond ``sparkpoint.limits`` never reach the database: through the REST API on the
real control plane they are a 400 naming the field (they were 500s), and a registration that
carries them is refused with the reason sent to the job (it used to fail in the database, or
to be accepted and then make the job's first failure unrecoverable)."""

from __future__ import annotations

from typing import Any

import pytest
from api.conftest import build_app
from fastapi.testclient import TestClient
from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint_server.storage.models import Job

INT_MAX = 2**31 - 1
YEAR_MS = 31_536_000_000
LE_INT = f"Input should be less than or equal to {INT_MAX}"
TOO_LONG = "longer than the maximum of 365 d (31536000000 ms)"
FIXED = "restart-strategy.fixed-delay."
RATE = "restart-strategy.failure-rate."


def _api(h: Harness) -> TestClient:
    return TestClient(build_app(h.sessions, control_plane=h.plane), raise_server_exceptions=False)


# (method, path under /jobs/{job_id}, body, the one error)
REQUESTS: list[tuple[str, str, Any, str]] = [
    ("GET", "/checkpoints/details/9223372036854775808", None, f"checkpoint_id: {LE_INT}"),
    ("POST", "/restore", {"checkpoint_id": 13 * 10**28}, f"checkpoint_id: {LE_INT}"),
    (
        "PATCH",
        "/checkpoints/config",
        {"interval": 10**29},
        f"interval: Input should be less than or equal to {YEAR_MS}",
    ),
    (
        "PUT",
        "/restart-strategy",
        {"restart-strategy.type": "fixed-delay", FIXED + "attempts": 10**23},
        f"{FIXED}attempts: invalid value {10**23}: must be at most {INT_MAX}",
    ),
    (
        "PUT",
        "/restart-strategy",
        {"restart-strategy.type": "failure-rate", RATE + "max-failures-per-interval": 2**63},
        f"{RATE}max-failures-per-interval: invalid value {2**63}: must be at most {INT_MAX}",
    ),
    (
        "PUT",
        "/restart-strategy",
        {"restart-strategy.type": "fixed-delay", FIXED + "delay": "99999999999999999999 d"},
        f"{FIXED}delay: invalid duration '99999999999999999999 d': {TOO_LONG}",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "error"),
    REQUESTS,
    ids=["details", "restore", "interval", "attempts", "failure-rate", "delay"],
)
def test_out_of_range_requests_are_400_naming_the_field(
    harness: Harness, method: str, path: str, body: Any, error: str
) -> None:
    harness.start()

    response = _api(harness).request(method, f"/jobs/{harness.job_id}{path}", json=body)

    assert (response.status_code, response.json()) == (400, {"errors": [error]})
    assert harness.commands() == []


def _refusal(h: Harness) -> str:
    """The cause of the one command the job got, a CancelJob(FAILED); the job is not stored."""
    [(_, command)] = h.commands()
    assert isinstance(command, p.CancelJob) and command.status is p.JobStatus.FAILED
    with h.sessions() as s:
        assert s.get(Job, h.job_id) is None
    assert command.cause is not None
    return command.cause


def test_a_registration_with_a_restart_delay_beyond_a_year_is_refused_with_the_reason(
    harness: Harness,
) -> None:
    strategy = {"restart-strategy.type": "fixed-delay", FIXED + "delay": "99999999999999999999 d"}

    harness.register(restart_strategy=strategy)

    assert _refusal(harness) == (
        f"the control plane refused job {harness.job_id}: {FIXED}delay: invalid duration "
        f"'99999999999999999999 d': {TOO_LONG}"
    )


@pytest.mark.parametrize(
    ("setting", "value", "most"),
    [
        ("interval_ms", 10**29, YEAR_MS),
        ("timeout_ms", 10**29, YEAR_MS),
        ("retained", 2**70, INT_MAX),
    ],
)
def test_a_registration_with_checkpoint_settings_beyond_their_bound_is_refused(
    harness: Harness, setting: str, value: int, most: int
) -> None:
    harness.register(**{setting: value})

    assert _refusal(harness) == (
        f"the control plane refused job {harness.job_id}: {setting} must be at most {most}, "
        f"got {value}"
    )
