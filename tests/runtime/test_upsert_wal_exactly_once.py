"""The seeds' idempotent and write-ahead-log sinks through Spark, with failures.

The PV job (``pv_harness``: 12,000 events of 7 apps, 6 epochs, a checkpoint in each) counts
events per app and emits every new count. Into the upsert sink keyed by ``app_id`` the final
table must hold each app's true count, equal to a failure-free run, on SQLite and PostgreSQL,
after a failure mid-epoch and after a pre-commit (replays overwrite). Into the write-ahead-log
sink the appended file must equal the oracle (one line per event, pv 1..n) after a failure
mid-epoch and after a pre-commit, must not hold a completed checkpoint's records before they
were committed, and a failure in the middle of a commit must leave those records that were sent
before it twice in the file (at-least-once), losing none.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import BigInteger, String

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sinks import TwoPhaseCommitSink
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.connectors.sql_sink import dispose_engines
from sparkpoint.connectors.upsert_sink import UpsertSink
from sparkpoint.connectors.wal_sink import WAL_SUFFIX, JsonLinesWriteAheadSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode, JobStatus
from sparkpoint.runtime.authority import JobFailedError
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection

from .connectors.test_wal_sink import FailingMidSend
from .pv_harness import APPS, EPOCH_RECORDS, EVENTS, drive, expected_every_lines, true_counts

pytestmark = pytest.mark.spark

PG_URL = os.environ.get(
    "SPARKPOINT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MID_EPOCH = FailureInjection("keyed", subtask=1, records=200, at_epoch=3)
AFTER_PRE_COMMIT = FailureInjection("after_pre_commit", subtask=0, checkpoint_id=2)


def run_pv(
    spark: Any,
    base: Path,
    name: str,
    sink: TwoPhaseCommitSink,
    failure: FailureInjection | None = None,
    restart: str = "fixed-delay",
) -> JobResult:
    """The PV job of ``pv_harness.run_pv`` (same options) writing into ``sink``."""
    restart_conf = {"restart-strategy.type": restart}
    if restart == "fixed-delay":
        restart_conf |= {
            "restart-strategy.fixed-delay.attempts": "2",
            "restart-strategy.fixed-delay.delay": "0 ms",
        }
    options = JobOptions(
        job_id=f"pv-{name}",
        checkpoint=CheckpointConfig(mode=CheckpointingMode.EXACTLY_ONCE, interval_ms=1),
        checkpoint_dir=f"file://{base / name / 'chk'}",
        checkpoint_storage="filesystem",
        local_dir=str(base / name / "local"),
        parallelism=2,
        max_epoch_records=EPOCH_RECORDS,
        min_epoch_records=EPOCH_RECORDS,
        restart_strategy=restart_conf,
    )
    env = StreamExecutionEnvironment(options)
    source = GeneratorSource(events=EVENTS, apps=APPS, rate=0, splits=2)
    (
        env.from_source(source, uid="events")
        .key_by("app_id")
        .count(uid="pv", output="pv", emit="every")
        .sink_to(sink, uid="sink")
    )
    env.graph.name = "pv-count-sinks"
    try:
        return drive(env.graph, options, spark, failure)
    finally:
        dispose_engines()


# ----------------------------------------------------------------------------- upsert sink
@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(URL, a table name of this test's own) on SQLite, then on PostgreSQL; dropped after."""
    table = f"sp_upsert_{uuid.uuid4().hex[:12]}"
    url = f"sqlite:///{tmp_path / 'upsert.db'}" if request.param == "sqlite" else PG_URL
    args = {"connect_timeout": 5} if request.param == "postgresql" else {}
    engine = sa.create_engine(url, connect_args=args)
    try:
        engine.connect().close()
    except sa.exc.OperationalError as err:
        engine.dispose()
        if os.environ.get("CI"):
            pytest.fail(f"{url} is not reachable: {err.orig}")
        pytest.skip(reason=f"{url} is not reachable ({err.orig})")
    yield url, table
    dispose_engines()
    with engine.begin() as conn:
        for name in (f"{table}_clean", f"{table}_mid_epoch", f"{table}_pre_commit"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
    engine.dispose()


def upserted(url: str, table: str) -> tuple[dict[str, int], set[int]]:
    """app_id -> pv as the table holds them, and the job attempts that wrote them."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        found = conn.exec_driver_sql(f"SELECT app_id, pv, _sp_attempt FROM {table}").all()
    engine.dispose()
    assert len({a for a, _, _ in found}) == len(found)  # one row per key
    return {a: int(pv) for a, pv, _ in found}, {int(att) for _, _, att in found}


def test_upsert_replays_overwrite_to_the_table_of_a_failure_free_run(
    engine: Any, tmp_path: Path, database: tuple[str, str]
) -> None:
    url, table = database
    columns: dict[str, Any] = {"app_id": String(32), "pv": BigInteger}

    def run(name: str, failure: FailureInjection | None) -> dict[str, int]:
        sink = UpsertSink(url, f"{table}_{name}", columns, key_columns=["app_id"])
        assert sink.delivery == "idempotent"
        result = run_pv(engine, tmp_path, name, sink, failure)
        assert result.status is JobStatus.FINISHED
        assert result.restores == ([] if failure is None else [result.restores[0]])
        if failure is not None:  # a checkpoint was restored, not the start
            assert result.attempt == 2 and result.restores[0] is not None
        counts, attempts = upserted(url, f"{table}_{name}")
        # Every app has records after the restored checkpoint: the replay rewrote its row.
        assert attempts == {result.attempt}
        return counts

    clean = run("clean", None)
    assert clean == true_counts()  # the plain-Python oracle
    assert run("mid_epoch", MID_EPOCH) == clean
    assert run("pre_commit", AFTER_PRE_COMMIT) == clean


# ----------------------------------------------------------------------------- WAL sink
def wal_lines(sink: JsonLinesWriteAheadSink) -> list[str]:
    """Every record still in the sink's write-ahead log (parts not sent)."""
    lines: list[str] = []
    for name in os.listdir(sink.wal_directory):
        if name.endswith(WAL_SUFFIX):
            with open(os.path.join(sink.wal_directory, name), encoding="utf-8") as fh:
                lines.extend(fh.read().splitlines())
    return lines


@pytest.mark.parametrize(
    "failure", [None, MID_EPOCH, AFTER_PRE_COMMIT], ids=["clean", "mid-epoch", "pre-commit"]
)
def test_wal_output_equals_the_oracle_after_a_failure_before_a_commit(
    engine: Any, tmp_path: Path, failure: FailureInjection | None
) -> None:
    sink = JsonLinesWriteAheadSink(str(tmp_path / "out.jsonl"))
    result = run_pv(engine, tmp_path, "wal", sink, failure)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == (1 if failure is None else 2)
    assert Counter(sink.lines()) == expected_every_lines()  # no loss, no duplicate
    assert wal_lines(sink) == []  # every log part was sent and removed


def test_wal_sends_nothing_of_a_completed_checkpoint_before_its_commit(
    spark: Any, tmp_path: Path
) -> None:
    sink = JsonLinesWriteAheadSink(str(tmp_path / "out.jsonl"))
    failure = FailureInjection("before_commit", checkpoint_id=3)
    with pytest.raises(JobFailedError, match="before its sink transactions were committed"):
        run_pv(spark, tmp_path, "wal", sink, failure, restart="none")
    sent, logged = Counter(sink.lines()), Counter(wal_lines(sink))
    oracle = expected_every_lines()
    assert sent and logged  # checkpoints 1-2 sent; 3 completed, its records still in the log
    assert not sent & logged  # none of checkpoint 3's records reached the file
    assert sent + logged <= oracle and not sent - oracle


def test_wal_failure_mid_commit_duplicates_what_was_sent_and_loses_nothing(
    spark: Any, tmp_path: Path
) -> None:
    sink = FailingMidSend(str(tmp_path / "out.jsonl"), fail_at=3)
    result = run_pv(spark, tmp_path, "wal", sink)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2 and len(result.restores) == 1
    duplicated = Counter(sink.sent_before_failure)
    assert sum(duplicated.values()) > 0
    out, oracle = Counter(sink.lines()), expected_every_lines()
    assert not oracle - out  # nothing lost
    assert out - oracle == duplicated  # at-least-once: the half sent before the failure, twice
    assert wal_lines(sink) == []
