"""The jobs page (``/``): every job with its status, uptime, restarts and last checkpoint."""

from __future__ import annotations

import time
from typing import Any

from dash import Dash, Input, Output, State, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components.widgets import (
    fetch,
    grid,
    link_cell,
    link_column,
    message,
    route_store,
    section,
)
from sparkpoint_dashboard.routing import Route, checkpoint_path, job_path
from sparkpoint_dashboard.theme import status_color
from sparkpoint_dashboard.units import DASH, fmt_age, fmt_ms, fmt_rate

TERMINAL = {"FINISHED", "FAILED", "CANCELED"}

COLUMNS: list[dict[str, Any]] = [
    link_column("job", headerName="Job", minWidth=220),
    {
        "field": "status",
        "headerName": "Status",
        "cellStyle": {"function": "params.data.status_style"},
        "minWidth": 110,
    },
    {
        "field": "uptime",
        "headerName": "Uptime",
        "valueGetter": {"function": "params.data.uptime_ms"},
        "valueFormatter": {"function": "params.data.uptime"},
        "minWidth": 110,
    },
    {"field": "attempt", "headerName": "Attempt", "type": "numericColumn", "maxWidth": 110},
    {"field": "restarts", "headerName": "Restarts", "type": "numericColumn", "maxWidth": 110},
    link_column("last_checkpoint", headerName="Last checkpoint", minWidth=200),
    {
        "field": "last_checkpoint_age",
        "headerName": "Age",
        "valueGetter": {"function": "params.data.last_checkpoint_age_ms"},
        "valueFormatter": {"function": "params.data.last_checkpoint_age"},
        "minWidth": 120,
    },
    {
        "field": "throughput",
        "headerName": "Throughput",
        "valueGetter": {"function": "params.data.records_per_second"},
        "valueFormatter": {"function": "params.data.throughput"},
        "minWidth": 150,
    },
]


def short_id(job_id: str) -> str:
    """A long generated id cut to its first 8 characters (the full one is in the link)."""
    return job_id if len(job_id) <= 12 else job_id[:8] + "…"


def job_row(job: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """One row of the jobs table (values for sorting, texts with units for showing)."""
    job_id = str(job["id"])
    status = job.get("status") or "UNKNOWN"
    last = job.get("last-checkpoint") or None
    duration = job.get("duration")
    uptime_ms = duration if isinstance(duration, int) and duration >= 0 else None
    if last:
        cp_id = last.get("id")
        last_cell = link_cell(
            "last_checkpoint",
            f"#{cp_id} {last.get('status', '')}".strip(),
            checkpoint_path(job_id, cp_id),
        )
        last_ts = last.get("timestamp")
    else:
        last_cell, last_ts = {"last_checkpoint": "none yet"}, None
    rate = job.get("records-per-second")
    running = status not in TERMINAL
    return {
        "id": job_id,
        **link_cell("job", f"{job.get('name') or job_id} · {short_id(job_id)}", job_path(job_id)),
        "name": job.get("name") or job_id,
        "status": status,
        "status_style": {"color": status_color(status), "fontWeight": "600"},
        "uptime_ms": uptime_ms,
        "uptime": fmt_ms(uptime_ms) if uptime_ms is not None else DASH,
        "attempt": job.get("attempt"),
        "restarts": job.get("restarts"),
        **last_cell,
        "last_checkpoint_status": last.get("status") if last else None,
        "last_checkpoint_age_ms": (now_ms - last_ts) if last_ts else None,
        "last_checkpoint_age": fmt_age(now_ms, last_ts) if last_ts else DASH,
        "records_per_second": rate if running else None,
        "throughput": fmt_rate(rate) if running and rate is not None else DASH,
    }


def jobs_rows(jobs: list[dict[str, Any]], now_ms: int) -> list[dict[str, Any]]:
    """The jobs table: running jobs first, then the newest first."""
    rows = [job_row(j, now_ms) for j in jobs]
    starts = {str(j["id"]): j.get("start-time") or 0 for j in jobs}
    rows.sort(key=lambda r: (r["status"] in TERMINAL, -starts[r["id"]]))
    return rows


def jobs_summary(rows: list[dict[str, Any]]) -> str:
    """``"3 jobs: 2 RUNNING, 1 FINISHED"``."""
    if not rows:
        return (
            "No jobs yet: start one with `sparkpoint run <job.py> ...` against this control plane."
        )
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"{len(rows)} job{'s' if len(rows) != 1 else ''}: {parts}"


def layout(route: Route) -> html.Div:
    return html.Div(
        [
            html.H1("Jobs"),
            html.Div(id=ids.JOBS_MESSAGE),
            section(
                "Every job the control plane knows",
                grid(ids.JOBS_GRID, COLUMNS),
                help_text="Running jobs first. Click a job for its overview, a checkpoint for its "
                "per-operator timeline. The table refreshes by itself.",
            ),
            route_store(route),
        ]
    )


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.JOBS_GRID, "rowData"),
        Output(ids.JOBS_MESSAGE, "children"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _refresh(_n: int | None, _route: Any, token: str | None) -> tuple[Any, Any]:
        answer, error = fetch(lambda: client.jobs(token))
        if answer is None:
            return no_update, message(error) if error else no_update
        rows = jobs_rows(answer, int(time.time() * 1000))
        return rows, message(jobs_summary(rows), "info")
