"""The transactional SQL sink on SQLite and PostgreSQL: staging, one-transaction commit, abort."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy import BigInteger, String

from sparkpoint.connectors.sinks import WriterContext
from sparkpoint.connectors.sql_sink import SqlSink, SqlSinkUnavailableError
from sparkpoint.errors import CheckpointError, ConfigurationError
from sparkpoint.records import Batch, DictColumn

COLUMNS: dict[str, Any] = {"app_id": String, "pv": BigInteger}


def _ctx(epoch: int = 0, task_attempt: int = 7, subtask: int = 0) -> WriterContext:
    return WriterContext("0123456789", "sink", subtask, 1, epoch, task_attempt)


def _rows(url: str, table: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = [tuple(r) for r in conn.exec_driver_sql(f"SELECT app_id, pv FROM {table}")]
    engine.dispose()
    return sorted(rows)


def _count(url: str, table: str) -> int:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        n = conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar_one()
    engine.dispose()
    return int(n)


def test_rows_become_visible_only_when_committed(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    writer = sink.writer(_ctx(), None)
    writer.write(Batch.of_rows([{"app_id": "a", "pv": 1}, {"app_id": "b", "pv": 1}]))
    txn = writer.pre_commit(1)
    writer.write(Batch.of_rows([{"app_id": "a", "pv": 2}]))
    open_txn = writer.close_epoch()
    assert _rows(url, table) == []
    assert _count(url, sink.staged_table) == 3
    assert txn.records == 2 and open_txn.records == 1
    assert txn.parts == [f"{txn.transaction_id}.e0-t7"]
    assert sink.commit("sink", txn) == 1
    assert _rows(url, table) == [("a", 1), ("b", 1)]
    assert _count(url, sink.staged_table) == 1  # the open transaction's row stays staged
    assert _count(url, sink.commits_table) == 1
    assert sink.abort_uncommitted("0123456789", "sink", keep=set()) == 1
    assert _count(url, sink.staged_table) == 0
    assert _rows(url, table) == [("a", 1), ("b", 1)]


def test_commit_is_idempotent_also_from_another_process_copy(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    writer = sink.writer(_ctx(), None)
    writer.write(Batch.of_columns(app_id=np.array(["x", "y"]), pv=np.array([3, 4])))
    txn = writer.pre_commit(1)
    assert sink.commit("sink", txn) == 1
    assert sink.commit("sink", txn) == 0
    assert pickle.loads(pickle.dumps(sink)).commit("sink", txn) == 0  # as after a restore
    assert _rows(url, table) == [("x", 3), ("y", 4)]
    assert _count(url, sink.commits_table) == 1


def test_a_transaction_spans_epochs_and_moves_every_part(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS, flush_rows=2)  # several flushes per part
    w0 = sink.writer(_ctx(epoch=0), None)
    w0.write(Batch.of_rows([{"app_id": "e0", "pv": i} for i in range(5)]))
    carried = w0.close_epoch()
    w1 = sink.writer(_ctx(epoch=1, task_attempt=8), carried)
    w1.write(Batch.of_rows([{"app_id": "e1", "pv": np.int64(9)}]))  # numpy scalars bind too
    txn = w1.pre_commit(5)
    assert txn.transaction_id == carried.transaction_id
    assert txn.parts == [f"{txn.transaction_id}.e0-t7", f"{txn.transaction_id}.e1-t8"]
    assert txn.records == 6
    assert sink.commit("sink", txn) == 2
    assert _rows(url, table) == [*(("e0", i) for i in range(5)), ("e1", 9)]
    assert _count(url, sink.staged_table) == 0


def test_an_empty_epoch_lists_no_part_and_commits_nothing(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    w0 = sink.writer(_ctx(epoch=0), None)
    w0.write(Batch.of_rows([]))
    carried = w0.close_epoch()
    assert carried.parts == []
    w1 = sink.writer(_ctx(epoch=1), carried)
    w1.write(Batch.of_rows([{"app_id": "a", "pv": 1}]))
    txn = w1.pre_commit(1)
    assert txn.parts == [f"{txn.transaction_id}.e1-t7"]
    empty = w1.pre_commit(2)
    assert empty.parts == [] and empty.records == 0
    assert sink.commit("sink", empty) == 0
    assert sink.commit("sink", txn) == 1
    assert _rows(url, table) == [("a", 1)]


def test_abort_removes_staged_parts_not_kept(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    kept_writer = sink.writer(_ctx(subtask=0), None)
    kept_writer.write(Batch.of_rows([{"app_id": "keep", "pv": 1}]))
    kept = kept_writer.pre_commit(1)
    for subtask in (1, 2):
        w = sink.writer(_ctx(subtask=subtask), None)
        w.write(Batch.of_rows([{"app_id": "drop", "pv": subtask}] * 3))
        w.close_epoch()
    other = SqlSink(url, table, COLUMNS).writer(WriterContext("j", "other", 0, 1, 0, 0), None)
    other.write(Batch.of_rows([{"app_id": "other", "pv": 1}]))
    other.close_epoch()
    assert sink.abort_uncommitted("0123456789", "sink", keep=set(kept.parts)) == 2
    assert _count(url, sink.staged_table) == 2  # the kept part and sink "other"'s part
    assert sink.commit("sink", kept) == 1
    assert _rows(url, table) == [("keep", 1)]
    assert sink.abort_uncommitted("j", "other", keep=set()) == 1
    assert _count(url, sink.staged_table) == 0


def test_a_losing_task_attempts_rows_are_not_committed(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    w0 = sink.writer(_ctx(epoch=0), None)
    w0.write(Batch.of_rows([{"app_id": "before", "pv": 1}]))
    carried = w0.close_epoch()
    # Epoch 1 runs twice (task attempts 0 and 1) on copies of the same open transaction.
    losing = sink.writer(_ctx(epoch=1, task_attempt=0), pickle.loads(pickle.dumps(carried)))
    winning = sink.writer(_ctx(epoch=1, task_attempt=1), pickle.loads(pickle.dumps(carried)))
    losing.write(Batch.of_rows([{"app_id": "loser", "pv": 1}] * 4))
    losing.pre_commit(3)
    winning.write(Batch.of_rows([{"app_id": "winner", "pv": 1}]))
    txn = winning.pre_commit(3)
    assert _count(url, sink.staged_table) == 6
    assert sink.commit("sink", txn) == 2
    assert _rows(url, table) == [("before", 1), ("winner", 1)]
    assert _count(url, sink.staged_table) == 0  # the losing part went with its transaction


def test_a_missing_part_fails_loudly_and_commits_nothing(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    w0 = sink.writer(_ctx(epoch=0), None)
    w0.write(Batch.of_rows([{"app_id": "a", "pv": 1}]))
    w1 = sink.writer(_ctx(epoch=1), w0.close_epoch())
    w1.write(Batch.of_rows([{"app_id": "a", "pv": 2}]))
    txn = w1.pre_commit(1)
    lost = txn.parts[0]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        staged = sink.tables().staged
        conn.execute(sa.delete(staged).where(staged.c._sp_part == lost))
    engine.dispose()
    with pytest.raises(CheckpointError, match=rf"part {lost} has no rows") as info:
        sink.commit("sink", txn)
    assert txn.transaction_id in str(info.value) and "sink sink" in str(info.value)
    assert _rows(url, table) == [] and _count(url, sink.commits_table) == 0
    assert _count(url, sink.staged_table) == 1  # rolled back: the other part is still staged


def test_commit_refuses_part_names_it_did_not_write(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    writer = sink.writer(_ctx(), None)
    writer.write(Batch.of_rows([{"app_id": "a", "pv": 1}]))
    txn = writer.pre_commit(1).model_copy(update={"parts": ["another-txn.e0-t0"]})
    with pytest.raises(CheckpointError, match="is not a part of"):
        sink.commit("sink", txn)


@pytest.mark.parametrize(
    "name", ["bad-name", "t; DROP TABLE x", "1abc", "", "schema.table", "x" * 41]
)
def test_an_invalid_table_name_is_refused_before_connecting(name: str) -> None:
    with pytest.raises(ConfigurationError, match=r"table name") as info:
        SqlSink("postgresql+psycopg://u:secret@127.0.0.1:1/db", name, COLUMNS)
    assert repr(name) in str(info.value)


def test_invalid_columns_and_urls_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="'pv-count'"):
        SqlSink(f"sqlite:///{tmp_path}/x.db", "t", {"pv-count": BigInteger})
    with pytest.raises(ConfigurationError, match="'_sp_part'"):
        SqlSink(f"sqlite:///{tmp_path}/x.db", "t", {"_sp_part": BigInteger})
    with pytest.raises(ConfigurationError, match="absolute file path"):
        SqlSink("sqlite:///relative.db", "t", COLUMNS)


def test_an_unreachable_database_is_named_without_its_password(tmp_path: Path) -> None:
    with pytest.raises(SqlSinkUnavailableError) as info:
        SqlSink("postgresql+psycopg://postgres:s3cret@127.0.0.1:1/test", "t", COLUMNS)
    message = str(info.value)
    assert "postgresql+psycopg://postgres:***@127.0.0.1:1/test" in message
    assert "s3cret" not in message
    with pytest.raises(SqlSinkUnavailableError, match="no-such-dir"):
        SqlSink(f"sqlite:///{tmp_path}/no-such-dir/x.db", "t", COLUMNS)


def test_an_existing_target_needs_the_columns(db: tuple[str, str]) -> None:
    url, table = db
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (app_id VARCHAR(20), other INTEGER)")
    engine.dispose()
    with pytest.raises(ConfigurationError, match=rf"table {table} exists without column\(s\) pv"):
        SqlSink(url, table, COLUMNS)


def test_records_without_a_column_are_refused_naming_it(db: tuple[str, str]) -> None:
    url, table = db
    writer = SqlSink(url, table, COLUMNS).writer(_ctx(), None)
    with pytest.raises(ConfigurationError, match=r"no field\(s\) pv"):
        writer.write(Batch.of_columns(app_id=np.array(["a"])))
    with pytest.raises(ConfigurationError, match="fields app_id, pv"):
        writer.write(Batch.of_rows([{"app_id": "a"}]))


def test_the_sink_pickles_without_an_engine_and_works_after(db: tuple[str, str]) -> None:
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    sink.tables()  # the per-process cache must stay behind
    data = pickle.dumps(sink)
    assert b"Engine" not in data and b"MetaData" not in data
    copy = pickle.loads(data)
    writer = copy.writer(_ctx(), None)
    codes = np.array([0, 1, 0], dtype=np.int32)
    writer.write(Batch.of_columns(app_id=DictColumn(codes, ["p", "q"]), pv=np.array([1, 1, 2])))
    assert copy.commit("sink", writer.pre_commit(1)) == 1
    assert _rows(url, table) == [("p", 1), ("p", 2), ("q", 1)]


class _CommitsAfterFirstStatement:
    """A connection that lets ``then`` run after its first statement (step 1 of a commit)."""

    def __init__(self, conn: Any, then: Callable[[], Any]) -> None:
        self._conn, self._then = conn, then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        result = self._conn.execute(*args, **kwargs)
        then, self._then = self._then, lambda: None
        then()
        return result


# PostgreSQL only: on SQLite the write lock (BEGIN IMMEDIATE) runs two commits one after the
# other, so they cannot race.
@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_a_commit_that_races_another_commit_of_the_transaction_is_a_no_op(
    db: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The original job and a job restored from its checkpoint commit it at the same time."""
    url, table = db
    sink = SqlSink(url, table, COLUMNS)
    writer = sink.writer(_ctx(), None)
    writer.write(Batch.of_rows([{"app_id": "a", "pv": 1}, {"app_id": "a", "pv": 2}]))
    txn = writer.pre_commit(1)
    original = pickle.loads(pickle.dumps(sink))
    opened = SqlSink._transaction

    @contextmanager
    def racing(self: SqlSink, purpose: str) -> Iterator[Any]:
        with opened(self, purpose) as conn:
            if self is sink and purpose.startswith("commit"):
                # The original's commit runs after this one found no commit-log row.
                yield _CommitsAfterFirstStatement(conn, lambda: original.commit("sink", txn))
            else:
                yield conn

    monkeypatch.setattr(SqlSink, "_transaction", racing)
    assert sink.commit("sink", txn) == 0
    assert _rows(url, table) == [("a", 1), ("a", 2)]
    assert _count(url, sink.commits_table) == 1
