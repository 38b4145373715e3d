"""Exactly-once into SQL: the PV job with a SqlSink on SQLite, with and without a failure.

The committed table must hold the same multiset of (app_id, pv) rows whether or not a keyed
task failed mid-epoch and the job restored its latest checkpoint, and both must equal what the
source implies (pv 1..n for an app with n events), with nothing left staged.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import BigInteger, String

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.connectors.sql_sink import SqlSink, dispose_engines
from sparkpoint.events import EventSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode, JobStatus
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection

from .pv_harness import APPS, EPOCH_RECORDS, EVENTS, drive, expected_every_lines

pytestmark = pytest.mark.spark

TABLE = "pv_counts"


def run_pv_sql(
    spark: Any,
    base: Path,
    name: str,
    failure: FailureInjection | None = None,
    *,
    url: str | None = None,
    table: str = TABLE,
    attempts: int = 2,
    event_sink: EventSink | None = None,
    from_checkpoint: str | None = None,
) -> tuple[JobResult, str]:
    """The PV job of ``pv_harness.run_pv`` (same options), writing into ``table`` at ``url``
    (None: a SQLite file of its own); returns the URL."""
    url = url or f"sqlite:///{base / name / 'pv.db'}"
    (base / name).mkdir(parents=True)
    options = JobOptions(
        job_id=f"pv-sql-{name}",
        checkpoint=CheckpointConfig(mode=CheckpointingMode.EXACTLY_ONCE, interval_ms=1),
        checkpoint_dir=f"file://{base / name / 'chk'}",
        checkpoint_storage="filesystem",
        local_dir=str(base / name / "local"),
        parallelism=2,
        max_epoch_records=EPOCH_RECORDS,
        min_epoch_records=EPOCH_RECORDS,
        from_checkpoint=from_checkpoint,
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": str(attempts),
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
    )
    env = StreamExecutionEnvironment(options)
    source = GeneratorSource(events=EVENTS, apps=APPS, rate=0, splits=2)
    sink = SqlSink(url, table, {"app_id": String(32), "pv": BigInteger})
    (
        env.from_source(source, uid="events")
        .key_by("app_id")
        .count(uid="pv", output="pv", emit="every")
        .sink_to(sink, uid="sink")
    )
    env.graph.name = "pv-count-sql"
    result = drive(env.graph, options, spark, failure, event_sink)
    dispose_engines()
    return result, url


def expected_rows() -> Counter[tuple[Any, ...]]:
    """The (app_id, pv) rows the source implies: pv 1..n for an app with n events."""
    expected: Counter[tuple[Any, ...]] = Counter()
    for line, n in expected_every_lines().items():
        record = json.loads(line)
        expected[(record["app_id"], record["pv"])] += n
    return expected


def table_rows(url: str, table: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = [tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {table}")]
    engine.dispose()
    return rows


def test_a_failure_and_restore_commit_exactly_the_rows_of_a_failure_free_run(
    spark: Any, tmp_path: Path
) -> None:
    clean, clean_url = run_pv_sql(spark, tmp_path, "clean")
    assert clean.status is JobStatus.FINISHED and clean.restores == []
    assert len(clean.completed_checkpoints) >= 5
    failure = FailureInjection("keyed", subtask=1, records=200, at_epoch=3)
    failed, failed_url = run_pv_sql(spark, tmp_path, "failed", failure=failure)
    assert failed.status is JobStatus.FINISHED
    assert failed.attempt == 2 and len(failed.restores) == 1
    assert failed.restores[0] is not None  # a checkpoint was restored, not the start

    baseline = Counter(table_rows(clean_url, TABLE))
    assert Counter(table_rows(failed_url, TABLE)) == baseline
    assert baseline == expected_rows()
    assert sum(baseline.values()) == EVENTS
    for url in (clean_url, failed_url):
        assert table_rows(url, TABLE + "__sparkpoint_staged") == []  # nothing left uncommitted
        log = table_rows(url, TABLE + "__sparkpoint_commits")
        assert sum(row[3] for row in log) == EVENTS  # each transaction logged once
