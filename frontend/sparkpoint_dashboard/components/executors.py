"""The job page's Spark executors: each executor of the job's Spark application, its host and
cores, and for a lost one Spark's reason (``worker lost: ...``), from ``GET /jobs/{id}``'s
``spark.executors`` (the driver lists them after every epoch).

Like Flink's TaskManagers view, it answers "where does this job run, and what did it lose".
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components.widgets import fetch, grid, section

COLUMNS: list[dict[str, Any]] = [
    {"field": "executor", "headerName": "Executor", "maxWidth": 120},
    {"field": "host", "headerName": "Host"},
    {"field": "cores", "headerName": "Cores", "maxWidth": 100},
    {"field": "state", "headerName": "State", "maxWidth": 120},
    {"field": "reason", "headerName": "Removed because", "flex": 2, "tooltipField": "reason"},
]
HELP = (
    "The executors of the job's Spark application and their hosts, as the driver listed them "
    "after its latest epoch; a lost executor keeps Spark's reason. Each epoch's tasks may run "
    "on any of them."
)


def view() -> html.Section:
    """The executors section of the job page (filled by :func:`register`'s callback)."""
    return section(
        "Spark executors",
        html.Div(id=ids.JOB_EXECUTORS_NOTE, className="help"),
        grid(ids.JOB_EXECUTORS_GRID, COLUMNS, row_id="params.data.id"),
        help_text=HELP,
    )


def executor_rows(spark: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The rows of the table from ``spark`` of ``GET /jobs/{id}``: active executors first."""
    rows = []
    for e in (spark or {}).get("executors") or []:
        active = bool(e.get("active"))
        rows.append(
            {
                "id": str(e.get("id")),
                "executor": str(e.get("id")),
                "host": e.get("host") or "",
                "cores": e.get("cores"),
                "state": "ACTIVE" if active else "LOST",
                "reason": "" if active else (e.get("remove-reason") or "removed"),
            }
        )
    return sorted(rows, key=lambda r: r["state"] != "ACTIVE")


def executors_note(spark: dict[str, Any] | None) -> str:
    """One line above the table: how many executors on how many hosts, or why none show."""
    listed = (spark or {}).get("executors")
    if listed is None:
        return (
            "Not reported: no epoch has completed on Spark yet (a failed one lists none), or "
            "the driver does not list its executors."
        )
    active = [e for e in listed if e.get("active")]
    if not listed:
        return "No executor: the job runs in the driver's own JVM (a local master)."
    hosts = {e.get("host") for e in active}
    lost = len(listed) - len(active)
    text = f"{len(active)} active on {len(hosts)} host{'s' if len(hosts) != 1 else ''}"
    return text + (f", {lost} lost" if lost else "")


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.JOB_EXECUTORS_GRID, "rowData"),
        Output(ids.JOB_EXECUTORS_NOTE, "children"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _executors(_n: int | None, route: dict[str, Any] | None, token: str | None) -> Any:
        if not route or route.get("page") != "job" or not route.get("job_id"):
            return no_update, no_update
        job, _error = fetch(lambda: client.job(route["job_id"], token))
        if not isinstance(job, dict):
            return no_update, no_update
        spark = job.get("spark")
        return executor_rows(spark), executors_note(spark)
