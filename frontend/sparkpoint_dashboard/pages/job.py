"""A job's overview (``/jobs/{id}``): status, uptime, restarts, throughput, failures, the graph
and the forms that change its checkpointing and restart strategy."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient, ApiRequestError, ApiUnreachableError
from sparkpoint_dashboard.components import config_forms, executors, job_header, restarts
from sparkpoint_dashboard.components.job_cards import (
    CHECKPOINTS_LIMIT,
    TERMINAL,
    checkpoints_card,
    job_cards,
)
from sparkpoint_dashboard.components.job_charts import (
    STATUS_HEIGHT,
    restart_marks,
    status_bands,
    status_figure,
    throughput_figure,
)
from sparkpoint_dashboard.components.widgets import fetch, grid, route_store, section
from sparkpoint_dashboard.routing import Route
from sparkpoint_dashboard.theme import status_color
from sparkpoint_dashboard.units import (
    DASH,
    fmt_ms,
    fmt_time,
)

THROUGHPUT_LIMIT = 600  # heartbeats charted (one per epoch)

STATUS_COLUMNS: list[dict[str, Any]] = [
    {
        "field": "time",
        "headerName": "Time (UTC)",
        "sort": "desc",
        "minWidth": 130,
        "valueGetter": {"function": "params.data.seq"},  # ties in time keep their order
        "valueFormatter": {"function": "params.data.clock"},
        "tooltipField": "time",
    },
    {
        "field": "status",
        "headerName": "Status",
        "minWidth": 115,
        "cellStyle": {"function": "params.data.status_style"},
        "tooltipField": "transition",
    },
    {
        "field": "lasted",
        "headerName": "Lasted",
        "minWidth": 140,
        "valueGetter": {"function": "params.data.lasted_ms"},
        "valueFormatter": {"function": "params.data.lasted"},
        "tooltipField": "lasted",
    },
    {"field": "attempt", "headerName": "Attempt", "type": "numericColumn", "minWidth": 90},
    {"field": "cause", "headerName": "Cause", "minWidth": 120, "flex": 2, "tooltipField": "cause"},
]
EXCEPTION_COLUMNS: list[dict[str, Any]] = [
    {
        "field": "time",
        "headerName": "Time (UTC)",
        "sort": "desc",
        "minWidth": 190,
        "maxWidth": 210,
        "valueGetter": {"function": "params.data.timestamp"},
        "valueFormatter": {"function": "params.data.time"},
    },
    {"field": "attempt", "headerName": "Attempt", "type": "numericColumn", "maxWidth": 100},
    {
        "field": "kind",
        "headerName": "Kind",
        "minWidth": 140,
        "maxWidth": 200,
        "tooltipField": "kind",
    },
    {
        "field": "task",
        "headerName": "Operator / subtask",
        "minWidth": 150,
        "maxWidth": 200,
        "tooltipField": "task",
    },
    {"field": "epoch", "headerName": "Epoch", "type": "numericColumn", "maxWidth": 90},
    {
        "field": "cause",
        "headerName": "Cause",
        "minWidth": 260,
        "flex": 3,
        "wrapText": True,
        "autoHeight": True,
        "cellStyle": {"whiteSpace": "pre-wrap", "lineHeight": "1.4"},
    },
    {
        "field": "decision",
        "headerName": "Restart strategy's decision",
        "minWidth": 240,
        "flex": 2,
        "wrapText": True,
        "autoHeight": True,
        "cellStyle": {"lineHeight": "1.4"},
    },
]


# ----------------------------------------------------------------------------- shaping answers


def not_found_text(job_id: str, status: int, error: str) -> str:
    """What the page says when the job cannot be shown."""
    if status == 404:
        return (
            f"Job {job_id} is not known to the control plane ({error}). "
            "It may have been started against another control plane."
        )
    return f"Job {job_id} cannot be shown: the control plane answered HTTP {status}: {error}"


def status_rows(bands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transitions table: time, status, from, how long it lasted, attempt, cause."""
    rows = []
    for i, b in enumerate(bands):
        last = i == len(bands) - 1
        lasted_ms = b["end"] - b["start"]
        rows.append(
            {
                "id": f"{b['start']}-{i}",
                "seq": i,
                "timestamp": b["start"],
                "time": fmt_time(b["start"]),
                "clock": fmt_time(b["start"])[11:],  # the date is on the timeline above
                "status": b["status"],
                "status_style": {"color": status_color(b["status"]), "fontWeight": "600"},
                "previous": b["previous"] or DASH,
                "transition": f"{b['previous'] or 'start'} → {b['status']}",
                "lasted_ms": lasted_ms,
                "lasted": _lasted(lasted_ms, last, b["status"]),
                "attempt": b["attempt"],
                "cause": b["cause"] or DASH,
            }
        )
    return rows


def _lasted(ms: float, last: bool, status: str) -> str:
    """How long a status lasted; the job's current one is still going (``so far``), unless
    the job ended in it: that one lasts for good."""
    if not last:
        return fmt_ms(ms)
    return "final" if status in TERMINAL else f"{fmt_ms(ms)} so far"


def exception_rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Flink's ``exceptionHistory`` as table rows."""
    entries = (answer.get("exceptionHistory") or {}).get("entries") or []
    seen: Counter[str] = Counter()
    rows = []
    for e in entries:
        key = f"{e.get('timestamp')}-{e.get('exceptionName')}"
        seen[key] += 1
        rows.append(
            {
                "id": f"{key}-{seen[key]}",
                "timestamp": e.get("timestamp"),
                "time": fmt_time(e.get("timestamp")),
                "attempt": e.get("attempt"),
                "kind": e.get("exceptionName") or DASH,
                "task": e.get("taskName") or "the job",
                "epoch": e.get("epoch"),
                "cause": e.get("stacktrace") or DASH,
                "decision": e.get("action") or DASH,
            }
        )
    return rows


def vertex_order(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The vertices from sources to sinks (edges' order; unconnected ones last)."""
    vertices = {v["id"]: v for v in job.get("vertices") or []}
    incoming: Counter[str] = Counter(e["target"] for e in job.get("edges") or [])
    ordered: list[dict[str, Any]] = []
    ready = [vid for vid in vertices if incoming[vid] == 0]
    while ready:
        vid = ready.pop(0)
        ordered.append(vertices[vid])
        for e in job.get("edges") or []:
            if e["source"] == vid:
                incoming[e["target"]] -= 1
                if incoming[e["target"]] == 0:
                    ready.append(e["target"])
    ordered += [v for vid, v in vertices.items() if v not in ordered]
    return ordered


def vertices_view(job: dict[str, Any]) -> list[Any]:
    """The graph, compact: one box per vertex (tasks of chained operators) with its
    parallelism, arrows between them."""
    ordered = vertex_order(job)
    if not ordered:
        return [html.Span("The job has not registered its graph yet.", className="help")]
    edges = job.get("edges") or []
    chain = all(
        any(e["source"] == a["id"] and e["target"] == b["id"] for e in edges)
        for a, b in pairwise(ordered)
    )
    boxes: list[Any] = []
    for i, v in enumerate(ordered):
        if i:
            boxes.append(html.Span("→" if chain else "·", className="vertex-arrow"))
        operators = v.get("operators") or [v["id"]]
        boxes.append(
            html.Div(
                [
                    html.Strong(v.get("name") or v["id"]),
                    html.Div(
                        f"parallelism {v.get('parallelism')} · max {v.get('maxParallelism')}",
                        className="vertex-detail",
                    ),
                    html.Div(
                        f"chained: {' → '.join(operators)}"
                        if len(operators) > 1
                        else f"uid {v['id']}",
                        className="vertex-detail",
                    ),
                ],
                className="vertex",
                **{"data-vertex": v["id"]},
            )
        )
    if not chain and edges:
        text = ", ".join(f"{e['source']} → {e['target']}" for e in edges)
        boxes.append(html.Div(f"edges: {text}", className="help"))
    return boxes


# ----------------------------------------------------------------------------- layout


def layout(route: Route) -> html.Div:
    throughput_help = (
        "Records per second per epoch (left) and the records the sources hold but have not "
        "been read yet (right). Dashed lines: restarts."
    )
    return html.Div(
        [
            job_header.view(route),
            html.Div(id=ids.JOB_MESSAGE),
            html.Div(
                [
                    html.Div(id=ids.JOB_CARDS, className="stats"),
                    html.Div(
                        [
                            section(
                                "Throughput",
                                dcc.Graph(
                                    id=ids.JOB_THROUGHPUT_CHART,
                                    config={"displaylogo": False},
                                    style={"height": "300px"},
                                ),
                                help_text=throughput_help,
                            ),
                            section(
                                "Status history",
                                dcc.Graph(
                                    id=ids.JOB_STATUS_CHART,
                                    config={"displaylogo": False},
                                    style={"height": f"{STATUS_HEIGHT}px"},
                                ),
                                grid(ids.JOB_STATUS_GRID, STATUS_COLUMNS, height="180px"),
                                help_text="Every status the job went through, newest first in the "
                                "table, with the cause and the job attempt.",
                            ),
                        ],
                        className="grid-2",
                    ),
                    section(
                        "Job graph",
                        html.Div(id=ids.JOB_VERTICES, className="vertices"),
                        help_text="Tasks from sources to sinks; operators chained into one task "
                        "run and acknowledge checkpoints together.",
                    ),
                    section(
                        "Failures and restarts",
                        grid(ids.JOB_EXCEPTIONS_GRID, EXCEPTION_COLUMNS),
                        help_text="Each failure, restore and restart, newest first: where it "
                        "happened, its cause and what the restart strategy decided; a restore "
                        "an operator requested shows as RESTORE (requested).",
                    ),
                    executors.view(),
                    html.H2("Configuration", className="area-title"),
                    config_forms.view(),
                ],
                id=ids.JOB_BODY,
            ),
            route_store(route),
        ]
    )


# ----------------------------------------------------------------------------- callbacks


def register(app: Dash, client: ApiClient) -> None:
    executors.register(app, client)

    @app.callback(
        Output(ids.JOB_CARDS, "children"),
        Output(ids.JOB_STATUS_CHART, "figure"),
        Output(ids.JOB_STATUS_GRID, "rowData"),
        Output(ids.JOB_THROUGHPUT_CHART, "figure"),
        Output(ids.JOB_VERTICES, "children"),
        Output(ids.JOB_MESSAGE, "children"),
        Output(ids.JOB_BODY, "style"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _refresh(_n: int | None, route: dict[str, Any] | None, token: str | None) -> Any:
        unchanged = (no_update,) * 7
        if not route or route.get("page") != "job" or not route.get("job_id"):
            return unchanged
        job_id = route["job_id"]
        try:
            job = client.job(job_id, token)
        except ApiUnreachableError:
            return unchanged
        except ApiRequestError as err:
            text = not_found_text(job_id, err.status, err.message)
            notice = html.Div(
                [text, " ", dcc.Link("See all jobs.", href="/")], className="notice notice-error"
            )
            return (*(no_update,) * 5, notice, {"display": "none"})
        samples, _error = fetch(lambda: client.throughput(job_id, THROUGHPUT_LIMIT, token))
        samples = samples if isinstance(samples, list) else []
        checkpoints, _error = fetch(lambda: client.checkpoints(job_id, CHECKPOINTS_LIMIT, token))
        bands = status_bands(job)
        return (
            [
                *job_cards(job, samples),
                checkpoints_card(checkpoints, int(job.get("now") or 0), job),
            ],
            status_figure(bands),
            status_rows(bands),
            throughput_figure(samples, restart_marks(job)),
            vertices_view(job),
            None,
            {},
        )

    @app.callback(
        Output(ids.JOB_EXCEPTIONS_GRID, "rowData"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _exceptions(_n: int | None, route: dict[str, Any] | None, token: str | None) -> Any:
        if not route or route.get("page") != "job" or not route.get("job_id"):
            return no_update
        job_id = route["job_id"]
        answer, _error = fetch(lambda: client.exceptions(job_id, token))
        if answer is None:
            return no_update
        requested, _error = fetch(lambda: restarts.fetch_restores(client, job_id, token))
        job, _error = fetch(lambda: client.job(job_id, token))
        return restarts.failures_and_restarts(
            job, exception_rows(answer), restarts.restore_rows(requested or {})
        )
