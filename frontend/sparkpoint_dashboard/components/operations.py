"""The operations an operator sent (actions, configuration changes): their records and their log.

A record is a plain dict kept in the session store ``ids.OPERATIONS``; records are only ever
appended (callbacks write them with :class:`dash.Patch`, so two callbacks never overwrite each
other's records) and updated in place when their request completes. Fields:
``job_id, kind, label, request_id, status (IN_PROGRESS|COMPLETED|FAILED), detail, warning,
location, checkpoint_id, requested_at, finished_at`` (times in ms since the epoch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dash import html

from sparkpoint_dashboard.api_client import ApiRequestError, ApiUnreachableError
from sparkpoint_dashboard.components.widgets import badge, message
from sparkpoint_dashboard.units import fmt_ms, fmt_time

IN_PROGRESS, COMPLETED, FAILED = "IN_PROGRESS", "COMPLETED", "FAILED"
NO_TOKEN = "Enter the API token in the header first: actions need it."

#: Kinds whose request completes later, and the path segment that polls it:
#: ``GET /jobs/{id}/{segment}/{request-id}``.
POLLED = {
    "checkpoint": "checkpoints",
    "savepoint": "savepoints",
    "stop": "stop",
    "restore": "restore",
}
LOG_SHOWN = 3  # newest entries shown; the older ones fold under "earlier operations"
LOG_LIMIT = 20  # entries the log holds per job
POLL_LIMIT = 10  # requests polled per refresh


def new_record(
    job_id: str,
    kind: str,
    label: str,
    now_ms: int,
    *,
    status: str = IN_PROGRESS,
    request_id: str | None = None,
    detail: str | None = None,
    warning: str | None = None,
) -> dict[str, Any]:
    """A record of one operation, as the log and the poller read it."""
    finished = None if status == IN_PROGRESS else now_ms
    return {
        "job_id": job_id,
        "kind": kind,
        "label": label,
        "request_id": request_id,
        "status": status,
        "detail": detail,
        "warning": warning,
        "location": None,
        "checkpoint_id": None,
        "requested_at": now_ms,
        "finished_at": finished,
    }


def accepted_record(job_id: str, kind: str, label: str, answer: Any, now_ms: int) -> dict[str, Any]:
    """The record of a request the API accepted (``202 {"request-id", "warning"?}``).

    Requests of a :data:`POLLED` kind stay IN_PROGRESS until polled; a cancel is done once
    accepted (the job's status then shows CANCELLING, then CANCELED).
    """
    answer = answer if isinstance(answer, dict) else {}
    request_id = answer.get("request-id")
    warning = answer.get("warning") or None
    if kind in POLLED:
        return new_record(job_id, kind, label, now_ms, request_id=request_id, warning=warning)
    detail = (
        f"the control plane accepted the cancel (request {request_id}): the job's status "
        "shows CANCELLING, then CANCELED"
        if kind == "cancel"
        else "done"
    )
    return new_record(
        job_id, kind, label, now_ms, status=COMPLETED, request_id=request_id, detail=detail
    )


def completed_detail(kind: str, location: str | None, checkpoint_id: Any) -> str:
    """What a completed request produced, in words."""
    where = f" at {location}" if location else ""
    if kind == "checkpoint":
        return f"checkpoint {checkpoint_id} completed{where}"
    if kind == "savepoint":
        return f"savepoint {checkpoint_id} completed{where}"
    if kind == "stop":
        return f"final savepoint {checkpoint_id} completed{where}; the job finishes"
    if kind == "restore":
        return f"the job runs again from checkpoint {checkpoint_id}{where}"
    return "completed"


def apply_status(record: dict[str, Any], answer: Any, now_ms: int) -> dict[str, Any] | None:
    """The record after polling its request: Flink's asynchronous-operation answer
    ``{"status": {"id"}, "operation": {"location", "checkpointId"} | {"failure-cause"}}``.

    Returns:
        The updated record, or ``None`` while the request is still in progress.
    """
    if not isinstance(answer, dict):
        return None
    status = (answer.get("status") or {}).get("id")
    if status != COMPLETED:
        return None
    operation = answer.get("operation") or {}
    cause = operation.get("failure-cause")
    if answer.get("failed") or cause:
        text = (cause or {}).get("stack-trace") or "the control plane gave no cause"
        return {**record, "status": FAILED, "detail": text, "finished_at": now_ms}
    location, checkpoint_id = operation.get("location"), operation.get("checkpointId")
    return {
        **record,
        "status": COMPLETED,
        "location": location,
        "checkpoint_id": checkpoint_id,
        "detail": completed_detail(record["kind"], location, checkpoint_id),
        "finished_at": now_ms,
    }


def apply_poll_error(
    record: dict[str, Any], status: int, message: str, now_ms: int
) -> dict[str, Any] | None:
    """The record after its poll was answered with an error: a 404 means the control plane
    does not know the request (it is FAILED); anything else (a missing token, a 5xx) leaves
    it IN_PROGRESS, polled again at the next refresh."""
    if status != 404:
        return None
    detail = f"the control plane does not know this request: {message}"
    return {**record, "status": FAILED, "detail": detail, "finished_at": now_ms}


def failed_record(job_id: str, kind: str, label: str, message: str, now_ms: int) -> dict[str, Any]:
    """The record of a request the API refused (or that could not be sent)."""
    return new_record(job_id, kind, label, now_ms, status=FAILED, detail=message)


def to_poll(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """``(index, record)`` of the records whose request is still in progress, oldest first."""
    polled = [
        (i, r)
        for i, r in enumerate(records or [])
        if r.get("status") == IN_PROGRESS and r.get("request_id") and r.get("kind") in POLLED
    ]
    return polled[:POLL_LIMIT]


def log_rows(records: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    """The log of one job, newest first: what, when, the request id, status and outcome."""
    mine = [r for r in records or [] if r.get("job_id") == job_id]
    rows = []
    for r in reversed(mine):
        took = None  # only requests that completed later (a synchronous answer took no time)
        if r.get("kind") in POLLED and r.get("finished_at") and r.get("request_id"):
            took = fmt_ms(r["finished_at"] - r["requested_at"])
        rows.append(
            {
                "kind": r.get("kind"),
                "status": r.get("status"),
                "label": r.get("label"),
                "request_id": r.get("request_id"),
                "time": fmt_time(r.get("requested_at")),
                "took": took,
                "outcome": r.get("detail")
                or ("waiting for the job…" if r.get("status") == IN_PROGRESS else None),
                "warning": r.get("warning"),
            }
        )
    return rows


def _entry(row: dict[str, Any]) -> html.Div:
    parts: list[Any] = [
        html.Span(f"{row['time']} UTC", className="operation-time"),
        badge(row["status"]),
        html.Strong(row["label"]),
    ]
    if row["outcome"]:
        parts.append(html.Span(row["outcome"], className="operation-outcome"))
    if row["took"] and row["status"] != IN_PROGRESS:
        parts.append(html.Span(f"after {row['took']}", className="operation-time"))
    if row["request_id"]:
        parts.append(html.Span(["request ", html.Code(row["request_id"])], className="help"))
    if row["warning"]:
        parts.append(html.Div(f"Warning: {row['warning']}", className="operation-warning"))
    return html.Div(
        parts,
        className="operation",
        **{"data-kind": row["kind"], "data-status": row["status"]},
    )


def log_view(
    rows: list[dict[str, Any]], shown: int = LOG_SHOWN, limit: int = LOG_LIMIT
) -> list[Any]:
    """The log's entries, newest first: the first ``shown`` open, the next ones folded.

    Each entry carries ``data-kind`` and ``data-status`` (browser tests find them by these).
    """
    if not rows:
        return [html.Div("No operations sent from this browser session yet.", className="help")]
    entries: list[Any] = [_entry(row) for row in rows[:shown]]
    earlier = rows[shown:limit]
    if earlier:
        summary = f"{len(earlier)} earlier operation{'s' if len(earlier) != 1 else ''}"
        if len(rows) > limit:
            summary += f" ({len(rows) - limit} older not shown)"
        entries.append(
            html.Details(
                [html.Summary(summary), *[_entry(row) for row in earlier]],
                className="operations-earlier",
            )
        )
    return entries


def execute_change(
    send: Callable[[dict[str, Any], str], Any],
    plan: dict[str, Any],
    token: str | None,
    kind: str,
    now_ms: int,
) -> tuple[dict[str, Any], Any, Any]:
    """Send a confirmed change (a form): ``(record, feedback, the API's answer or None)``.

    ``send(plan, token)`` makes the request; ``kind`` is the record's kind
    (``"config"`` or ``"restart-strategy"``).
    """
    job_id, label = plan["job_id"], plan["label"]
    if not token or not token.strip():
        return (
            failed_record(job_id, kind, label, "not sent: no API token", now_ms),
            message(NO_TOKEN),
            None,
        )
    try:
        answer = send(plan, token)
    except ApiRequestError as err:
        record = failed_record(job_id, kind, label, err.message, now_ms)
        refused = (
            f"The control plane refused it (HTTP {err.status}), nothing changed: {err.message}"
        )
        return record, message(refused), None
    except ApiUnreachableError as err:
        detail = f"no answer from the control plane ({err}); reload the page to see what applies"
        return failed_record(job_id, kind, label, detail, now_ms), message(detail), None
    if kind == "restart-strategy":
        detail = f"now: {answer.get('description')}" if isinstance(answer, dict) else "applied"
    else:
        detail = "applies from the next checkpoint trigger"
    record = new_record(job_id, kind, label, now_ms, status=COMPLETED, detail=detail)
    return record, message(f"{label}: applied.", "ok"), answer
