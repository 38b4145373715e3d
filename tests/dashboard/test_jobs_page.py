"""The jobs page's rows: status, uptime, restarts, last checkpoint age and outcome, with units."""

from __future__ import annotations

from typing import Any

from sparkpoint_dashboard.components import job_header, shell
from sparkpoint_dashboard.pages.jobs import job_row, jobs_rows, jobs_summary
from sparkpoint_dashboard.routing import Page, Route
from sparkpoint_dashboard.units import DASH

NOW = 1_795_659_800_000


def _job(job_id: str, **overrides: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "id": job_id,
        "name": "pv-count",
        "status": "RUNNING",
        "start-time": NOW - 125_000,
        "end-time": -1,
        "duration": 125_000,
        "attempt": 2,
        "restarts": 1,
        "last-checkpoint": {"id": 41, "status": "COMPLETED", "timestamp": NOW - 4_200},
        "records-per-second": 20_150.0,
    }
    job.update(overrides)
    return job


def test_a_running_job_row() -> None:
    row = job_row(_job("j1"), NOW)

    assert (row["job"], row["job_href"]) == ("pv-count · j1", "/jobs/j1")
    long_id = "ab8f944974e94db99f09605697ddb3c8"
    long_row = job_row(_job(long_id), NOW)
    assert (long_row["job"], long_row["job_href"]) == ("pv-count · ab8f9449…", f"/jobs/{long_id}")
    assert (row["status"], row["uptime"], row["uptime_ms"]) == ("RUNNING", "2 min 05 s", 125_000)
    assert (row["attempt"], row["restarts"]) == (2, 1)
    assert row["last_checkpoint"] == "#41 COMPLETED"
    assert row["last_checkpoint_href"] == "/jobs/j1/checkpoints/41"
    assert (row["last_checkpoint_age"], row["last_checkpoint_age_ms"]) == ("4.20 s ago", 4_200)
    assert row["throughput"] == "20.1 k records/s"
    assert row["status_style"]["color"] == "#15803d"


def test_a_finished_job_without_checkpoints_shows_no_throughput() -> None:
    row = job_row(_job("j2", status="FINISHED", **{"last-checkpoint": None}), NOW)

    assert row["last_checkpoint"] == "none yet"
    assert row["last_checkpoint_age"] == DASH
    assert row["throughput"] == DASH
    assert row["records_per_second"] is None


def test_a_failed_last_checkpoint_is_the_outcome_shown() -> None:
    failed = {"id": 7, "status": "FAILED", "timestamp": NOW - 61_000}
    row = job_row(_job("j3", **{"last-checkpoint": failed}), NOW)

    assert (row["last_checkpoint"], row["last_checkpoint_href"]) == (
        "#7 FAILED",
        "/jobs/j3/checkpoints/7",
    )
    assert row["last_checkpoint_age"] == "1 min 01 s ago"


def test_running_jobs_come_first_then_the_newest() -> None:
    jobs = [
        _job("old-done", status="FINISHED", **{"start-time": NOW - 900_000}),
        _job("old-run", **{"start-time": NOW - 500_000}),
        _job("new-run", **{"start-time": NOW - 1_000}),
        _job("new-failed", status="FAILED", **{"start-time": NOW - 2_000}),
    ]
    assert [r["id"] for r in jobs_rows(jobs, NOW)] == [
        "new-run",
        "old-run",
        "new-failed",
        "old-done",
    ]


def test_summary_counts_statuses() -> None:
    rows = jobs_rows([_job("a"), _job("b"), _job("c", status="FAILED")], NOW)
    assert jobs_summary(rows) == "3 jobs: 1 FAILED, 2 RUNNING"
    assert jobs_summary([]).startswith("No jobs yet")


def test_breadcrumbs_lead_back_to_the_jobs() -> None:
    route = Route(Page.CHECKPOINT, "j1", 12)
    assert job_header.breadcrumbs(route) == [
        ("Jobs", "/"),
        ("j1", "/jobs/j1"),
        ("Checkpoints", "/jobs/j1/checkpoints"),
        ("#12", None),
    ]
    assert job_header.breadcrumbs(Route(Page.JOB, "j1")) == [("Jobs", "/"), ("j1", None)]


def test_header_title_and_badge() -> None:
    title, badge = job_header.title_view(
        {"jid": "j1", "name": "pv-count", "state": "RESTARTING", "attempt": 3}
    )
    assert title == "pv-count (j1)"
    assert badge.children == "RESTARTING · attempt 3"
    assert badge.style == {"backgroundColor": "#d97706"}


def test_banner_shows_only_when_the_api_is_unreachable() -> None:
    assert shell.banner_view(None, "http://cp:8081", "x") == (None, {"display": "none"})
    children, style = shell.banner_view("cannot reach", "http://cp:8081", "2026-11-26 02:00:00.000")
    assert style == {"display": "block"}
    assert "cannot reach." in children[1]
    assert "2026-11-26 02:00:00.000" in children[1]
    assert "http://cp:8081" in children[1]
    assert shell.token_state("  ") == "no token: read-only"
    answered, _ = shell.banner_view(
        "the control plane answered HTTP 503: database unreachable",
        "http://cp:8081",
        None,
        answered=True,
    )
    assert answered[0].children == "The control plane cannot serve. "
    assert answered[1] == "the control plane answered HTTP 503: database unreachable. Retrying."


def test_banner_says_when_the_control_plane_is_behind_its_jobs_events() -> None:
    assert shell.banner_view(None, "http://cp:8081", "x", 120) == (None, {"display": "none"})
    children, style = shell.banner_view(None, "http://cp:8081", "x", 42_000)
    assert style == shell.WARNING_STYLE and style["display"] == "block"
    assert children[0].children == "The control plane is 42.0 s behind its jobs' events. "
    assert "none expires for that" in children[1]
    unreachable, _ = shell.banner_view("cannot reach", "http://cp:8081", None, 42_000)
    assert "cannot reach." in unreachable[1]  # unreachable says so first
    assert shell.token_state("t") == "token set"
