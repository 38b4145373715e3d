"""One checkpoint's page (``/jobs/{id}/checkpoints/{n}``): its summary and failure, the operators,
the per-subtask timeline with stragglers, the state handles and the Spark jobs of its epoch."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components import job_header
from sparkpoint_dashboard.components.charts import empty_figure, failed_after, type_label
from sparkpoint_dashboard.components.spark_links import spark_link_view
from sparkpoint_dashboard.components.state_handles import HANDLE_COLUMNS, handle_rows
from sparkpoint_dashboard.components.timeline import (
    Straggler,
    find_stragglers,
    subtask_phases,
    timeline_figure,
)
from sparkpoint_dashboard.components.widgets import (
    badge,
    fetch,
    grid,
    message,
    number_column,
    route_store,
    section,
    stat,
)
from sparkpoint_dashboard.routing import Route
from sparkpoint_dashboard.spark_ui import SparkUi, settled
from sparkpoint_dashboard.theme import status_color
from sparkpoint_dashboard.units import DASH, fmt_age, fmt_bytes, fmt_ms, fmt_time

TERMINAL = {"COMPLETED", "FAILED"}


OPERATOR_COLUMNS: list[dict[str, Any]] = [
    {"field": "operator", "headerName": "Operator", "minWidth": 180, "tooltipField": "id"},
    {
        "field": "status",
        "headerName": "Status",
        "maxWidth": 140,
        "cellStyle": {"function": "params.data.status_style"},
    },
    number_column("acknowledged", "Acknowledged", maxWidth=140),
    number_column("end_to_end_duration", "End-to-end (slowest)"),
    number_column("checkpointed_size", "Checkpointed"),
    number_column("state_size", "State size"),
    number_column("alignment_buffered", "Align. buffered"),
    {"field": "stragglers", "headerName": "Stragglers", "type": "numericColumn", "maxWidth": 120},
]
PHASE_HELP = [
    (
        "start delay",
        "from the trigger until the first barrier reached the subtask (on Spark: "
        "until the epoch carrying the barrier got that far through its input).",
    ),
    (
        "alignment",
        "from the first to the last barrier of the subtask's input channels; in "
        "exactly-once mode, records of channels whose barrier already came are held back "
        "(buffered) meanwhile.",
    ),
    ("synchronous", "copying or freezing the state: the only part that holds up processing."),
    ("asynchronous", "writing the snapshot to checkpoint storage while processing goes on."),
    (
        "acknowledged",
        "the tick: when the subtask reported; end-to-end runs from the trigger to here.",
    ),
]
ALIGNMENT_ON_SPARK = (
    "Alignment on Spark is not back-pressure. Spark's shuffle is blocking: a keyed subtask starts "
    "only once all of its input exists, and then reads it at once. A long alignment therefore "
    "means skewed input or the order the subtask reads its channels in, not a slow network or "
    "a slow consumer as it would in Flink."
)


# ----------------------------------------------------------------------------- plain functions


def not_found_text(job_id: str, checkpoint_id: int, error: str) -> str:
    """The message for a checkpoint the API does not know (or any other error), naming the
    job and the checkpoint (the API's message usually does already)."""
    if job_id in error and str(checkpoint_id) in error:
        return f"{error[:1].upper()}{error[1:]}."
    return f"Cannot show checkpoint {checkpoint_id} of job {job_id}: {error}"


def timeline_note(cp: dict[str, Any]) -> str | None:
    """What the timeline must say about the checkpoint as a whole: that it failed."""
    if cp.get("status") != "FAILED":
        return None
    return (
        f"checkpoint FAILED ({cp.get('failure_reason') or 'reason unknown'}): snapshots discarded"
    )


def _or_dash(value: Any) -> str:
    return DASH if value is None else str(value)


def output_text(cp: dict[str, Any], now_ms: int) -> str | None:
    """Whether the job's sinks committed a completed checkpoint's output, and when (None: the
    checkpoint did not complete)."""
    last_ack, at = cp.get("latest_ack_timestamp"), cp.get("commit_timestamp")
    if cp.get("status") != "COMPLETED":
        return None
    if not cp.get("committed"):
        waited = f" {fmt_ms(max(0, now_ms - last_ack))}" if last_ack else ""
        return f"output NOT committed: waiting{waited} for the job's sinks"
    if at is None:
        return "output committed"
    if last_ack is None:
        return f"output committed at {fmt_time(at)}"
    return f"output committed {fmt_ms(max(0, at - last_ack))} later"


def summary_cards(cp: dict[str, Any], now_ms: int) -> list[Any]:
    """The checkpoint's numbers: status, trigger time, duration, sizes, acknowledgements,
    attempt and epoch (the end-to-end card also says whether the output was committed), then
    its path and whether it is still retained."""
    status = cp.get("status") or "UNKNOWN"
    trigger = cp.get("trigger_timestamp")
    e2e = cp.get("end_to_end_duration")
    if e2e is None and status == "IN_PROGRESS" and trigger:
        duration, detail = fmt_ms(max(0, now_ms - trigger)), "so far"
    elif e2e is None and status == "FAILED":
        ran = failed_after(cp)
        if ran is None:
            duration, detail = DASH, "failed before completing"
        else:
            duration, detail = fmt_ms(ran), "trigger to failure"
    else:
        duration, detail = fmt_ms(e2e), "trigger to last ack"
        output = output_text(cp, now_ms)
        detail = detail if output is None else f"{detail}; {output}"
    n, m = cp.get("num_acknowledged_subtasks"), cp.get("num_subtasks")
    day, _, clock = fmt_time(trigger).partition(" ")
    if not clock:  # no trigger time
        day, clock = "", day
    stats = html.Div(
        [
            stat("Status", badge(status), type_label(cp)),
            stat("Triggered", clock, f"{day} UTC · {fmt_age(now_ms, trigger)}"),
            stat("End-to-end", duration, detail),
            stat(
                "Checkpointed",
                fmt_bytes(cp.get("checkpointed_size")),
                f"state size {fmt_bytes(cp.get('state_size'))}",
            ),
            stat(
                "Acknowledged", f"{DASH if n is None else n}/{DASH if m is None else m}", "subtasks"
            ),
            stat("Alignment buffered", fmt_bytes(cp.get("alignment_buffered"))),
            stat(
                "Attempt · epoch",
                f"{_or_dash(cp.get('attempt'))} · {_or_dash(cp.get('epoch'))}",
            ),
        ],
        className="stats",
    )
    retained = (
        "discarded: retention or a failure removed its files" if cp.get("discarded") else "retained"
    )
    path = html.Div(
        [
            html.Span("Path ", className="stat-label"),
            html.Code(cp.get("external_path") or DASH),
            html.Span(f" · {retained}", className="legend-note"),
        ],
        className="checkpoint-path",
    )
    return [stats, path]


def failure_view(cp: dict[str, Any]) -> html.Div | None:
    """The failure's reason and message, prominently; nothing unless the checkpoint failed."""
    if cp.get("status") != "FAILED":
        return None
    return html.Div(
        [
            html.Strong(f"Failed: {cp.get('failure_reason') or 'reason unknown'}"),
            html.Div(cp.get("failure_message") or "The control plane recorded no message."),
        ],
        className="notice notice-error failure",
        role="alert",
    )


def operator_rows(cp: dict[str, Any], stragglers: list[Straggler]) -> list[dict[str, Any]]:
    """One row per operator (the details' ``tasks``), numbers for sorting, texts with units."""
    rows = []
    for task in (cp.get("tasks") or {}).values():
        status = task.get("status") or "UNKNOWN"
        n, m = task.get("num_acknowledged_subtasks"), task.get("num_subtasks")
        rows.append(
            {
                "id": task["id"],
                "operator": task.get("name") or task["id"],
                "status": status,
                "status_style": {"color": status_color(status), "fontWeight": "600"},
                "acknowledged": n,
                "acknowledged_text": f"{DASH if n is None else n}/{DASH if m is None else m}",
                "end_to_end_duration": task.get("end_to_end_duration"),
                "end_to_end_duration_text": fmt_ms(task.get("end_to_end_duration")),
                "checkpointed_size": task.get("checkpointed_size"),
                "checkpointed_size_text": fmt_bytes(task.get("checkpointed_size")),
                "state_size": task.get("state_size"),
                "state_size_text": fmt_bytes(task.get("state_size")),
                "alignment_buffered": task.get("alignment_buffered"),
                "alignment_buffered_text": fmt_bytes(task.get("alignment_buffered")),
                "stragglers": sum(1 for s in stragglers if s.operator_id == task["id"]),
            }
        )
    return rows


def stragglers_view(stragglers: list[Straggler]) -> Any:
    """The list of slow subtasks, or a line saying there are none."""
    if not stragglers:
        return html.P(
            "No straggler: no subtask took more than 1.5 times its operator's median.",
            className="legend-note",
        )
    return [
        html.H3("Stragglers"),
        html.Ul([html.Li(s.describe(), className="straggler") for s in stragglers]),
    ]


def pending_span(cp: dict[str, Any], now_ms: int) -> float | None:
    """How far the timeline's unacknowledged rows reach: the checkpoint's duration so far, or
    until it failed (an expired checkpoint's: its timeout)."""
    if cp.get("end_to_end_duration") is not None:
        return float(cp["end_to_end_duration"])
    trigger = cp.get("trigger_timestamp")
    if cp.get("status") == "IN_PROGRESS" and trigger:
        return float(max(1, now_ms - trigger))
    ran = failed_after(cp)
    return None if ran is None else float(max(1, ran))


def checkpoint_views(
    cp: dict[str, Any], operators: list[dict[str, Any]], now_ms: int
) -> tuple[Any, ...]:
    """From the details and the subtasks answers: summary, failure, operator rows, timeline,
    stragglers and handle rows."""
    stragglers = find_stragglers(subtask_phases(operators))
    return (
        summary_cards(cp, now_ms),
        failure_view(cp),
        operator_rows(cp, stragglers),
        timeline_figure(operators, pending_span(cp, now_ms), timeline_note(cp)),
        stragglers_view(stragglers),
        handle_rows(operators),
    )


# ----------------------------------------------------------------------------- layout, callback


def layout(route: Route) -> html.Div:
    """The page, the per-subtask timeline first under the job's header: at 1440x900 it is in
    view without scrolling; the summary, operators and state handles follow."""
    phases = html.Dl(
        [item for name, text in PHASE_HELP for item in (html.Dt(name), html.Dd(text))],
        className="phases",
    )
    return html.Div(
        [
            job_header.view(route),
            html.Div(id=ids.CK_MESSAGE),
            section(
                f"Checkpoint #{route.checkpoint_id}: per-subtask timeline",
                html.Div(id=ids.CK_FAILURE),
                html.Div(
                    [
                        dcc.Graph(
                            id=ids.CK_TIMELINE,
                            figure=empty_figure("Loading…"),
                            config={"displaylogo": False},
                            className="timeline-graph",
                        ),
                        html.Aside(
                            [
                                phases,
                                html.P(ALIGNMENT_ON_SPARK, className="alignment-note"),
                                html.Div(id=ids.CK_STRAGGLERS),
                            ],
                            className="timeline-aside",
                        ),
                    ],
                    className="timeline-row",
                ),
                help_text="One row per subtask (#index as in the API and the state file names), "
                "in ms since the checkpoint was triggered. A subtask more than 1.5 times slower "
                "than "
                "its operator's median is a straggler (red).",
            ),
            section(
                "Summary",
                html.Div(id=ids.CK_SUMMARY),
                html.Div(id=ids.CK_SPARK_LINK, className="spark-link"),
                dcc.Store(id=ids.CK_SPARK_GROUP),
                dcc.Store(id=ids.CK_SPARK_DONE),
            ),
            section(
                "Operators", grid(ids.CK_OPERATORS_GRID, OPERATOR_COLUMNS, sort=("operator", "asc"))
            ),
            section(
                "State handles",
                grid(ids.CK_HANDLES_GRID, HANDLE_COLUMNS),
                help_text="The files (or inline bytes) each subtask's snapshot wrote; "
                "restore verifies each size and checksum. Hover a path or checksum for all "
                "of it.",
            ),
            route_store(route),
        ]
    )


def register(app: Dash, client: ApiClient, spark_ui: SparkUi | None = None) -> None:
    """The page's callbacks; ``spark_ui`` asks the Spark UIs (loopback only by default)."""
    spark_ui = spark_ui or SparkUi()

    @app.callback(
        Output(ids.CK_SUMMARY, "children"),
        Output(ids.CK_FAILURE, "children"),
        Output(ids.CK_OPERATORS_GRID, "rowData"),
        Output(ids.CK_TIMELINE, "figure"),
        Output(ids.CK_STRAGGLERS, "children"),
        Output(ids.CK_HANDLES_GRID, "rowData"),
        Output(ids.CK_MESSAGE, "children"),
        Output(ids.CK_SPARK_GROUP, "data"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
        State(ids.CK_SPARK_GROUP, "data"),
    )
    def _refresh(
        _n: int | None, route: dict[str, Any] | None, token: str | None, shown_epoch: Any
    ) -> tuple[Any, ...]:
        if not route or not route.get("job_id") or not route.get("checkpoint_id"):
            return (no_update,) * 8
        job_id, n = route["job_id"], int(route["checkpoint_id"])
        cp, error = fetch(lambda: client.checkpoint(job_id, n, token))
        if cp is None:
            if not error:  # unreachable: keep what is shown
                return (no_update,) * 8
            gone = empty_figure(f"No checkpoint {n} to show")
            return (
                None,
                None,
                [],
                gone,
                None,
                [],
                message(not_found_text(job_id, n, error)),
                {"group": None, "epoch": None, "missing": True},
            )
        operators: list[dict[str, Any]] = []
        problems: list[str] = []
        for operator_id in cp.get("tasks") or {}:
            answer, error = fetch(partial(client.subtasks, job_id, n, operator_id, token))
            if answer is None:
                if not error:
                    return (no_update,) * 8  # the API went away mid-way: keep what is shown
                problems.append(error)
            else:
                operators.append(answer)
        views = checkpoint_views(cp, operators, int(time.time() * 1000))
        note = message("; ".join(problems), "warn") if problems else None
        epoch = {
            "group": cp.get("spark-job-group"),
            "epoch": cp.get("epoch"),
            "status": cp.get("status"),  # a failed checkpoint's barrier will ride no epoch
        }
        return (*views, note, epoch if epoch != shown_epoch else no_update)

    @app.callback(
        Output(ids.CK_SPARK_LINK, "children"),
        Output(ids.CK_SPARK_DONE, "data"),
        Input(ids.CK_SPARK_GROUP, "data"),
        Input(ids.REFRESH, "n_intervals"),
        State(ids.CK_SPARK_DONE, "data"),
        State(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
        prevent_initial_call=True,
    )
    def _spark_link(
        epoch: Any, _n: int | None, done: Any, route: dict[str, Any] | None, token: str | None
    ) -> tuple[Any, Any]:
        """The Spark jobs of the checkpoint's epoch, in a callback of its own (the Spark UI
        may be slow or gone); asked again on refresh until the answer is final."""
        if not route or not route.get("job_id") or not epoch or epoch == done:
            return no_update, no_update
        group = epoch.get("group")
        if epoch.get("missing") or not group:
            cp = {
                "spark-job-group": group,
                "epoch": epoch.get("epoch"),
                "status": epoch.get("status"),
            }
            return (None if epoch.get("missing") else spark_link_view(cp, None, None)), epoch
        job, _ = fetch(lambda: client.job(route["job_id"], token))
        spark = (job or {}).get("spark") or {}
        if not spark.get("ui-url") or not spark.get("application-id"):
            view = spark_link_view(
                {"spark-job-group": group, "epoch": epoch.get("epoch")}, spark, None
            )
            return view, (epoch if job is not None else None)
        jobs = spark_ui.group_jobs(spark["ui-url"], spark["application-id"], group)
        cp = {"spark-job-group": group, "epoch": epoch.get("epoch")}
        view = spark_link_view(cp, spark, jobs, allowed=spark_ui.allows(spark["ui-url"]))
        return view, (epoch if settled(jobs) else None)
