"""The job page's Spark executors table: rows and the line above them from ``GET /jobs/{id}``'s
``spark.executors``, and its place on the job page."""

from __future__ import annotations

from typing import Any

from dash.development.base_component import Component

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.components.executors import executor_rows, executors_note
from sparkpoint_dashboard.pages import job
from sparkpoint_dashboard.routing import parse

LOST = "worker lost: 127.0.0.1:41235 got disassociated"
SPARK: dict[str, Any] = {
    "ui-url": None,
    "application-id": "app-20261126161038-0000",
    "executors": [
        {"id": "1", "host": "10.0.0.6", "cores": 2, "active": False, "remove-reason": LOST},
        {"id": "0", "host": "10.0.0.5", "cores": 2, "active": True, "remove-reason": None},
        {"id": "2", "host": "10.0.0.5", "cores": 2, "active": True, "remove-reason": None},
    ],
}


def test_active_executors_come_first_and_a_lost_one_shows_sparks_reason() -> None:
    rows = executor_rows(SPARK)

    assert [(r["executor"], r["host"], r["state"], r["reason"]) for r in rows] == [
        ("0", "10.0.0.5", "ACTIVE", ""),
        ("2", "10.0.0.5", "ACTIVE", ""),
        ("1", "10.0.0.6", "LOST", LOST),
    ]


def test_the_note_counts_active_executors_their_hosts_and_the_lost() -> None:
    assert executors_note(SPARK) == "2 active on 1 host, 1 lost"


def test_a_local_master_has_no_executor_and_an_older_driver_reports_none() -> None:
    assert executor_rows({"executors": []}) == []
    assert executors_note({"executors": []}).startswith("No executor: ")
    assert executor_rows({"executors": None}) == []
    assert executors_note({"executors": None}).startswith("Not reported: ")
    assert executors_note(None).startswith("Not reported: ")


def _ids(component: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(component, Component):
        component_id = getattr(component, "id", None)
        if isinstance(component_id, str):
            found.add(component_id)
        children = getattr(component, "children", None)
        for child in children if isinstance(children, list) else [children]:
            found |= _ids(child)
    return found


def test_the_job_page_shows_the_executors_table() -> None:
    layout = job.layout(parse("/jobs/abc"))
    assert {ids.JOB_EXECUTORS_GRID, ids.JOB_EXECUTORS_NOTE} <= _ids(layout)
