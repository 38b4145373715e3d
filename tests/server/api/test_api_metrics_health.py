"""``GET /metrics`` (Prometheus text format) and ``GET /healthz``."""

from __future__ import annotations

import gc
import time

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_server.api.metrics import escape_label, format_value, render_metrics
from sparkpoint_server.gc_pauses import GcPauses
from sparkpoint_server.storage.db import create_db_engine, session_factory
from sparkpoint_server.storage.queries import MetricsSnapshot

from .builders import add_checkpoint, add_job
from .conftest import AppFactory, IngestStats, build_app


def test_metrics_render_every_family_in_prometheus_text_format(
    make_client: AppFactory, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s, "a", restarts=2)
        add_job(s, 'b"\\\nx', status="FAILED")
        s.flush()
        add_checkpoint(s, 1, job_id="a", end_to_end_duration=12.5, state_size=4096)
        add_checkpoint(s, 2, job_id="a", end_to_end_duration=20.0, state_size=8192)
        add_checkpoint(s, 3, job_id="a", status="FAILED")
        add_checkpoint(s, 4, job_id="a", status="IN_PROGRESS")
        s.commit()
    stats = IngestStats(
        events_ingested=1234,
        dead_letters=1,
        stale_messages=2,
        batches=3,
        handler_errors=4,
        redis_errors=5,
    )
    client = make_client(ingest_stats=stats)

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    b = 'b\\"\\\\\\nx'  # quote, backslash and newline escaped
    statuses = [
        "CREATED",
        "RUNNING",
        "FAILING",
        "RESTARTING",
        "FAILED",
        "CANCELLING",
        "CANCELED",
        "FINISHED",
    ]
    expected = [
        "# HELP sparkpoint_checkpoints_total Checkpoints and savepoints stored, per job and "
        "status (retention removes some).",
        "# TYPE sparkpoint_checkpoints_total gauge",
        'sparkpoint_checkpoints_total{job_id="a",status="COMPLETED"} 2',
        'sparkpoint_checkpoints_total{job_id="a",status="FAILED"} 1',
        'sparkpoint_checkpoints_total{job_id="a",status="IN_PROGRESS"} 1',
        "# HELP sparkpoint_checkpoint_last_duration_ms End-to-end duration of the job's latest "
        "completed checkpoint, in milliseconds.",
        "# TYPE sparkpoint_checkpoint_last_duration_ms gauge",
        'sparkpoint_checkpoint_last_duration_ms{job_id="a"} 20.0',
        "# HELP sparkpoint_checkpoint_last_size_bytes State size of the job's latest completed "
        "checkpoint, in bytes.",
        "# TYPE sparkpoint_checkpoint_last_size_bytes gauge",
        'sparkpoint_checkpoint_last_size_bytes{job_id="a"} 8192',
        "# HELP sparkpoint_job_restarts_total Restarts of the job decided by its restart strategy.",
        "# TYPE sparkpoint_job_restarts_total counter",
        'sparkpoint_job_restarts_total{job_id="a"} 2',
        f'sparkpoint_job_restarts_total{{job_id="{b}"}} 0',
        "# HELP sparkpoint_job_status 1 for the job's current status, 0 for the others.",
        "# TYPE sparkpoint_job_status gauge",
        *(
            f'sparkpoint_job_status{{job_id="{job}",status="{s}"}} {int(s == current)}'
            for job, current in (("a", "RUNNING"), (b, "FAILED"))
            for s in statuses
        ),
        "# HELP sparkpoint_events_ingested_total Job events applied by the ingest.",
        "# TYPE sparkpoint_events_ingested_total counter",
        "sparkpoint_events_ingested_total 1234",
        "# HELP sparkpoint_dead_letters_total Messages moved to the dead-letter stream.",
        "# TYPE sparkpoint_dead_letters_total counter",
        "sparkpoint_dead_letters_total 1",
        "# HELP sparkpoint_stale_messages_total Events refused because they carry an older job "
        "attempt.",
        "# TYPE sparkpoint_stale_messages_total counter",
        "sparkpoint_stale_messages_total 2",
        "# HELP sparkpoint_ingest_batches_total Batches of events read from Redis.",
        "# TYPE sparkpoint_ingest_batches_total counter",
        "sparkpoint_ingest_batches_total 3",
        "# HELP sparkpoint_ingest_handler_errors_total Events whose handler failed (retried "
        "later).",
        "# TYPE sparkpoint_ingest_handler_errors_total counter",
        "sparkpoint_ingest_handler_errors_total 4",
        "# HELP sparkpoint_redis_errors_total Errors talking to Redis.",
        "# TYPE sparkpoint_redis_errors_total counter",
        "sparkpoint_redis_errors_total 5",
    ]
    lines = response.text.splitlines()
    assert lines[: len(expected)] == expected
    # Then this process's garbage-collector pauses (their own test below).
    assert [line.split("{")[0] for line in lines[len(expected) :] if line[0] != "#"] == [
        f"sparkpoint_gc_{name}"
        for name in ("collections_total", "pause_seconds_total")
        for _ in range(3)
    ] + ["sparkpoint_gc_pause_max_seconds"] * 3
    assert response.text.endswith("\n")


def test_metrics_render_the_garbage_collectors_pauses_it_measured() -> None:
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    try:
        gc.collect(1)
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses)
    assert pauses.collections[1] == pauses.collections[2] == 1
    assert 0 < pauses.longest[2] <= pauses.seconds[2] < 5

    text = render_metrics(MetricsSnapshot(), object(), pauses)
    lines = text.splitlines()
    start = lines.index("# TYPE sparkpoint_gc_collections_total counter")
    assert lines[start + 1 : start + 4] == [
        'sparkpoint_gc_collections_total{generation="0"} 0',
        'sparkpoint_gc_collections_total{generation="1"} 1',
        'sparkpoint_gc_collections_total{generation="2"} 1',
    ]
    assert f'sparkpoint_gc_pause_max_seconds{{generation="2"}} {pauses.longest[2]!r}' in lines


def test_metrics_count_missing_ingest_stats_as_zero(make_client: AppFactory) -> None:
    client = make_client(ingest_stats=object())

    lines = client.get("/metrics").text.splitlines()

    assert "sparkpoint_events_ingested_total 0" in lines
    assert "sparkpoint_redis_errors_total 0" in lines
    assert not any(line.startswith("sparkpoint_checkpoints_total") for line in lines)


def test_metrics_say_whether_the_engine_runs_and_leave_its_families_empty_when_not() -> None:
    stats = IngestStats(events_ingested=7, read_through_ms=1_700_000_000_250)
    one_process = render_metrics(MetricsSnapshot(), stats).splitlines()
    assert "sparkpoint_events_ingested_total 7" in one_process
    assert "sparkpoint_ingest_read_through_timestamp_seconds 1700000000.25" in one_process
    assert not any(line.startswith("sparkpoint_engine_") for line in one_process)

    up = render_metrics(MetricsSnapshot(), stats, engine=(True, 2)).splitlines()
    assert "sparkpoint_engine_up 1" in up and "sparkpoint_engine_restarts_total 2" in up
    assert "sparkpoint_events_ingested_total 7" in up

    down = render_metrics(MetricsSnapshot(), None, engine=(False, 2)).splitlines()
    assert "sparkpoint_engine_up 0" in down and "sparkpoint_engine_restarts_total 2" in down
    assert "# TYPE sparkpoint_events_ingested_total counter" in down
    assert not any(line.startswith("sparkpoint_events_ingested_total ") for line in down)
    assert not any(line.startswith("sparkpoint_ingest_read_through_") for line in down)
    before_any_read = render_metrics(MetricsSnapshot(), IngestStats()).splitlines()
    assert not any(line.startswith("sparkpoint_ingest_read_through_") for line in before_any_read)


def test_label_values_and_numbers_follow_the_text_format() -> None:
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    assert [format_value(v) for v in (3, 2.5, float("nan"), float("inf"), -float("inf"))] == [
        "3",
        "2.5",
        "NaN",
        "+Inf",
        "-Inf",
    ]


def test_healthz_checks_the_database(client: TestClient) -> None:
    response = client.get("/healthz")

    assert response.status_code == 200
    # The ingest has not read yet (a fresh IngestStats).
    assert response.json() == {"status": "ok", "ingest": {"read-through": None, "behind-ms": None}}


def test_healthz_says_how_far_behind_its_events_the_ingest_is(make_client: AppFactory) -> None:
    read_through = int(time.time() * 1000) - 2_500
    client = make_client(ingest_stats=IngestStats(read_through_ms=read_through))

    ingest = client.get("/healthz").json()["ingest"]

    assert ingest["read-through"] == read_through
    assert 2_500 <= ingest["behind-ms"] < 60_000
    # Counters without that figure (an older engine): the answer leaves it out.
    assert make_client(ingest_stats=object()).get("/healthz").json() == {"status": "ok"}


def test_healthz_is_503_with_the_error_when_the_database_is_unreachable() -> None:
    engine = create_db_engine("sqlite:////nonexistent-dir/sparkpoint.db")
    client = TestClient(build_app(session_factory(engine)), raise_server_exceptions=False)

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "errors": ["database unreachable: OperationalError: unable to open database file"],
    }
    engine.dispose()


def test_healthz_needs_no_token_even_when_reads_are_protected(make_client: AppFactory) -> None:
    client = make_client(api_token="s3cret", protect_reads=True)

    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 401
