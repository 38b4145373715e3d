"""The savepoints page: rows from ``GET /savepoints`` (location, size, job, when, restores)."""

from __future__ import annotations

from typing import Any

from sparkpoint_dashboard.app import page_title, render_page
from sparkpoint_dashboard.components import disposal
from sparkpoint_dashboard.pages import savepoints as page
from sparkpoint_dashboard.routing import Page, parse
from sparkpoint_dashboard.units import fmt_time

T0 = 1_764_123_691_559
SP = "file:///data/savepoints/savepoint-4f2a9c1e-4"


def entry(**overrides: Any) -> dict[str, Any]:
    return {
        "job-id": "job-1",
        "id": 4,
        "location": SP,
        "target-directory": "file:///data/savepoints",
        "state-size": 4096,
        "checkpointed-size": 2048,
        "trigger-timestamp": T0,
        "completion-timestamp": T0 + 300,
        "is-final": False,
        "restores": [],
        **overrides,
    }


def restore(request_id: str, job_id: str, status: str, **overrides: Any) -> dict[str, Any]:
    return {
        "request-id": request_id,
        "job-id": job_id,
        "status": status,
        "checkpoint-id": 4,
        "location": SP,
        "attempt": 2,
        "requested-at": T0 + 9000,
        "updated-at": T0 + 9500,
        "failure-cause": None,
        **overrides,
    }


def test_a_row_says_where_how_large_which_job_when_and_which_restores_used_it() -> None:
    row = page.savepoint_row(
        entry(
            restores=[
                restore("r-2", "job-2", "FAILED", **{"failure-cause": "files missing"}),
                restore("r-1", "job-1", "COMPLETED"),
            ]
        )
    )

    assert row["id"] == "job-1:4"
    assert (row["job"], row["job_href"]) == ("job-1", "/jobs/job-1")
    assert (row["savepoint"], row["savepoint_href"]) == ("#4", "/jobs/job-1/checkpoints/4")
    assert row["location"] == SP
    assert (row["size_bytes"], row["size"]) == (4096, "4.0 KiB")
    assert row["time"] == fmt_time(T0 + 300) and row["time_ms"] == T0 + 300
    assert row["restored"] == 2
    assert row["restores"].splitlines() == [
        f"{fmt_time(T0 + 9000)} UTC into job job-2: failed: files missing (request r-2)",
        f"{fmt_time(T0 + 9000)} UTC: restored as attempt 2 (request r-1)",
    ]


def test_a_final_savepoint_never_restored_says_so() -> None:
    row = page.savepoint_row(entry(**{"is-final": True}))
    assert row["savepoint"] == "#4 (final)"
    assert row["kind"] == "final savepoint (stop with savepoint)"
    assert (row["restored"], row["restores"]) == (0, "never restored")


def test_the_view_counts_savepoints_and_restored_ones_and_says_when_there_are_none() -> None:
    rows, note = page.savepoints_view(
        {"savepoints": [entry(), entry(id=9, restores=[restore("r", "job-1", "IN_PROGRESS")])]}
    )
    assert [r["id"] for r in rows] == ["job-1:4", "job-1:9"]
    assert note.children == "2 savepoints, 1 restored."
    assert "in progress" in rows[1]["restores"]

    rows, note = page.savepoints_view({"savepoints": [], "truncated": False})
    assert rows == [] and "No savepoints yet" in note.children


def test_the_page_has_its_route_title_and_layout() -> None:
    assert parse("/savepoints").page is Page.SAVEPOINTS
    assert page_title("/savepoints") == "Savepoints · Sparkpoint"
    assert "savepoints-grid" in str(render_page("/savepoints"))


def test_the_dispose_choices_are_the_listed_savepoints_by_location() -> None:
    other = entry(**{"job-id": "job-2", "id": 9, "location": None})  # no location: not offered
    assert disposal.dispose_options([entry(), other]) == [
        {"label": f"#4 of job-1 · {fmt_time(T0 + 300)} UTC · 4.0 KiB", "value": SP}
    ]
    assert disposal.confirm_text("#4 of job-1", SP) == (
        f"Dispose of savepoint #4 of job-1? Its directory {SP} is deleted, and no job can "
        "restore it any more. This cannot be undone."
    )


def test_a_disposal_says_what_it_deleted_or_that_it_was_gone() -> None:
    done = {"path": SP, "checkpoint-id": 4, "kind": "savepoint", "files": 5, "bytes": 4096}
    assert disposal.outcome(done) == f"Disposed of savepoint 4: deleted {SP} (5 files, 4.0 KiB)."
    assert disposal.outcome({**done, "files": 0, "bytes": 0}) == (
        f"Disposed of savepoint 4: its files at {SP} were already gone."
    )
    assert "savepoints-dispose-select" in str(render_page("/savepoints"))
