"""Two jobs that share an output and a sink uid: neither's abort touches the other's parts.

On the file sink and on the SQL sink (SQLite and PostgreSQL). Job ids share their first 8
characters, as a fork's often does (``pv-shared-a``, ``pv-shared-b``).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from sparkpoint.connectors.sinks import (
    FileSink,
    WriterContext,
    job_tag,
    written_by,
)
from sparkpoint.connectors.sql_sink import META_COLUMNS, SqlSink, dispose_engines, insert_rows
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch
from sparkpoint.testing import committed_lines

from .conftest import COLUMNS, Output

JOB_A, JOB_B = "pv-shared-a", "pv-shared-b"


def _ctx(job_id: str, epoch: int, attempt: int = 1) -> WriterContext:
    return WriterContext(job_id, "sink", 0, attempt, epoch, 0)


def _rows(app: str, *pvs: int) -> Batch:
    return Batch.of_rows([{"app_id": app, "pv": pv} for pv in pvs])


@pytest.mark.parametrize("fork", [False, True], ids=["fresh", "fork-of-a"])
def test_a_restore_of_job_b_leaves_job_a_parts_and_a_commits_all(
    output: Output, fork: bool
) -> None:
    sink = output.sink
    # Job A: checkpoint 1 pre-commits t1; the open transaction has a part of epoch 0.
    a0 = sink.writer(_ctx(JOB_A, 0), None)
    a0.write(_rows("a", 1, 2))
    t1 = a0.pre_commit(1)
    a0.write(_rows("a", 3))
    carried = a0.close_epoch()
    # Job B, same uid and output (fresh, or forked from A's checkpoint 1), writes, fails.
    b0 = sink.writer(_ctx(JOB_B, 0), None)
    b0.write(_rows("b", 1, 2))
    b0.pre_commit(1)
    b0.write(_rows("b", 3))
    b0.close_epoch()
    # B restores: commits the restored checkpoint's transactions, aborts what it wrote.
    if fork:
        assert sink.commit("sink", t1) == 1
    assert sink.abort_uncommitted(JOB_B, "sink", keep=set()) == 2
    assert output.uncommitted() == (1 if fork else 2)  # A's parts
    # Job A goes on: commits checkpoint 1 (again, when B did), then checkpoint 2.
    assert sink.commit("sink", t1) == (0 if fork else 1)
    a1 = sink.writer(_ctx(JOB_A, 1), carried)
    a1.write(_rows("a", 4))
    t2 = a1.pre_commit(2)
    assert sink.commit("sink", t2) == 2
    assert output.committed() == [("a", 1), ("a", 2), ("a", 3), ("a", 4)]
    assert output.uncommitted() == 0


def test_jobs_sharing_a_prefix_write_and_commit_their_own_transactions(output: Output) -> None:
    sink = output.sink
    wa, wb = sink.writer(_ctx(JOB_A, 0), None), sink.writer(_ctx(JOB_B, 0), None)
    wa.write(_rows("a", 1))
    wb.write(_rows("b", 1, 2))  # same uid, subtask, attempt, epoch, task attempt as A's
    ta, tb = wa.pre_commit(1), wb.pre_commit(1)
    assert ta.transaction_id != tb.transaction_id
    assert sink.commit("sink", tb) == 1
    assert sink.commit("sink", ta) == 1  # not taken for B's, committed already
    assert output.committed() == [("a", 1), ("b", 1), ("b", 2)]


def test_a_restore_leaves_parts_of_the_old_naming_committable(output: Output) -> None:
    """A part named with ``job_id[:8]`` (before job tags): no abort can say whose it is."""
    sink, txn_id = output.sink, "sink-0-pv-share-a1-e0-1"
    old = SinkTransactionModel(transaction_id=txn_id, parts=[f"{txn_id}.e0-t0"], records=1)
    if isinstance(sink, FileSink):
        part = os.path.join(sink.directory, f".{old.parts[0]}.inprogress")
        Path(part).write_text('{"app_id": "old", "pv": 1}\n', encoding="utf-8")
        old.parts[0] = os.path.basename(part)
    else:
        assert isinstance(sink, SqlSink)
        with sa.create_engine(output.url).begin() as conn:
            row = ("sink", txn_id, old.parts[0], 0, "old", 1)
            insert_rows(conn, sink.tables().staged, [*META_COLUMNS, *COLUMNS], [row])
    assert sink.abort_uncommitted(JOB_A, "sink", keep=set()) == 0
    assert sink.abort_uncommitted(JOB_B, "sink", keep=set()) == 0
    assert sink.commit("sink", old) == 1
    assert output.committed() == [("old", 1)]


def test_a_commit_that_loses_a_race_to_another_jobs_commit_is_a_no_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = FileSink(str(tmp_path))
    writer = sink.writer(_ctx(JOB_A, 0), None)
    writer.write(_rows("a", 1))
    txn = writer.pre_commit(1)
    rename = os.replace

    def renamed_meanwhile(src: str, dst: str) -> None:
        rename(src, dst)  # the fork's commit of the same transaction, a moment earlier
        rename(src, dst)

    monkeypatch.setattr(os, "replace", renamed_meanwhile)
    assert sink.commit("sink", txn) == 0
    assert committed_lines(str(tmp_path)) == ['{"app_id": "a", "pv": 1}']


def test_job_tags_are_unambiguous_and_keep_a_default_job_id_whole() -> None:
    default = uuid.uuid4().hex
    assert job_tag(default) == default
    tags = {job_tag(j) for j in (JOB_A, JOB_B, default, default.upper(), "a/b c", "x" * 300)}
    assert len(tags) == 6
    assert all(re.fullmatch(r"[0-9a-h]{32}", t) for t in tags)
    part = f"my-sink-3-{job_tag(JOB_A)}-a2-e7-1.e9-t0"
    assert written_by(JOB_A, "my-sink", part)
    assert not written_by(JOB_B, "my-sink", part)
    assert not written_by(JOB_A, "my", part)  # a uid that is a prefix of another


def test_a_file_transaction_names_its_directory_and_another_file_sink_commits_it_there(
    tmp_path: Path,
) -> None:
    original, fork = FileSink(str(tmp_path / "a")), FileSink(str(tmp_path / "b"))
    writer = original.writer(_ctx(JOB_A, 0), None)
    writer.write(_rows("a", 1))
    txn = writer.pre_commit(1)
    assert txn.location == original.directory == str(tmp_path / "a")
    there = fork.at(txn.location)
    assert there is not None and there.directory == original.directory
    assert there.commit("sink", txn) == 1
    assert committed_lines(original.directory) == ['{"app_id": "a", "pv": 1}']
    assert committed_lines(fork.directory) == []
    assert fork.at(str(tmp_path / "gone")) is None  # the restoring job commits at its own


def test_a_sql_transaction_names_its_table_and_a_sink_of_another_table_commits_it_there(
    db: tuple[str, str],
) -> None:
    url, table = db
    original, fork = SqlSink(url, table, COLUMNS), SqlSink(url, table + "_fork", COLUMNS)
    try:
        writer = original.writer(_ctx(JOB_A, 0), None)
        writer.write(_rows("a", 1))
        txn = writer.pre_commit(1)
        assert txn.location is not None and txn.location.endswith(f" {table}")
        if url.startswith("postgresql"):  # trust authentication: any password connects
            for secret in ("postgres:s3cret@", "postgres@"):
                spelled = url.replace("postgres@", secret) + "?password=s3cret&sslpassword=s3cret"
                with_password = SqlSink(spelled, table, COLUMNS)
                assert "s3cret" not in with_password.location
                assert with_password.location == original.location  # the same database
        there = fork.at(txn.location)
        assert isinstance(there, SqlSink) and there.table == table
        assert there.commit("sink", txn) == 1
        assert there.commit("sink", txn) == 0  # once
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT app_id, pv FROM {table}").all() == [("a", 1)]
            assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table}_fork").scalar() == 0
        engine.dispose()
        # Another database, or a table without the sink's tables: the fork commits at its own.
        assert fork.at(f"sqlite:////elsewhere.db {table}") is None
        assert fork.at(f"{original.location.rpartition(' ')[0]} no_such_table") is None
    finally:
        dispose_engines()
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            for suffix in ("", "__sparkpoint_staged", "__sparkpoint_commits"):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}_fork{suffix}")
        engine.dispose()
