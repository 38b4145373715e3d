""" "Failures and restarts": requested restores and unexplained restarts beside the failures."""

from __future__ import annotations

from typing import Any

from sparkpoint_dashboard.components import restarts
from sparkpoint_dashboard.components.job_charts import restart_marks
from sparkpoint_dashboard.units import fmt_time

T0 = 1_764_123_691_559
SP = "file:///data/savepoints/savepoint-4f2a9c1e-7"


def restore(request_id: str, at: int, **overrides: Any) -> dict[str, Any]:
    return {
        "request-id": request_id,
        "job-id": "job-1",
        "status": "COMPLETED",
        "checkpoint-id": 7,
        "location": SP,
        "attempt": 3,
        "requested-at": at,
        "updated-at": at + 900,
        "failure-cause": None,
        **overrides,
    }


def test_a_requested_restore_is_a_restore_row_with_what_it_restored_and_its_outcome() -> None:
    rows = restarts.restore_rows(
        {
            "restores": [
                restore("r-2", T0 + 5000),
                restore(
                    "r-1",
                    T0,
                    status="FAILED",
                    location="file:///chk/job-1/chk-12",
                    **{"checkpoint-id": 12, "attempt": None, "failure-cause": "files missing"},
                ),
                restore("r-3", T0 + 9000, status="IN_PROGRESS", attempt=None),
            ]
        }
    )

    assert rows[0] == {
        "id": "restore-r-2",
        "timestamp": T0 + 5000,
        "time": fmt_time(T0 + 5000),
        "attempt": 2,
        "kind": "RESTORE (requested)",
        "task": "the operator",
        "epoch": None,
        "cause": f"restore of savepoint 7 at {SP} requested (request r-2)",
        "decision": "restored: the job runs again as attempt 3",
        "restore": True,
    }
    assert rows[1]["cause"].startswith("restore of checkpoint 12 at file:///chk/job-1/chk-12")
    assert rows[1]["decision"] == "restore failed: files missing"
    assert rows[1]["attempt"] is None
    assert rows[2]["decision"] == "restoring…"
    assert restarts.restore_rows({}) == []


def test_restarts_without_a_failure_or_restore_behind_them_are_listed_too() -> None:
    job = {
        "status-history": [
            {"timestamp": T0, "status": "RUNNING", "attempt": 1, "cause": None},
            # restarted by a failure 1 s earlier: that failure's row stands for it
            {"timestamp": T0 + 10_000, "status": "RESTARTING", "attempt": 1, "cause": "boom"},
            # a requested restore 200 ms earlier
            {
                "timestamp": T0 + 20_200,
                "status": "RESTARTING",
                "attempt": 2,
                "cause": "restore of savepoint 7 requested",
            },
            # nothing explains this one
            {"timestamp": T0 + 40_000, "status": "RESTARTING", "attempt": 3, "cause": "lost"},
        ]
    }
    failure = {"id": "f", "timestamp": T0 + 9_000, "kind": "TASK_FAILURE"}
    requested = restarts.restore_rows({"restores": [restore("r-1", T0 + 20_000)]})

    rows = restarts.failures_and_restarts(job, [failure], requested)

    assert [r["kind"] for r in rows] == ["RESTART", "RESTORE (requested)", "TASK_FAILURE"]
    assert rows[0]["cause"] == "lost" and rows[0]["attempt"] == 3
    # Three restarts, three rows: never "No Rows" beside a restart count.
    assert len(rows) == sum(h["status"] == "RESTARTING" for h in job["status-history"])


def test_without_the_job_only_failures_and_restores_show_newest_first() -> None:
    failure = {"id": "f", "timestamp": T0 + 30_000, "kind": "TASK_FAILURE"}
    requested = restarts.restore_rows({"restores": [restore("r-1", T0)]})

    assert [r["id"] for r in restarts.failures_and_restarts(None, [failure], requested)] == [
        "f",
        "restore-r-1",
    ]


def test_restart_marks_call_a_requested_restore_a_restore() -> None:
    job = {
        "status-history": [
            {"timestamp": T0, "status": "RESTARTING", "attempt": 1, "cause": "boom"},
            {
                "timestamp": T0 + 1,
                "status": "RESTARTING",
                "attempt": 2,
                "cause": "restore of checkpoint 4 requested",
            },
        ]
    }
    # A RESTARTING transition carries the attempt that ended (as the control plane records
    # it); the mark names the attempt the restart starts.
    assert restart_marks(job) == [
        (T0, "restart → attempt 2"),
        (T0 + 1, "restore → attempt 3"),
    ]
