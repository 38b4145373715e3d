"""The savepoints page (``/savepoints``): every job's completed savepoints, where each one is,
its size, its job, when it was taken, and which restores used it (``GET /savepoints``).

Flink's web UI shows savepoints only inside one job's checkpoint history; an operator who
wants to restore or clean up asks "which savepoints exist, and are any still in use?", so the
page lists them across jobs, newest first, with the restores that read each one.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient, ApiRequestError, ApiUnreachableError
from sparkpoint_dashboard.components import disposal
from sparkpoint_dashboard.components.widgets import (
    grid,
    link_cell,
    link_column,
    message,
    route_store,
    section,
)
from sparkpoint_dashboard.routing import Route, checkpoint_path, job_path
from sparkpoint_dashboard.units import DASH, fmt_bytes, fmt_time

LIMIT = 500  # savepoints listed, newest first

COLUMNS: list[dict[str, Any]] = [
    {
        "field": "time",
        "headerName": "Taken (UTC)",
        "minWidth": 190,
        "maxWidth": 210,
        "sort": "desc",
        "valueGetter": {"function": "params.data.time_ms"},
        "valueFormatter": {"function": "params.data.time"},
        "tooltipField": "time",
    },
    link_column("job", headerName="Job", minWidth=150, tooltipField="job", filter=True),
    link_column("savepoint", headerName="Savepoint", maxWidth=130, tooltipField="kind"),
    {
        "field": "location",
        "headerName": "Location",
        "minWidth": 260,
        "flex": 2,
        "tooltipField": "location",
    },
    {
        "field": "size",
        "headerName": "Size",
        "type": "numericColumn",
        "maxWidth": 120,
        "valueGetter": {"function": "params.data.size_bytes"},
        "valueFormatter": {"function": "params.data.size"},
        "tooltipField": "size_detail",
    },
    {
        "field": "restored",
        "headerName": "Restores",
        "type": "numericColumn",
        "maxWidth": 110,
    },
    {
        "field": "restores",
        "headerName": "Used by restores",
        "minWidth": 380,
        "flex": 3,
        "wrapText": True,
        "autoHeight": True,
        "cellStyle": {"whiteSpace": "pre-wrap", "lineHeight": "1.4"},
        "tooltipField": "restores",
    },
]


def restore_text(restore: dict[str, Any], savepoint_job: str) -> str:
    """One restore that used a savepoint: when, into which job (when another), its outcome."""
    when = f"{fmt_time(restore.get('requested-at'))} UTC"
    job = restore.get("job-id")
    into = f" into job {job}" if job and job != savepoint_job else ""
    status = restore.get("status")
    if status == "COMPLETED":
        attempt = restore.get("attempt")
        outcome = f"restored as attempt {attempt}" if attempt else "restored"
    elif status == "FAILED":
        outcome = f"failed: {restore.get('failure-cause') or 'no cause given'}"
    else:
        outcome = "in progress"
    return f"{when}{into}: {outcome} (request {restore.get('request-id')})"


def savepoint_row(entry: dict[str, Any]) -> dict[str, Any]:
    """One row: plain texts (a job's name is never markup) and sortable values."""
    job_id = str(entry.get("job-id"))
    number = int(entry["id"])
    restores = entry.get("restores") or []
    size = entry.get("state-size")
    kind = "final savepoint (stop with savepoint)" if entry.get("is-final") else "savepoint"
    return {
        "id": f"{job_id}:{number}",
        "time_ms": entry.get("completion-timestamp") or entry.get("trigger-timestamp"),
        "time": fmt_time(entry.get("completion-timestamp") or entry.get("trigger-timestamp")),
        **link_cell("job", job_id, job_path(job_id)),
        **link_cell(
            "savepoint",
            f"#{number}{' (final)' if entry.get('is-final') else ''}",
            checkpoint_path(job_id, number),
        ),
        "kind": kind,
        "location": entry.get("location") or DASH,
        "size_bytes": size,
        "size": fmt_bytes(size),
        "size_detail": f"{fmt_bytes(size)} of state; "
        f"{fmt_bytes(entry.get('checkpointed-size'))} written by this savepoint",
        "restored": len(restores),
        "restores": "\n".join(restore_text(r, job_id) for r in restores) or "never restored",
    }


def savepoints_view(answer: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """The rows and the line above them (how many, and whether older ones were left out)."""
    entries = answer.get("savepoints") or []
    if not entries:
        return [], message(
            "No savepoints yet: trigger one from a job's page, or with "
            "`sparkpoint savepoint JOB` or `POST /jobs/{id}/savepoints`.",
            "info",
        )
    used = sum(1 for e in entries if e.get("restores"))
    more = " (the newest; older ones exist)" if answer.get("truncated") else ""
    text = f"{len(entries)} savepoint{'s' if len(entries) != 1 else ''}{more}, {used} restored."
    return [savepoint_row(e) for e in entries], message(text, "info")


def layout(route: Route) -> html.Div:
    return html.Div(
        [
            html.H1("Savepoints"),
            html.Div(id=ids.SP_MESSAGE),
            section(
                "Every job's savepoints",
                grid(ids.SP_GRID, COLUMNS),
                help_text="Completed savepoints, newest first: where each is, its size, its "
                "job and when it was taken, and the restores that used it (a savepoint "
                "restored into another job shows that job). Nothing deletes a savepoint by "
                "itself: dispose of one below (or `sparkpoint savepoint dispose PATH`) once "
                "no job needs it; its directory is deleted and the control plane forgets it. "
                "A running job's newest restore point is refused until a later checkpoint "
                "completes.",
            ),
            section("Dispose of a savepoint", disposal.controls()),
            route_store(route),
        ]
    )


def register(app: Dash, client: ApiClient) -> None:
    disposal.register(app, client)

    @app.callback(
        Output(ids.SP_GRID, "rowData"),
        Output(ids.SP_MESSAGE, "children"),
        Output(ids.SP_DISPOSE_SELECT, "options"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _refresh(_n: int | None, route: dict[str, Any] | None, token: str | None) -> Any:
        if not route or route.get("page") != "savepoints":
            return no_update, no_update, no_update
        try:
            answer = client.call("GET", "/savepoints", token, params={"limit": LIMIT})
        except ApiUnreachableError:
            return no_update, no_update, no_update
        except ApiRequestError as err:
            refused = message(f"The control plane refused the list: {err.message}")
            return no_update, refused, no_update
        listed = answer if isinstance(answer, dict) else {}
        rows, note = savepoints_view(listed)
        return rows, note, disposal.dispose_options(listed.get("savepoints") or [])
