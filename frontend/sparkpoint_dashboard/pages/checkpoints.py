"""The checkpoints page (``/jobs/{id}/checkpoints``): counts, the latest checkpoints, the history
chart of duration and size, the percentile summary and the sortable history table."""

from __future__ import annotations

import time
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components import job_header
from sparkpoint_dashboard.components.charts import (
    empty_figure,
    history_duration,
    history_figure,
    type_label,
)
from sparkpoint_dashboard.components.widgets import (
    fetch,
    grid,
    link_cell,
    link_column,
    message,
    route_store,
    section,
    stat,
)
from sparkpoint_dashboard.routing import Route, checkpoint_path, job_path
from sparkpoint_dashboard.theme import status_color
from sparkpoint_dashboard.units import DASH, fmt_age, fmt_bytes, fmt_count, fmt_ms, fmt_time

HISTORY_LIMIT = 300

# (key of the summary, row title, formatter)
SUMMARY_ROWS = (
    ("end_to_end_duration", "End-to-end duration", fmt_ms),
    ("checkpointed_size", "Checkpointed size", fmt_bytes),
    ("state_size", "State size", fmt_bytes),
    ("alignment_buffered", "Alignment buffered", fmt_bytes),
)
SUMMARY_COLUMNS = (
    ("min", "min"),
    ("avg", "avg"),
    ("p50", "p50"),
    ("p90", "p90"),
    ("p95", "p95"),
    ("p99", "p99"),
    ("max", "max"),
)


_HEADER = {"wrapHeaderText": True, "autoHeaderHeight": True}


def _number(field: str, header: str, width: int = 100, **extra: Any) -> dict[str, Any]:
    """A column that sorts on the numeric ``field`` and shows the text ``field + "_text"``."""
    return {
        "field": field,
        "headerName": header,
        "type": "numericColumn",
        "valueFormatter": {"function": f"params.data.{field}_text"},
        "minWidth": width,
        **_HEADER,
        **extra,
    }


def _text(field: str, header: str, width: int, **extra: Any) -> dict[str, Any]:
    return {"field": field, "headerName": header, "minWidth": width, **_HEADER, **extra}


COLUMNS: list[dict[str, Any]] = [
    link_column(
        "link", headerName="ID", minWidth=65, comparator={"function": "byNumericId"}, **_HEADER
    ),
    _text("status", "Status", 105, cellStyle={"function": "params.data.status_style"}),
    _text("type", "Type", 115, tooltipField="type"),
    _text("attempt", "Attempt", 80, type="numericColumn"),
    # Sorts on the timestamp, shows it to the second; the tooltip has the milliseconds.
    _text(
        "trigger_timestamp",
        "Triggered (UTC)",
        155,
        tooltipField="trigger_timestamp_text",
        valueFormatter={"function": "params.data.trigger_short"},
    ),
    _number("end_to_end_duration", "End-to-end", 90),
    _number("checkpointed_size", "Checkpointed", 105),
    _number("state_size", "State size", 85),
    _number("acknowledged", "Acknowledged", 105),
    _number("alignment_buffered", "Alignment buffered", 95),
    _text("failure_reason", "Failure", 160, tooltipField="failure_message"),
    _text("path_name", "Path", 90, tooltipField="external_path"),
    _text("retained", "Retained", 90),
]


# ----------------------------------------------------------------------------- plain functions


def count_cards(counts: dict[str, Any]) -> list[html.Div]:
    """The count cards: triggered, in progress, completed, failed, restored."""
    return [
        stat("Triggered", fmt_count(counts.get("total"))),
        stat("In progress", fmt_count(counts.get("in_progress"))),
        stat("Completed", fmt_count(counts.get("completed"))),
        stat("Failed", fmt_count(counts.get("failed"))),
        stat("Restored", fmt_count(counts.get("restored")), "new attempts from a checkpoint"),
    ]


def _id_link(job_id: str, entry: dict[str, Any]) -> dcc.Link:
    return dcc.Link(f"#{entry['id']}", href=checkpoint_path(job_id, entry["id"]))


def _block(title: str, *lines: Any) -> html.Div:
    return html.Div(
        [html.H3(title), *[html.Div(line) for line in lines if line is not None]],
        className="latest-block",
    )


def latest_view(latest: dict[str, Any], job_id: str, now_ms: int) -> list[html.Div]:
    """The latest completed, failed and savepoint checkpoints and the latest restore."""
    completed, failed = latest.get("completed"), latest.get("failed")
    savepoint, restored = latest.get("savepoint"), latest.get("restored")
    blocks: list[html.Div] = []
    if completed:
        when = completed.get("latest_ack_timestamp") or completed.get("trigger_timestamp")
        blocks.append(
            _block(
                "Latest completed",
                [
                    _id_link(job_id, completed),
                    f" · {fmt_ms(completed.get('end_to_end_duration'))}",
                    f" · {fmt_bytes(completed.get('checkpointed_size'))}",
                ],
                f"{fmt_time(when)} UTC ({fmt_age(now_ms, when)})",
                html.Code(completed.get("external_path") or DASH),
            )
        )
    else:
        blocks.append(_block("Latest completed", "none yet"))
    if failed:
        when = failed.get("failure_timestamp") or failed.get("trigger_timestamp")
        blocks.append(
            _block(
                "Latest failed",
                [
                    _id_link(job_id, failed),
                    " · ",
                    html.Span(failed.get("failure_reason") or "FAILED", className="failure-reason"),
                ],
                f"{fmt_time(when)} UTC ({fmt_age(now_ms, when)})",
                html.Div(
                    failed.get("failure_message") or "no message", className="failure-message"
                ),
            )
        )
    else:
        blocks.append(_block("Latest failed", "none"))
    if savepoint:
        blocks.append(
            _block(
                "Latest savepoint",
                [
                    _id_link(job_id, savepoint),
                    f" · {fmt_time(savepoint.get('trigger_timestamp'))} UTC",
                ],
                html.Code(savepoint.get("external_path") or DASH),
            )
        )
    else:
        blocks.append(_block("Latest savepoint", "none"))
    blocks.append(_block("Latest restore", *restore_lines(restored, job_id, now_ms)))
    if latest.get("failover") is not None:
        blocks.append(_block("A failover restores", *failover_lines(latest["failover"], job_id)))
    if latest.get("origin_of"):
        blocks.append(
            _block("Other jobs' restore points", *kept_lines(latest["origin_of"], job_id))
        )
    return blocks


def kept_lines(kept: list[dict[str, Any]], job_id: str) -> list[Any]:
    """The retained checkpoints other live jobs started from and would restore in a failover
    (retention keeps them until those jobs have a checkpoint of their own)."""
    lines: list[Any] = []
    for entry in kept:
        others: list[Any] = []
        for i, other in enumerate(entry["jobs"]):
            others += [", " if i else "", dcc.Link(other, href=job_path(other))]
        lines.append(
            [
                "savepoint " if entry.get("is_savepoint") else "checkpoint ",
                dcc.Link(f"#{entry['id']}", href=checkpoint_path(job_id, entry["id"])),
                ": ",
                *others,
                " would restore it in a failover (kept until they have a checkpoint of their own)",
            ]
        )
    return lines


def failover_lines(failover: dict[str, Any], job_id: str) -> list[Any]:
    """What a failover restores now, the line's origin, and what a restore went back past."""
    origin, target = failover.get("origin"), failover.get("id")
    lines: list[Any] = []
    if target is None:
        lines.append("the beginning (no checkpoint retained yet)")
    elif failover.get("is_savepoint") is None:  # the origin, not in the job's store: by path
        lines += [
            [f"checkpoint #{target} by its path (the checkpoint the job's line started from)"],
            html.Code(failover.get("external_path") or DASH),
        ]
    else:
        kind = "savepoint" if failover.get("is_savepoint") else "checkpoint"
        lines.append([f"{kind} ", dcc.Link(f"#{target}", href=checkpoint_path(job_id, target))])
    if origin is not None:
        lines.append(f"the line since checkpoint #{origin['id']} (a restore or --from-checkpoint)")
    passed = failover.get("passed_over") or []
    if passed:
        shown = ", ".join(f"#{cid}" for cid in passed[:10]) + (" …" if len(passed) > 10 else "")
        lines.append(f"not restored by a failover (a restore went back past them): {shown}")
    return lines


def restore_lines(restored: dict[str, Any] | None, job_id: str, now_ms: int) -> list[Any]:
    """What the job last started from: a checkpoint, a savepoint, or nothing."""
    if not restored:
        return ["never restored"]
    when = restored.get("restore_timestamp")
    at = f"{fmt_time(when)} UTC ({fmt_age(now_ms, when)})"
    cp_id, path = restored.get("id"), restored.get("external_path")
    if cp_id is None and not path:
        return ["started from scratch (no checkpoint)", at]
    kind = "savepoint" if restored.get("is_savepoint") else "checkpoint"
    what: list[Any] = [f"from {kind} "]
    if cp_id is not None:
        what.append(dcc.Link(f"#{cp_id}", href=checkpoint_path(job_id, cp_id)))
    return [what, at, restore_timings(restored), html.Code(path) if path else None]


def restore_timings(restored: dict[str, Any]) -> str:
    """How the restore went: the slowest subtask's state restore, and how long after the
    restore the job processed its first record (reported by the first epoch after it)."""
    state_ms, first = restored.get("state_restore_duration"), restored.get("first_record_timestamp")
    if state_ms is None and first is None:
        if restored.get("epoch_reported"):
            return "timings: none reported (no keyed state was restored)"
        return "timings: the first epoch after the restore has not reported yet"
    parts = []
    if state_ms is not None:
        parts.append(f"state restored in {fmt_ms(state_ms)} (slowest subtask)")
    if first is not None:
        when = restored.get("restore_timestamp")
        after = first - when if isinstance(when, int) else -1
        # The executors' clock against the control plane's: a skew can put it before.
        parts.append(
            f"first record {fmt_ms(after)} after the restore"
            if after >= 0
            else f"first record at {fmt_time(first)} UTC"
        )
    return "; ".join(parts)


def summary_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The percentile table: ``[title, min, avg, p50, p90, p95, p99, max]`` per quantity, each
    value with its unit (a dash when there is no completed checkpoint yet)."""
    rows = []
    for key, title, fmt in SUMMARY_ROWS:
        values = summary.get(key) or {}
        rows.append([title, *(fmt(values.get(col)) for col, _ in SUMMARY_COLUMNS)])
    return rows


def summary_table(summary: dict[str, Any]) -> html.Table:
    """:func:`summary_rows` as a table."""
    head = html.Tr([html.Th(""), *(html.Th(label) for _, label in SUMMARY_COLUMNS)])
    body = [html.Tr([html.Th(r[0]), *(html.Td(v) for v in r[1:])]) for r in summary_rows(summary)]
    return html.Table([html.Thead(head), html.Tbody(body)], className="numbers")


def history_row(entry: dict[str, Any], job_id: str) -> dict[str, Any]:
    """One row of the history table: numbers for sorting, ``*_text`` with units for showing."""
    status = entry.get("status") or "UNKNOWN"
    n, m = entry.get("num_acknowledged_subtasks"), entry.get("num_subtasks")
    trigger = entry.get("trigger_timestamp")
    return {
        "id": entry["id"],
        "row_id": str(entry["id"]),
        **link_cell("link", f"#{entry['id']}", checkpoint_path(job_id, entry["id"])),
        "status": status,
        "status_style": {"color": status_color(status), "fontWeight": "600"},
        "type": type_label(entry),
        "attempt": entry.get("attempt"),
        "trigger_timestamp": trigger,
        "trigger_timestamp_text": fmt_time(trigger),
        "trigger_short": fmt_time(trigger)[:19],
        # a failed checkpoint's: until it failed (history_duration), as in Flink's history
        "end_to_end_duration": (took := history_duration(entry, None)),
        "end_to_end_duration_text": fmt_ms(took),
        "checkpointed_size": entry.get("checkpointed_size"),
        "checkpointed_size_text": fmt_bytes(entry.get("checkpointed_size")),
        "state_size": entry.get("state_size"),
        "state_size_text": fmt_bytes(entry.get("state_size")),
        "acknowledged": n,
        "acknowledged_text": f"{DASH if n is None else n}/{DASH if m is None else m}",
        "alignment_buffered": entry.get("alignment_buffered"),
        "alignment_buffered_text": fmt_bytes(entry.get("alignment_buffered")),
        "failure_reason": entry.get("failure_reason") or "",
        "failure_message": entry.get("failure_message") or "",
        "external_path": entry.get("external_path") or "",
        "path_name": (entry.get("external_path") or "").rstrip("/").rsplit("/", 1)[-1],
        "retained": "discarded" if entry.get("discarded") else "retained",
    }


def history_rows(history: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    """The history table, newest first."""
    return [history_row(e, job_id) for e in sorted(history, key=lambda e: -e["id"])]


def checkpoints_views(answer: dict[str, Any], job_id: str, now_ms: int) -> tuple[Any, ...]:
    """Everything the page shows from ``GET /jobs/{id}/checkpoints``: count cards, latest,
    history figure, summary table, history rows."""
    history = answer.get("history") or []
    return (
        count_cards(answer.get("counts") or {}),
        latest_view(answer.get("latest") or {}, job_id, now_ms),
        history_figure(history, now_ms),
        summary_table(answer.get("summary") or {}),
        history_rows(history, job_id),
    )


# ----------------------------------------------------------------------------- layout, callback


def layout(route: Route) -> html.Div:
    return html.Div(
        [
            job_header.view(route),
            html.Div(id=ids.CP_MESSAGE),
            html.Div(id=ids.CP_COUNTS, className="stats"),
            html.Div(
                [
                    section("Latest", html.Div(id=ids.CP_LATEST, className="latest")),
                    section(
                        "Summary of completed checkpoints",
                        html.Div(id=ids.CP_SUMMARY),
                        help_text="Percentiles over the completed checkpoints the control plane "
                        "keeps statistics of.",
                    ),
                ],
                className="row",
            ),
            section(
                "History",
                dcc.Graph(
                    id=ids.CP_HISTORY_CHART,
                    figure=empty_figure("Loading…"),
                    config={"displaylogo": False},
                ),
                help_text=[
                    f"The last {HISTORY_LIMIT} checkpoints by trigger time: end-to-end duration "
                    "(trigger to last acknowledgement) above, checkpointed size below. Green "
                    "completed, red ✕ failed (at how long it ran until it failed), blue ring in "
                    "progress (duration so far), purple "
                    "diamond a savepoint; dotted lines mark a restart (a new job attempt). "
                    "Drag to zoom, double-click to reset.",
                ],
            ),
            section(
                "All checkpoints",
                grid(
                    ids.CP_HISTORY_GRID,
                    COLUMNS,
                    row_id="params.data.row_id",
                    height="460px",
                    sort=("link", "desc"),
                ),
                help_text="Click a column to sort; click an id for its per-subtask timeline. "
                "Hover a failure or a path for all of it.",
            ),
            route_store(route),
        ]
    )


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.CP_COUNTS, "children"),
        Output(ids.CP_LATEST, "children"),
        Output(ids.CP_HISTORY_CHART, "figure"),
        Output(ids.CP_SUMMARY, "children"),
        Output(ids.CP_HISTORY_GRID, "rowData"),
        Output(ids.CP_MESSAGE, "children"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _refresh(
        _n: int | None, route: dict[str, Any] | None, token: str | None
    ) -> tuple[Any, ...]:
        if not route or not route.get("job_id"):
            return (no_update,) * 6
        job_id = route["job_id"]
        answer, error = fetch(lambda: client.checkpoints(job_id, HISTORY_LIMIT, token))
        if answer is None:
            return (*(no_update,) * 5, message(error) if error else no_update)
        return (*checkpoints_views(answer, job_id, int(time.time() * 1000)), None)
