"""The operations log of the dashboard's actions: how a request's record evolves while it is
polled, and how the log shows this job's operations."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dash import html

from sparkpoint_dashboard.components import operations as ops

JOB = "ab8f"
T0 = 1_795_659_724_000  # 2026-11-26 02:22:04.000 UTC
NOW = T0 + 95_000


# ----------------------------------------------------------------------------- polling


def in_progress(kind: str = "savepoint") -> dict[str, Any]:
    return ops.new_record(JOB, kind, "Savepoint into /sp", T0, request_id="r-1")


def test_an_operation_in_progress_stays_so() -> None:
    answer = {"status": {"id": "IN_PROGRESS"}, "operation": None, "failed": False}
    assert ops.apply_status(in_progress(), answer, NOW) is None


@pytest.mark.parametrize(
    ("kind", "detail"),
    [
        ("savepoint", "savepoint 12 completed at file:///sp/savepoint-12"),
        ("checkpoint", "checkpoint 12 completed at file:///sp/savepoint-12"),
        ("stop", "final savepoint 12 completed at file:///sp/savepoint-12; the job finishes"),
        ("restore", "the job runs again from checkpoint 12 at file:///sp/savepoint-12"),
    ],
)
def test_a_completed_operation_shows_where_and_which(kind: str, detail: str) -> None:
    answer = {
        "status": {"id": "COMPLETED"},
        "operation": {"location": "file:///sp/savepoint-12", "checkpointId": 12},
        "failed": False,
    }
    assert ops.apply_status(in_progress(kind), answer, NOW) == {
        **in_progress(kind),
        "status": "COMPLETED",
        "location": "file:///sp/savepoint-12",
        "checkpoint_id": 12,
        "detail": detail,
        "finished_at": NOW,
    }


def test_a_failed_operation_shows_its_cause() -> None:
    answer = {
        "status": {"id": "COMPLETED"},
        "operation": {
            "failure-cause": {
                "class": "CheckpointFailure",
                "stack-trace": "checkpoint 12 expired after 600000 ms",
            }
        },
        "failed": True,
    }
    updated = ops.apply_status(in_progress(), answer, NOW)
    assert updated is not None
    assert (updated["status"], updated["detail"]) == (
        "FAILED",
        "checkpoint 12 expired after 600000 ms",
    )


def test_a_request_the_control_plane_does_not_know_fails_other_errors_wait() -> None:
    failed = ops.apply_poll_error(in_progress(), 404, "savepoint request r-1 not found", NOW)
    assert failed is not None and failed["status"] == "FAILED"
    assert failed["detail"] == (
        "the control plane does not know this request: savepoint request r-1 not found"
    )
    assert ops.apply_poll_error(in_progress(), 401, "token missing", NOW) is None


def test_only_requests_in_progress_are_polled_by_index() -> None:
    done = {**in_progress(), "status": "COMPLETED"}
    config = ops.new_record(JOB, "config", "x", T0)
    records = [done, in_progress("restore"), config, in_progress("checkpoint")]
    assert [(i, r["kind"]) for i, r in ops.to_poll(records)] == [(1, "restore"), (3, "checkpoint")]


# ----------------------------------------------------------------------------- the log


def test_the_log_shows_this_jobs_operations_newest_first() -> None:
    first = ops.apply_status(
        in_progress(),
        {"status": {"id": "COMPLETED"}, "operation": {"location": "/sp/s-3", "checkpointId": 3}},
        T0 + 1500,
    )
    other_job = ops.new_record("other", "checkpoint", "Trigger checkpoint", T0 + 100)
    second = ops.new_record(
        JOB,
        "restore",
        "Restore checkpoint 3",
        T0 + 2000,
        request_id="r-2",
        warning="output will be produced again",
    )
    rows = ops.log_rows([first, other_job, second], JOB)  # type: ignore[list-item]
    assert rows == [
        {
            "kind": "restore",
            "status": "IN_PROGRESS",
            "label": "Restore checkpoint 3",
            "request_id": "r-2",
            "time": "2026-11-26 02:22:06.000",
            "took": None,
            "outcome": "waiting for the job…",
            "warning": "output will be produced again",
        },
        {
            "kind": "savepoint",
            "status": "COMPLETED",
            "label": "Savepoint into /sp",
            "request_id": "r-1",
            "time": "2026-11-26 02:22:04.000",
            "took": "1.50 s",
            "outcome": "savepoint 3 completed at /sp/s-3",
            "warning": None,
        },
    ]
    entries = ops.log_view(rows)
    props = [e.to_plotly_json()["props"] for e in entries]
    assert [(p["data-kind"], p["data-status"]) for p in props] == [
        ("restore", "IN_PROGRESS"),
        ("savepoint", "COMPLETED"),
    ]
    assert "savepoint 3 completed at /sp/s-3" in json.dumps(
        entries[1].to_plotly_json(), default=str
    )


def test_a_synchronous_change_shows_no_duration_and_older_entries_fold() -> None:
    records = [
        ops.new_record(JOB, "config", f"change {i}", T0 + i, status="COMPLETED", detail="ok")
        for i in range(5)
    ]
    rows = ops.log_rows(records, JOB)
    assert [(r["label"], r["took"]) for r in rows] == [
        ("change 4", None),
        ("change 3", None),
        ("change 2", None),
        ("change 1", None),
        ("change 0", None),
    ]
    entries = ops.log_view(rows, shown=3, limit=4)
    assert [e.to_plotly_json()["props"].get("data-kind") for e in entries[:3]] == ["config"] * 3
    folded = entries[3]
    assert isinstance(folded, html.Details)
    assert folded.children[0].children == "1 earlier operation (1 older not shown)"
    assert [e.children[2].children for e in folded.children[1:]] == ["change 1"]


def test_an_empty_log_says_so() -> None:
    (entry,) = ops.log_view([])
    assert isinstance(entry, html.Div)
    assert entry.children == "No operations sent from this browser session yet."
