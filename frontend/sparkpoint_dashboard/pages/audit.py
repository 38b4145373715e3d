"""The audit log page (``/audit``): every mutating call, who made it and how it ended.

``GET /audit`` needs an admin's token: the page shows the log when the token typed in the
header is one, and otherwise says which role it needs (the API's 401 or 403 message). Every
value, a token's name above all, is shown as text.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient, ApiRequestError, ApiUnreachableError
from sparkpoint_dashboard.components.widgets import (
    grid,
    link_cell,
    link_column,
    message,
    route_store,
    section,
)
from sparkpoint_dashboard.routing import Route, job_path
from sparkpoint_dashboard.units import DASH, fmt_time

PAGE_SIZE = 200
NEEDS_ADMIN = "The audit log needs a token with the role admin: type one in the header."

COLUMNS: list[dict[str, Any]] = [
    {
        "field": "time",
        "headerName": "Time (UTC)",
        "minWidth": 190,
        "sort": "desc",
        "valueGetter": {"function": "params.data.time_ms"},
        "valueFormatter": {"function": "params.data.time"},
    },
    {"field": "who", "headerName": "Who", "minWidth": 180},
    {"field": "role", "headerName": "Role", "maxWidth": 110},
    {"field": "call", "headerName": "Call", "minWidth": 260},
    link_column("job", headerName="Job", minWidth=140),
    {
        "field": "status",
        "headerName": "Outcome",
        "type": "numericColumn",
        "maxWidth": 110,
        "cellStyle": {"function": "params.data.status_style"},
    },
    {"field": "request", "headerName": "Request body", "minWidth": 220, "tooltipField": "request"},
    {"field": "request_id", "headerName": "Request id", "minWidth": 140},
]


def audit_row(entry: dict[str, Any]) -> dict[str, Any]:
    """One row of the audit table: plain texts (a name is never markup) and sortable values."""
    status = int(entry.get("status") or 0)
    token_id = entry.get("token-id")
    name = str(entry.get("token-name") or "anonymous")
    job_id = entry.get("job-id")
    job = link_cell("job", str(job_id), job_path(str(job_id))) if job_id else {"job": DASH}
    ok = status < 400
    return {
        "id": str(entry["id"]),  # AG Grid wants row ids as strings
        "time_ms": entry.get("time"),
        "time": fmt_time(entry.get("time")),
        "who": f"{name} ({token_id})" if token_id else name,
        "role": entry.get("role") or DASH,
        "call": f"{entry.get('method', '')} {entry.get('path', '')}",
        **job,
        "status": status,
        "status_style": {"color": "#15803d" if ok else "#b91c1c", "fontWeight": "600"},
        "request": entry.get("request") or DASH,
        "request_id": entry.get("request-id") or DASH,
    }


def audit_view(
    token: str | None, answer: dict[str, Any] | None, error: ApiRequestError | None
) -> tuple[list[dict[str, Any]], Any, bool]:
    """What the page shows: ``(rows, notice, show_grid)``.

    No token: which role is needed. A 401 or 403: the API's message (it names the role
    needed and the token's own). Otherwise the rows, newest first, and how many there are.
    """
    if not (token and token.strip()):
        return [], message(NEEDS_ADMIN, "info"), False
    if error is not None:
        return (
            [],
            message(
                f"{error.message}. {NEEDS_ADMIN}" if error.status in (401, 403) else error.message
            ),
            False,
        )
    entries = (answer or {}).get("entries", [])
    total = (answer or {}).get("total", len(entries))
    shown = f"the newest {len(entries)} of {total}" if total > len(entries) else f"{total}"
    summary = f"{shown} mutating call{'s' if total != 1 else ''}, allowed or refused."
    return [audit_row(e) for e in entries], message(summary.capitalize(), "info"), True


# Hidden without taking the grid's width away: AG Grid sizes its columns to fit whenever its
# data or size changes, and warns (a console warning) when it finds a zero width.
HIDDEN = {"visibility": "hidden", "height": 0, "overflow": "hidden"}
SHOWN: dict[str, Any] = {}


def layout(route: Route) -> html.Div:
    return html.Div(
        [
            html.H1("Audit log"),
            html.Div(id=ids.AUDIT_MESSAGE),
            section(
                "Every mutating call",
                grid(ids.AUDIT_GRID, COLUMNS),
                help_text="Who (the token's name and id; anonymous without one), what, when and "
                "the outcome of every checkpoint, savepoint, stop, restore, cancel, "
                "configuration and token call, refused ones too. Newest first.",
                id=ids.AUDIT_BODY,
                style=HIDDEN,
            ),
            route_store(route),
        ]
    )


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.AUDIT_GRID, "rowData"),
        Output(ids.AUDIT_MESSAGE, "children"),
        Output(ids.AUDIT_BODY, "style"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        Input(ids.TOKEN_INPUT, "value"),
    )
    def _refresh(_n: int | None, _route: Any, token: str | None) -> tuple[Any, ...]:
        answer, error = None, None
        if token and token.strip():
            try:
                answer = client.audit(token, PAGE_SIZE)
            except ApiUnreachableError:
                return no_update, no_update, no_update
            except ApiRequestError as err:
                error = err
        rows, notice, show = audit_view(token, answer, error)
        return rows, notice, SHOWN if show else HIDDEN
