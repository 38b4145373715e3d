"""The operators page (``/jobs/{id}/operators``): each operator's checkpoints over time.

A heat strip of operator by checkpoint that shows which operator holds checkpoints up (a click
on a cell opens that checkpoint's page, its per-subtask timeline), how often each operator was
the last to acknowledge, and one line per operator of its end-to-end, synchronous,
asynchronous and alignment durations over the checkpoints.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components import job_header
from sparkpoint_dashboard.components.charts import Figure, empty_figure
from sparkpoint_dashboard.components.operator_timeline import (
    COLOUR_BY_END_TO_END,
    COLOUR_BY_SHARE,
    clicked_checkpoint,
    heat_strip_figure,
    holdup_counts,
    metrics_figure,
)
from sparkpoint_dashboard.components.widgets import fetch, message, route_store, section
from sparkpoint_dashboard.routing import Route

TIMELINE_LIMIT = 100  # checkpoints shown


def holdups_view(answer: dict[str, Any]) -> Any:
    """``"count -> sink was the last to acknowledge in 87 of 100 checkpoints; ..."``."""
    counts = holdup_counts(answer)
    if not counts:
        return "No operator has acknowledged a checkpoint yet."
    total = sum(n for _, n in counts)
    parts: list[Any] = ["Last to acknowledge: "]
    for i, (name, n) in enumerate(counts):
        if i:
            parts.append(" · ")
        parts += [html.B(name), f" in {n} of {total} checkpoints"]
    return parts


def operators_views(
    answer: dict[str, Any], job_id: str, colour_by: str
) -> tuple[Figure, Any, Figure]:
    """Everything the page shows from the timelines: heat strip, hold-ups, metrics figure."""
    return (
        heat_strip_figure(answer, job_id, colour_by),
        holdups_view(answer),
        metrics_figure(answer),
    )


def layout(route: Route) -> html.Div:
    loading = empty_figure("Loading…")
    return html.Div(
        [
            job_header.view(route),
            html.Div(id=ids.OT_MESSAGE),
            section(
                "Which operator holds checkpoints up",
                dcc.RadioItems(
                    id=ids.OT_COLOUR_BY,
                    options=[
                        {"label": "colour by end-to-end duration", "value": COLOUR_BY_END_TO_END},
                        {"label": "colour by share of the checkpoint", "value": COLOUR_BY_SHARE},
                    ],
                    value=COLOUR_BY_END_TO_END,
                    inline=True,
                    className="colour-by",
                ),
                dcc.Graph(
                    id=ids.OT_HEAT_STRIP,
                    figure=loading,
                    # no toolbar: nothing to zoom, and it would cover the colour bar
                    config={"displaylogo": False, "displayModeBar": False},
                ),
                html.P(id=ids.OT_HOLDUPS, className="help"),
                help_text=f"The last {TIMELINE_LIMIT} checkpoints, oldest on the left; one row "
                "per operator. A cell is the operator's end-to-end duration in that checkpoint "
                "(trigger to its last subtask's acknowledgement); a blank cell, no "
                "acknowledgement (failed or in progress). The darkest cell of a column is the "
                "operator the checkpoint waited for. Hover a cell for its numbers; click it for "
                "that checkpoint's per-subtask timeline.",
            ),
            section(
                "Each operator over the checkpoints",
                dcc.Graph(
                    id=ids.OT_METRICS_CHART,
                    figure=loading,
                    config={"displaylogo": False, "displayModeBar": "hover"},
                ),
                help_text="Per operator, the slowest subtask's end-to-end, synchronous, "
                "asynchronous and alignment durations in each checkpoint. Click an operator in "
                "the legend to hide it in every chart; drag to zoom, double-click to reset.",
            ),
            route_store(route),
        ]
    )


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.OT_HEAT_STRIP, "figure"),
        Output(ids.OT_HOLDUPS, "children"),
        Output(ids.OT_METRICS_CHART, "figure"),
        Output(ids.OT_MESSAGE, "children"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        Input(ids.OT_COLOUR_BY, "value"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _refresh(
        _n: int | None, route: dict[str, Any] | None, colour_by: str | None, token: str | None
    ) -> tuple[Any, ...]:
        if not route or route.get("page") != "operators" or not route.get("job_id"):
            return (no_update,) * 4
        job_id = route["job_id"]
        answer, error = fetch(lambda: client.operator_timelines(job_id, TIMELINE_LIMIT, token))
        if answer is None:
            return (*(no_update,) * 3, message(error) if error else no_update)
        return (*operators_views(answer, job_id, colour_by or COLOUR_BY_END_TO_END), None)

    @app.callback(
        Output(ids.URL, "pathname", allow_duplicate=True),
        Input(ids.OT_HEAT_STRIP, "clickData"),
        State(ids.ROUTE, "data"),
        prevent_initial_call=True,
    )
    def _open_checkpoint(click_data: dict[str, Any] | None, route: dict[str, Any] | None) -> Any:
        return clicked_checkpoint(click_data, (route or {}).get("job_id")) or no_update
