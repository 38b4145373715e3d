"""``GET /metrics``: checkpoint, job and ingest numbers in Prometheus' text format 0.0.4.

Written by hand (no client library): one ``# HELP`` and ``# TYPE`` line per family, label
values escaped as the format requires. The database part is read per scrape; the ingest
counters come from ``app.state.ingest_stats`` and, when the API runs in a process of its own,
with the garbage collector's pauses from the engine (``app.state.engine``): while the engine
is being started again, those families have no sample and ``sparkpoint_engine_up`` is 0.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from sparkpoint.protocol import JobStatus
from sparkpoint_server import gc_pauses
from sparkpoint_server.api.deps import SessionsDep, require_token
from sparkpoint_server.engine_process import EngineUnavailableError
from sparkpoint_server.storage.queries import MetricsSnapshot, metrics_snapshot

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_token)])

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Metric name, ``ingest_stats`` attribute, help text.
INGEST_COUNTERS = (
    ("sparkpoint_events_ingested_total", "events_ingested", "Job events applied by the ingest."),
    ("sparkpoint_dead_letters_total", "dead_letters", "Messages moved to the dead-letter stream."),
    (
        "sparkpoint_stale_messages_total",
        "stale_messages",
        "Events refused because they carry an older job attempt.",
    ),
    ("sparkpoint_ingest_batches_total", "batches", "Batches of events read from Redis."),
    (
        "sparkpoint_ingest_handler_errors_total",
        "handler_errors",
        "Events whose handler failed (retried later).",
    ),
    ("sparkpoint_redis_errors_total", "redis_errors", "Errors talking to Redis."),
)

Sample = tuple[dict[str, str], float | int | None]


class _NoPauses:
    """The pauses of an engine that does not answer: none to report."""

    def snapshot(self) -> list[tuple[int, int, float, float]]:
        return []


def escape_label(value: str) -> str:
    """A label value as the text format wants it: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float | int) -> str:
    """A sample value: integers as is, floats in Go's notation (``NaN``, ``+Inf``)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    """The lines of one metric family; samples whose value is ``None`` are left out."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        if value is None:
            continue
        rendered = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
        selector = f"{{{rendered}}}" if rendered else ""
        lines.append(f"{name}{selector} {format_value(value)}")
    return lines


def ingest_counters(stats: object) -> dict[str, Any] | None:
    """The ingest's counters: its ``snapshot()`` when it has one (one call to the engine in two
    processes), else its attributes; None: not known."""
    if stats is None:
        return None
    snapshot_of = getattr(stats, "snapshot", None)
    return dict(snapshot_of() if snapshot_of is not None else getattr(stats, "__dict__", {}))


def render_metrics(
    snapshot: MetricsSnapshot,
    ingest_stats: object,
    pauses: gc_pauses.PauseSource | None = None,
    engine: tuple[bool, int] | None = None,
) -> str:
    """The whole exposition: database families first, then the ingest counters
    (``ingest_stats``: its ``snapshot()`` when it has one, else its attributes; None: not
    known, no sample), then the garbage collector's pauses (``pauses``; default: this
    process's), then, with ``engine`` (whether it runs, how often it was started again), the
    engine's families."""
    lines: list[str] = []
    lines += family(
        "sparkpoint_checkpoints_total",
        "gauge",
        "Checkpoints and savepoints stored, per job and status (retention removes some).",
        [({"job_id": job, "status": status}, n) for job, status, n in snapshot.checkpoints],
    )
    lines += family(
        "sparkpoint_checkpoint_last_duration_ms",
        "gauge",
        "End-to-end duration of the job's latest completed checkpoint, in milliseconds.",
        [({"job_id": job}, duration) for job, duration, _ in snapshot.last_completed],
    )
    lines += family(
        "sparkpoint_checkpoint_last_size_bytes",
        "gauge",
        "State size of the job's latest completed checkpoint, in bytes.",
        [({"job_id": job}, size) for job, _, size in snapshot.last_completed],
    )
    lines += family(
        "sparkpoint_job_restarts_total",
        "counter",
        "Restarts of the job decided by its restart strategy.",
        [({"job_id": job}, restarts) for job, _, restarts in snapshot.jobs],
    )
    lines += family(
        "sparkpoint_job_status",
        "gauge",
        "1 for the job's current status, 0 for the others.",
        (
            ({"job_id": job, "status": s.value}, int(s.value == current))
            for job, current, _ in snapshot.jobs
            for s in JobStatus
        ),
    )
    counters = ingest_counters(ingest_stats)
    for name, attribute, help_text in INGEST_COUNTERS:
        value = None if counters is None else int(counters.get(attribute) or 0)
        lines += family(name, "counter", help_text, [({}, value)])
    read_through = counters.get("read_through_ms") if counters else None
    lines += family(
        "sparkpoint_ingest_read_through_timestamp_seconds",
        "gauge",
        "Every event that entered the events stream before this time is applied (checkpoint "
        "deadlines and heartbeat timeouts wait for it): alert on time() minus it.",
        [({}, read_through / 1000 if read_through else None)],
    )
    by_generation = (pauses or gc_pauses.PAUSES).snapshot()
    lines += family(
        "sparkpoint_gc_collections_total",
        "counter",
        "Collections of Python's cyclic garbage collector in the control plane, per generation.",
        [({"generation": str(g)}, n) for g, n, _, _ in by_generation],
    )
    lines += family(
        "sparkpoint_gc_pause_seconds_total",
        "counter",
        "Time those collections held the interpreter (every thread, REST requests included).",
        [({"generation": str(g)}, s) for g, _, s, _ in by_generation],
    )
    lines += family(
        "sparkpoint_gc_pause_max_seconds",
        "gauge",
        "The longest of those collections since the control plane started.",
        [({"generation": str(g)}, m) for g, _, _, m in by_generation],
    )
    if engine is not None:
        lines += family(
            "sparkpoint_engine_up",
            "gauge",
            "1 while the engine (the process that coordinates, beside the API's) runs; 0 while "
            "it is being started again.",
            [({}, int(engine[0]))],
        )
        lines += family(
            "sparkpoint_engine_restarts_total",
            "counter",
            "Times the server started its engine again after it died.",
            [({}, engine[1])],
        )
    return "\n".join(lines) + "\n"


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    description="Checkpoint counts, the latest completed checkpoint's duration and size, "
    "restarts and status per job, the ingest's counters and how far it has read the events "
    "stream (`sparkpoint_ingest_read_through_timestamp_seconds`: checkpoint deadlines and "
    "heartbeat timeouts wait for it), the garbage collector's pauses, in "
    "Prometheus' text format; when the API runs in a process of its own, whether its engine "
    "runs (`sparkpoint_engine_up`: while the engine is being started again the engine's "
    "families have no sample) and how often it was restarted.",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
)
def metrics(request: Request, sessions: SessionsDep) -> Response:
    with sessions() as session:
        snapshot = metrics_snapshot(session)
    state = request.app.state
    stats = getattr(state, "ingest_stats", None)
    pauses = getattr(state, "gc_pauses", None)
    engine = getattr(state, "engine", None)  # EngineRunner, when the API is a process apart
    if engine is None:
        return Response(render_metrics(snapshot, stats, pauses), media_type=CONTENT_TYPE)
    text = None
    if engine.engine_up():
        with contextlib.suppress(EngineUnavailableError):  # it may die meanwhile
            text = render_metrics(snapshot, stats, pauses, (True, engine.restarts))
    if text is None:  # what the database says, and that the engine is down
        text = render_metrics(snapshot, None, _NoPauses(), (False, engine.restarts))
    return Response(text, media_type=CONTENT_TYPE)
