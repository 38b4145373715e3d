"""Latency of ``GET /jobs/{id}/checkpoints`` with 10,000 checkpoints stored for one job.

    .venv/bin/python tests/benchmarks/bench_api.py            # SQLite, then PostgreSQL
    .venv/bin/python tests/benchmarks/bench_api.py --no-postgres

Stores one job with 10,000 checkpoints (94% completed, 4% failed, 2% savepoints, the newest
in progress) and five subtask rows each in a migrated SQLite file (and, unless told not to, in
a PostgreSQL database of its own on the server of ``DATABASE_TEST_URL``, dropped afterwards),
then times GETs through FastAPI's TestClient after a warm-up: the statistics endpoint (DESIGN
§6: p99 <= 50 ms, goal 20 ms) and, for reference, the job list and one checkpoint's details.
Writes ``tests/benchmarks/results/api_latency.md|json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "jobs"), str(ROOT / "backend")]

from bench_pv import write_results  # noqa: E402  (the shared result writer)
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import create_engine, insert, text  # noqa: E402

from sparkpoint_server.api import install_api  # noqa: E402
from sparkpoint_server.config import Settings, normalize_database_url  # noqa: E402
from sparkpoint_server.storage.db import create_db_engine, migrate, session_factory  # noqa: E402
from sparkpoint_server.storage.models import Checkpoint, CheckpointSubtask, Job  # noqa: E402

JOB = "bench-job"
T0 = 1_700_000_000_000
OPERATORS = (("source", 2), ("count", 3))


def populate(url: str, checkpoints: int) -> None:
    """One job, ``checkpoints`` checkpoints and five subtask rows per checkpoint."""
    rng = random.Random(7)
    engine = create_db_engine(url)
    graph = {
        "vertices": [
            {"id": op, "name": op, "parallelism": n, "operators": [op]} for op, n in OPERATORS
        ],
        "edges": [["source", "count"]],
    }
    rows, subtasks = [], []
    for cid in range(1, checkpoints + 1):
        roll = rng.random()
        status = "FAILED" if roll < 0.04 else "COMPLETED"
        status = "IN_PROGRESS" if cid == checkpoints else status
        done = status == "COMPLETED"
        trigger = T0 + 1000 * cid
        e2e = rng.lognormvariate(3.5, 0.5)
        rows.append(
            {
                "job_id": JOB,
                "checkpoint_id": cid,
                "attempt": 1 + cid // 2000,
                "kind": "savepoint" if 0.04 <= roll < 0.06 else "checkpoint",
                "is_final": False,
                "status": status,
                "trigger_timestamp": trigger,
                "latest_ack_timestamp": trigger + int(e2e) if done else None,
                "completion_timestamp": trigger + int(e2e) if status != "IN_PROGRESS" else None,
                "end_to_end_duration": e2e if done else None,
                "state_size": rng.randint(1 << 20, 2 << 20) if done else 0,
                "checkpointed_size": rng.randint(1 << 16, 1 << 18) if done else 0,
                "alignment_buffered": rng.randint(0, 1 << 16) if done else 0,
                "num_subtasks": 5,
                "num_acknowledged_subtasks": 5 if done else 2,
                "external_path": f"file:///chk/{JOB}/chk-{cid}" if done else None,
                "target_directory": None,
                "failure_reason": None if status != "FAILED" else "CHECKPOINT_EXPIRED",
                "failure_message": None if status != "FAILED" else "expired",
                "discarded": cid < checkpoints - 3,
                "committed": done,
                "request_id": None,
            }
        )
        for op, parallelism in OPERATORS:
            for subtask in range(parallelism):
                subtasks.append(
                    {
                        "job_id": JOB,
                        "checkpoint_id": cid,
                        "operator_id": op,
                        "subtask": subtask,
                        "attempt": 1,
                        "barrier_timestamp": trigger + 5,
                        "alignment_duration": 1.0,
                        "alignment_buffered": 100,
                        "alignment_buffered_records": 10,
                        "ack_timestamp": trigger + 30 if done else None,
                        "start_delay": 2.0,
                        "sync_duration": 3.0,
                        "async_duration": 10.0,
                        "state_size": 1 << 18,
                        "checkpointed_size": 1 << 14,
                        "end_to_end_duration": 30.0,
                        "clock_flagged": False,
                        "declined_reason": None,
                        "ack": {
                            "handles": [
                                {
                                    "path": f"file:///chk/{cid}/{op}-{subtask}",
                                    "size": 1 << 14,
                                    "checksum": "sha256:00",
                                }
                            ]
                        },
                    }
                )
    with engine.begin() as conn:
        conn.execute(
            insert(Job),
            [
                {
                    "job_id": JOB,
                    "name": "bench",
                    "status": "RUNNING",
                    "attempt": 6,
                    "incarnation": None,
                    "created_at": T0,
                    "updated_at": T0,
                    "start_time": T0,
                    "end_time": None,
                    "graph": graph,
                    "config": {"state_backend": "rocksdb"},
                    "checkpoint_config": {"interval_ms": 1000},
                    "restart_strategy": {"restart-strategy.type": "none"},
                    "restarts": 5,
                    "restored_checkpoint_id": 8000,
                    "restored_at": T0 + 8_000_500,
                    "restored_path": f"file:///chk/{JOB}/chk-8000",
                    "restored_is_savepoint": False,
                }
            ],
        )
        conn.execute(insert(Checkpoint), rows)
        conn.execute(insert(CheckpointSubtask), subtasks)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
    else:
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    engine.dispose()


def time_gets(
    client: TestClient,
    path: str,
    requests: int,
    warmup: int,
    before: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Milliseconds per GET of ``path`` (p50, p90, p99, mean, max) after ``warmup`` GETs.

    ``before`` runs ahead of every GET, outside the timing.
    """
    for _ in range(warmup):
        assert client.get(path).status_code == 200
    samples = []
    for _ in range(requests):
        if before is not None:
            before()
        started = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text
    samples.sort()
    return {
        "p50": statistics.median(samples),
        "p90": samples[int(0.90 * len(samples)) - 1],
        "p99": samples[int(0.99 * len(samples)) - 1],
        "mean": statistics.fmean(samples),
        "max": samples[-1],
        "bytes": len(response.content),
    }


def measure(url: str, requests: int, warmup: int, limit: int) -> dict[str, dict[str, float]]:
    """Time the endpoints on a fresh app; the last scenario adds a checkpoint before each GET."""
    engine = create_db_engine(url)
    app = FastAPI()
    app.state.settings = Settings(api_token=None, default_history=limit)
    app.state.session_factory = session_factory(engine)
    app.state.control_plane = None
    app.state.ingest_stats = None
    install_api(app)
    stats_path = f"/jobs/{JOB}/checkpoints"
    paths = {
        "GET /healthz (framework and TestClient only)": "/healthz",
        "GET /jobs/{id}/checkpoints": stats_path,
        "GET /jobs": "/jobs",
        "GET /jobs/{id}/checkpoints/details/{n}": f"/jobs/{JOB}/checkpoints/details/9000",
    }
    next_id = iter(range(1_000_000, 2_000_000))

    def complete_one() -> None:
        with engine.begin() as conn:
            conn.execute(insert(Checkpoint), [_completed_row(next(next_id))])

    results: dict[str, dict[str, float]] = {}
    try:
        with TestClient(app) as client:
            started = time.perf_counter()
            response = client.get(stats_path)
            first = (time.perf_counter() - started) * 1000
            assert response.status_code == 200
            results["first GET /jobs/{id}/checkpoints (reads every completed row)"] = {
                **dict.fromkeys(("p50", "p90", "p99", "mean", "max"), first),
                "bytes": len(response.content),
            }
            for name, path in paths.items():
                results[name] = time_gets(client, path, requests, warmup)
            results["GET /jobs/{id}/checkpoints, a new completed checkpoint before each"] = (
                time_gets(client, stats_path, requests, warmup, before=complete_one)
            )
    finally:
        engine.dispose()
    return results


def _completed_row(checkpoint_id: int) -> dict[str, Any]:
    trigger = T0 + 1000 * checkpoint_id
    return {
        "job_id": JOB,
        "checkpoint_id": checkpoint_id,
        "attempt": 3,
        "kind": "checkpoint",
        "is_final": False,
        "status": "COMPLETED",
        "trigger_timestamp": trigger,
        "latest_ack_timestamp": trigger + 33,
        "completion_timestamp": trigger + 35,
        "end_to_end_duration": 35.0,
        "state_size": 1 << 20,
        "checkpointed_size": 1 << 16,
        "alignment_buffered": 0,
        "num_subtasks": 5,
        "num_acknowledged_subtasks": 5,
        "external_path": f"file:///chk/{JOB}/chk-{checkpoint_id}",
    }


@contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database of its own, dropped afterwards."""
    name = f"sparkpoint_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = admin_url.rsplit("/", 1)[0] + f"/{name}"
        migrate(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    populate(url, args.checkpoints)
    filled = time.perf_counter() - started
    print(f"  stored {args.checkpoints:,} checkpoints in {filled:.1f} s", flush=True)
    return measure(url, args.requests, args.warmup, args.limit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--limit", type=int, default=100, help="history entries per answer")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-api-") as base:
        url = f"sqlite:///{base}/sparkpoint.db"
        migrate(url)
        print("SQLite", flush=True)
        results["SQLite"] = run(url, args)
    if not args.no_postgres:
        admin = normalize_database_url(
            os.environ.get("DATABASE_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")
        )
        print("PostgreSQL", flush=True)
        try:
            with postgres_database(admin) as pg_url:
                results["PostgreSQL"] = run(pg_url, args)
        except Exception as err:
            print(f"  PostgreSQL skipped: {type(err).__name__}: {err}", flush=True)
    rows = [
        "| database | endpoint | p50 | p90 | p99 | mean | max | answer size |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for database, endpoints in results.items():
        for endpoint, r in endpoints.items():
            rows.append(
                f"| {database} | `{endpoint}` | {r['p50']:.1f} ms | {r['p90']:.1f} ms "
                f"| {r['p99']:.1f} ms | {r['mean']:.1f} ms | {r['max']:.1f} ms "
                f"| {r['bytes'] / 1024:.0f} KiB |"
            )
    load = os.getloadavg()[0]
    stats_p99 = results["SQLite"]["GET /jobs/{id}/checkpoints"]["p99"]
    verdict = "meets" if stats_p99 <= 20 else ("within" if stats_p99 <= 50 else "MISSES")
    header = (
        f"REST API latency, one job with {args.checkpoints:,} checkpoints (5 subtasks each), "
        f"history limit {args.limit}, {args.requests} GETs after {args.warmup} warm-up, "
        f"FastAPI TestClient, {os.cpu_count()} cores (load average {load:.1f} at the end: "
        f"other processes shared them), Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    footer = (
        f"\nSQLite `GET /jobs/{{id}}/checkpoints` p99 **{stats_p99:.1f} ms**: {verdict} "
        "the target (first milestone <= 50 ms, goal <= 20 ms)."
    )
    table = header + "\n\n" + "\n".join(rows) + "\n" + footer
    write_results("api_latency", table, {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
