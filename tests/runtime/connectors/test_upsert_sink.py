"""The idempotent upsert sink on real SQLite and PostgreSQL: overwrite, fencing, configuration."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy import BigInteger, String

from sparkpoint.connectors.sinks import WriterContext
from sparkpoint.connectors.upsert_sink import UpsertSink
from sparkpoint.errors import ConfigurationError
from sparkpoint.records import Batch

COLUMNS: dict[str, Any] = {"app_id": String(32), "pv": BigInteger}


def ctx(attempt: int = 1, job_id: str = "job-a", subtask: int = 0, epoch: int = 0) -> WriterContext:
    return WriterContext(job_id, "sink", subtask, attempt, epoch, task_attempt=0)


def rows(url: str, table: str) -> dict[str, tuple[int, int]]:
    """app_id -> (pv, attempt) as the table holds them."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        found = conn.exec_driver_sql(f"SELECT app_id, pv, _sp_attempt FROM {table}").all()
    engine.dispose()
    return {a: (int(pv), int(att)) for a, pv, att in found}


def write(sink: UpsertSink, context: WriterContext, records: list[dict[str, Any]]) -> None:
    writer = sink.writer(context, None)
    writer.write(Batch.of_rows(records))
    writer.close_epoch()


def test_rows_are_visible_as_written_and_a_replay_overwrites(db: tuple[str, str]) -> None:
    url, table = db
    sink = UpsertSink(url, table, COLUMNS, key_columns=["app_id"], flush_rows=2)
    writer = sink.writer(ctx(), None)
    writer.write(Batch.of_rows([{"app_id": "a", "pv": 1}, {"app_id": "b", "pv": 1}]))
    assert rows(url, table) == {"a": (1, 1), "b": (1, 1)}  # flushed at flush_rows, no commit
    writer.write(Batch.of_columns(app_id=np.array(["a", "a", "c"]), pv=np.array([2, 3, 1])))
    txn = writer.pre_commit(1)
    assert txn.parts == [] and txn.records == 5
    assert sink.commit("sink", txn) == 0
    first = rows(url, table)
    assert first == {"a": (3, 1), "b": (1, 1), "c": (1, 1)}  # the last record of a key wins
    # A restore replays the same records (attempt 2): same values, nothing added.
    write(sink, ctx(attempt=2), [{"app_id": "a", "pv": 2}, {"app_id": "a", "pv": 3}])
    assert rows(url, table) == first | {"a": (3, 2)}
    assert sink.abort_uncommitted("job-a", "sink", keep=set()) == 0
    assert rows(url, table) == first | {"a": (3, 2)}  # an abort removes nothing


def test_a_task_of_an_earlier_attempt_cannot_overwrite_what_the_replay_wrote(
    db: tuple[str, str],
) -> None:
    url, table = db
    sink = UpsertSink(url, table, COLUMNS, key_columns=("app_id",))
    write(sink, ctx(attempt=1), [{"app_id": "a", "pv": 5}, {"app_id": "b", "pv": 7}])
    write(sink, ctx(attempt=2), [{"app_id": "a", "pv": 9}])
    # A killed task of attempt 1 still writing after the restore: fenced for "a", not "b".
    write(sink, ctx(attempt=1), [{"app_id": "a", "pv": 6}, {"app_id": "b", "pv": 8}])
    assert rows(url, table) == {"a": (9, 2), "b": (8, 1)}
    # Another job (a re-run into the same table) overwrites, whatever its attempt.
    write(sink, ctx(attempt=1, job_id="job-b"), [{"app_id": "a", "pv": 1}])
    assert rows(url, table)["a"] == (1, 1)


def test_a_composite_key_upserts_per_combination(db: tuple[str, str]) -> None:
    url, table = db
    columns: dict[str, Any] = {"region": String(16), "app_id": String(32), "pv": BigInteger}
    sink = UpsertSink(url, table, columns, key_columns=["region", "app_id"])
    records = [
        {"region": "eu", "app_id": "a", "pv": 1},
        {"region": "us", "app_id": "a", "pv": 2},
        {"region": "eu", "app_id": "a", "pv": 3},
    ]
    write(sink, ctx(), records)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        found = sorted(conn.exec_driver_sql(f"SELECT region, app_id, pv FROM {table}").all())
    engine.dispose()
    assert [tuple(r) for r in found] == [("eu", "a", 3), ("us", "a", 2)]


def test_an_existing_table_needs_a_unique_key_on_the_key_columns(db: tuple[str, str]) -> None:
    url, table = db
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {table} (app_id VARCHAR(32), pv BIGINT, "
            "_sp_job VARCHAR(32), _sp_attempt INTEGER)"
        )
    engine.dispose()
    with pytest.raises(ConfigurationError, match=r"no primary key or unique constraint.*app_id"):
        UpsertSink(url, table, COLUMNS, key_columns=["app_id"])


def test_an_existing_table_needs_the_fencing_columns(db: tuple[str, str]) -> None:
    url, table = db
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (app_id VARCHAR(32) PRIMARY KEY, pv BIGINT)")
    engine.dispose()
    with pytest.raises(ConfigurationError, match=r"without column.*_sp_job, _sp_attempt"):
        UpsertSink(url, table, COLUMNS, key_columns=["app_id"])


@pytest.mark.parametrize(
    ("url", "keys", "message"),
    [
        ("sqlite:////tmp/x.db", ["user"], "key_columns must name distinct columns"),
        ("sqlite:////tmp/x.db", [], "key_columns must name distinct columns"),
        ("sqlite:///relative.db", ["app_id"], "absolute file path"),
        ("mysql://u:secret@h/db", ["app_id"], "PostgreSQL or SQLite"),
        ("not a url", ["app_id"], "is not a database URL"),
    ],
)
def test_configuration_errors_name_the_problem(url: str, keys: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as err:
        UpsertSink(url, "pv", COLUMNS, key_columns=keys)
    assert "secret" not in str(err.value)


def test_a_table_name_leaves_room_for_the_temporary_tables_suffix() -> None:
    with pytest.raises(ConfigurationError, match=r"table name 'p{53}' is not an identifier"):
        UpsertSink("sqlite:////tmp/x.db", "p" * 53, COLUMNS, key_columns=["app_id"])


def test_a_record_without_its_key_is_refused(db: tuple[str, str]) -> None:
    url, table = db
    sink = UpsertSink(url, table, COLUMNS, key_columns=["app_id"])
    writer = sink.writer(ctx(), None)
    with pytest.raises(ConfigurationError, match="no value for key column"):
        writer.write(Batch.of_rows([{"app_id": None, "pv": 1}]))
    with pytest.raises(ConfigurationError, match="must be a dict with the fields app_id, pv"):
        writer.write(Batch.of_rows([{"pv": 1}]))
