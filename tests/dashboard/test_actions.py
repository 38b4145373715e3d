"""The actions that steer a job: what can be restored, how a click is checked and confirmed,
the request each confirmed action sends, how its record evolves while polled, and the log."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components import actions
from sparkpoint_dashboard.components import operations as ops
from sparkpoint_dashboard.components.actions import (
    confirm_message,
    execute,
    plan_action,
    restore_candidates,
    restore_options,
)

JOB = "ab8f"
T0 = 1_795_659_724_000  # 2026-11-26 02:22:04.000 UTC
NOW = T0 + 95_000


def recording_client(
    status: int = 202, answer: Any = None
) -> tuple[ApiClient, list[httpx.Request]]:
    """A real :class:`ApiClient` whose HTTP transport records the requests and answers."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=answer if answer is not None else {"request-id": "r-1"})

    client = ApiClient("http://api")
    client._http = httpx.Client(base_url="http://api", transport=httpx.MockTransport(handler))
    return client, seen


def checkpoint(cp_id: int, **fields: Any) -> dict[str, Any]:
    entry = {
        "id": cp_id,
        "status": "COMPLETED",
        "is_savepoint": False,
        "trigger_timestamp": T0 + cp_id * 1000 - 400,
        "latest_ack_timestamp": T0 + cp_id * 1000,
        "state_size": 443,
        "external_path": f"file:///chk/{JOB}/chk-{cp_id}",
        "discarded": False,
    }
    entry.update(fields)
    return entry


HISTORY = [
    checkpoint(9, status="IN_PROGRESS", latest_ack_timestamp=None, external_path=None),
    checkpoint(8, is_savepoint=True, external_path="file:///sp/savepoint-8", state_size=2048),
    checkpoint(7),
    checkpoint(6, status="FAILED"),
    checkpoint(5, discarded=True),
    checkpoint(4, is_savepoint=True, external_path=None),
    # disposed of (POST /savepoint-disposal): its files are gone
    checkpoint(3, is_savepoint=True, external_path="file:///sp/savepoint-3", discarded=True),
]

CANDIDATES = {
    "savepoint:8": {
        "id": 8,
        "savepoint": True,
        "path": "file:///sp/savepoint-8",
        "time": T0 + 8000,
        "size": 2048,
        "passed_over": False,
    },
    "checkpoint:7": {
        "id": 7,
        "savepoint": False,
        "path": f"file:///chk/{JOB}/chk-7",
        "time": T0 + 7000,
        "size": 443,
        "passed_over": False,
    },
}


# ----------------------------------------------------------------------------- restore choices


def test_restore_candidates_are_the_retained_checkpoints_and_the_savepoints_newest_first() -> None:
    assert restore_candidates(HISTORY) == CANDIDATES
    assert list(restore_candidates(list(reversed(HISTORY)))) == ["savepoint:8", "checkpoint:7"]


def test_restore_options_name_id_kind_time_and_size() -> None:
    assert restore_options(CANDIDATES) == [
        {"label": "#8 savepoint · 02:22:12 UTC · 2.0 KiB", "value": "savepoint:8"},
        {"label": "#7 checkpoint · 02:22:11 UTC · 443 B", "value": "checkpoint:7"},
    ]


def test_a_checkpoint_a_restore_went_back_past_says_so_and_stays_restorable() -> None:
    behind = restore_candidates(HISTORY, passed_over=[7])
    assert behind["checkpoint:7"]["passed_over"] and not behind["savepoint:8"]["passed_over"]
    assert restore_options(behind)[1] == {
        "label": "#7 checkpoint · 02:22:11 UTC · 443 B · a restore went back past it",
        "value": "checkpoint:7",
    }


# ----------------------------------------------------------------------------- planning


def plan(kind: str, **overrides: Any) -> tuple[dict[str, Any] | None, str | None]:
    args: dict[str, Any] = {
        "token": "tok",
        "target": None,
        "choice": None,
        "choices": CANDIDATES,
        "now_ms": NOW,
    }
    args.update(overrides)
    return plan_action(kind, JOB, **args)


@pytest.mark.parametrize("token", [None, "", "   "])
def test_no_token_no_action(token: str | None) -> None:
    assert plan("checkpoint", token=token) == (
        None,
        "Enter the API token in the header first: actions need it.",
    )


def test_restore_needs_a_choice_that_is_still_retained() -> None:
    assert plan("restore") == (None, "Choose a checkpoint or savepoint to restore first.")
    assert plan("restore", choice="checkpoint:5") == (
        None,
        "checkpoint 5 is no longer retained: choose another one.",
    )


def test_a_checkpoint_is_planned_with_its_confirmation() -> None:
    assert plan("checkpoint") == (
        {
            "kind": "checkpoint",
            "job_id": JOB,
            "label": "Trigger checkpoint",
            "message": "Trigger a checkpoint of job ab8f?",
        },
        None,
    )


def test_a_savepoint_goes_into_the_directory_given_or_the_default() -> None:
    given, _ = plan("savepoint", target="  file:///tmp/sp  ")
    assert given == {
        "kind": "savepoint",
        "job_id": JOB,
        "target": "file:///tmp/sp",
        "label": "Savepoint into file:///tmp/sp",
        "message": "Trigger a savepoint of job ab8f into file:///tmp/sp? The job keeps running.",
    }
    default, _ = plan("savepoint", target="")
    assert default is not None and default["target"] is None
    assert default["message"] == (
        "Trigger a savepoint of job ab8f into the control plane's default savepoint directory? "
        "The job keeps running."
    )


def test_stop_and_cancel_say_what_happens() -> None:
    stop, _ = plan("stop", target="/sp")
    assert stop is not None and stop["message"] == (
        "Stop job ab8f with a savepoint into /sp?\n\n"
        "The job takes a final savepoint, its sinks commit, and it finishes."
    )
    cancel, _ = plan("cancel")
    assert cancel is not None and cancel["message"] == (
        "Cancel job ab8f now, without a savepoint?\n\n"
        "Its pending checkpoints are aborted and it stops. This cannot be undone: "
        "the job does not run again unless you start it anew."
    )


def test_restoring_a_checkpoint_warns_that_output_since_it_is_produced_again() -> None:
    planned, error = plan("restore", choice="checkpoint:7")
    assert error is None and planned is not None
    assert planned["checkpoint_id"] == 7 and "savepoint_path" not in planned
    assert planned["label"] == "Restore checkpoint 7 (2026-11-26 02:22:11.000 UTC)"
    assert planned["message"] == (
        "Restore job ab8f from checkpoint 7, taken 2026-11-26 02:22:11.000 UTC (1 min 28 s ago)?"
        "\n\nThe job restarts as a new attempt from that state and those source positions. "
        "Sinks cannot un-commit: the output they committed since 2026-11-26 02:22:11.000 UTC "
        "will be produced again (they commit again from there)."
    )


def test_restoring_a_savepoint_goes_by_its_path() -> None:
    planned, _ = plan("restore", choice="savepoint:8")
    assert planned is not None
    assert planned["savepoint_path"] == "file:///sp/savepoint-8"
    assert "checkpoint_id" not in planned
    assert planned["message"].startswith(
        "Restore job ab8f from savepoint 8 at file:///sp/savepoint-8, taken "
        "2026-11-26 02:22:12.000 UTC (1 min 27 s ago)?"
    )
    assert (
        confirm_message("restore", JOB, candidate=CANDIDATES["savepoint:8"], now_ms=NOW)
        == (planned["message"])
    )


# ----------------------------------------------------------------------------- sending


@pytest.mark.parametrize(
    ("kind", "overrides", "method", "path", "body"),
    [
        ("checkpoint", {}, "POST", "/jobs/ab8f/checkpoints", {}),
        (
            "savepoint",
            {"target": "/sp"},
            "POST",
            "/jobs/ab8f/savepoints",
            {"target-directory": "/sp"},
        ),
        ("savepoint", {}, "POST", "/jobs/ab8f/savepoints", {}),
        (
            "stop",
            {"target": "s3://b/sp"},
            "POST",
            "/jobs/ab8f/stop",
            {"targetDirectory": "s3://b/sp"},
        ),
        ("restore", {"choice": "checkpoint:7"}, "POST", "/jobs/ab8f/restore", {"checkpoint_id": 7}),
        (
            "restore",
            {"choice": "savepoint:8"},
            "POST",
            "/jobs/ab8f/restore",
            {"savepoint_path": "file:///sp/savepoint-8"},
        ),
        ("cancel", {}, "PATCH", "/jobs/ab8f?mode=cancel", None),
    ],
)
def test_each_action_sends_its_request_with_the_token(
    kind: str, overrides: dict[str, Any], method: str, path: str, body: Any
) -> None:
    client, seen = recording_client()
    planned, _ = plan(kind, **overrides)
    assert planned is not None
    execute(client, planned, "tok", NOW)
    (request,) = seen
    assert request.method == method
    assert request.url.raw_path.decode() == path
    assert request.headers["authorization"] == "Bearer tok"
    assert (json.loads(request.content) if request.content else None) == body


def test_an_accepted_savepoint_is_recorded_in_progress() -> None:
    client, _ = recording_client(202, {"request-id": "r-42"})
    planned, _ = plan("savepoint", target="/sp")
    assert planned is not None
    record, feedback = execute(client, planned, "tok", NOW)
    assert record == {
        "job_id": JOB,
        "kind": "savepoint",
        "label": "Savepoint into /sp",
        "request_id": "r-42",
        "status": "IN_PROGRESS",
        "detail": None,
        "warning": None,
        "location": None,
        "checkpoint_id": None,
        "requested_at": NOW,
        "finished_at": None,
    }
    assert feedback.children == "Savepoint into /sp requested; its outcome shows in the log below."


def test_a_restore_shows_the_apis_warning() -> None:
    warning = "sinks cannot un-commit: ... 8, 9 will be produced again"
    client, _ = recording_client(202, {"request-id": "r-7", "warning": warning})
    planned, _ = plan("restore", choice="checkpoint:7")
    assert planned is not None
    record, feedback = execute(client, planned, "tok", NOW)
    assert (record["status"], record["warning"]) == ("IN_PROGRESS", warning)
    assert feedback.className == "notice notice-warn"
    assert feedback.children == (
        f"Restore checkpoint 7 (2026-11-26 02:22:11.000 UTC) requested. Warning: {warning}."
    )


def test_a_refused_action_is_recorded_failed_with_the_apis_message() -> None:
    message = "checkpoint 7 of job ab8f is not retained; retained checkpoints and savepoints: [8]"
    client, _ = recording_client(404, {"errors": [message]})
    planned, _ = plan("restore", choice="checkpoint:7")
    assert planned is not None
    record, feedback = execute(client, planned, "tok", NOW)
    assert (record["status"], record["detail"], record["finished_at"]) == ("FAILED", message, NOW)
    assert feedback.children == (
        f"Restore checkpoint 7 (2026-11-26 02:22:11.000 UTC): refused (HTTP 404): {message}"
    )


def test_a_cancel_is_done_once_accepted() -> None:
    client, _ = recording_client(202, {"request-id": "c-1"})
    planned, _ = plan("cancel")
    assert planned is not None
    record, _ = execute(client, planned, "tok", NOW)
    assert record["status"] == "COMPLETED"
    assert record["detail"] == (
        "the control plane accepted the cancel (request c-1): the job's status shows "
        "CANCELLING, then CANCELED"
    )
    assert ops.to_poll([record]) == []


def test_an_unreachable_control_plane_fails_the_record() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    client = ApiClient("http://api")
    client._http = httpx.Client(base_url="http://api", transport=httpx.MockTransport(refuse))
    planned, _ = plan("checkpoint")
    assert planned is not None
    record, _ = execute(client, planned, "tok", NOW)
    assert record["status"] == "FAILED"
    assert record["detail"].startswith("no answer from the control plane (cannot reach")


def test_the_panel_holds_every_control() -> None:
    from sparkpoint_dashboard.routing import parse

    found = {getattr(c, "id", None) for c in actions.panel(parse("/jobs/ab8f"))._traverse()}
    for cid in (
        "action-trigger-checkpoint",
        "action-trigger-savepoint",
        "action-savepoint-dir",
        "action-stop-with-savepoint",
        "action-cancel",
        "action-restore-select",
        "action-restore",
        "action-confirm",
        "action-pending",
        "action-feedback",
        "operations-log",
        "action-restore-choices",
    ):
        assert cid in found, cid
