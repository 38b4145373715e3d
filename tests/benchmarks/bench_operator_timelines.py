"""How long ``GET /jobs/{id}/checkpoints/operators?limit=1000`` takes to read its answer.

A job of three operators (parallelism 2, 8 and 1) with 1,000 completed checkpoints, each with
its 11 subtask rows, on SQLite (a file) and on PostgreSQL (a database of its own on
``DATABASE_TEST_URL``, dropped afterwards): the median of 7 calls of the query behind the
route, which the dashboard's Operators tab calls with ``limit=100`` every refresh.

    .venv/bin/python tests/benchmarks/bench_operator_timelines.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]  # the test builders

from sqlalchemy import create_engine, insert, text  # noqa: E402
from tests.server.api.builders import T0, add_job  # noqa: E402

from sparkpoint_server.config import normalize_database_url  # noqa: E402
from sparkpoint_server.storage.db import create_db_engine, migrate, session_factory  # noqa: E402
from sparkpoint_server.storage.models import Checkpoint, CheckpointSubtask  # noqa: E402
from sparkpoint_server.storage.operator_timelines import operator_timelines  # noqa: E402

CHECKPOINTS, ROUNDS = 1000, 7
OPERATORS = (("source", 2), ("window", 8), ("sink", 1))


def _rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    checkpoints, subtasks = [], []
    for cid in range(1, CHECKPOINTS + 1):
        trigger = T0 + 1000 * cid
        checkpoints.append(
            dict(job_id="bench", checkpoint_id=cid, attempt=1, kind="checkpoint", is_final=False)
            | dict(status="COMPLETED", trigger_timestamp=trigger, latest_ack_timestamp=trigger + 50)
            | dict(completion_timestamp=trigger + 60, end_to_end_duration=50.0, state_size=1)
            | dict(checkpointed_size=1, alignment_buffered=0, num_subtasks=11)
            | dict(num_acknowledged_subtasks=11, discarded=False, committed=True)
        )
        for operator, parallelism in OPERATORS:
            for i in range(parallelism):
                subtasks.append(
                    dict(job_id="bench", checkpoint_id=cid, operator_id=operator, subtask=i)
                    | dict(attempt=1, ack_timestamp=trigger + 10 + i, end_to_end_duration=10.0 + i)
                    | dict(sync_duration=1.0, async_duration=2.0, alignment_duration=0.5)
                    | dict(start_delay=1.0, state_size=10, checkpointed_size=5)
                    | dict(clock_flagged=False)
                )
    return checkpoints, subtasks


def measure(url: str) -> str:
    """Seed a migrated database at ``url`` and time the query; one line of results."""
    migrate(url)
    engine = create_db_engine(url)
    sessions = session_factory(engine)
    graph = {"vertices": [{"id": o, "name": o, "parallelism": p} for o, p in OPERATORS]}
    checkpoints, subtasks = _rows()
    try:
        with sessions() as s:
            add_job(s, "bench", graph=graph)
            s.flush()
            s.execute(insert(Checkpoint), checkpoints)
            s.execute(insert(CheckpointSubtask), subtasks)
            s.commit()
        times = []
        for _ in range(ROUNDS):
            with sessions() as s:
                start = time.perf_counter()
                answer = operator_timelines(s, "bench", CHECKPOINTS)
                times.append((time.perf_counter() - start) * 1000)
        assert [len(o["checkpoints"]) for o in answer["operators"]] == [CHECKPOINTS] * 3
    finally:
        engine.dispose()
    return (
        f"{url.split(':')[0]}: {CHECKPOINTS} checkpoints, {len(subtasks)} subtask rows: "
        f"median {statistics.median(times):.0f} ms, min {min(times):.0f} ms"
    )


def main() -> None:
    print(measure(f"sqlite:///{tempfile.mkdtemp()}/bench.db"))
    admin_url = normalize_database_url(
        os.environ.get("DATABASE_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")
    )
    name = f"sparkpoint_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        print(measure(admin_url.rsplit("/", 1)[0] + f"/{name}"))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
