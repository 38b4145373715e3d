"""Idempotent upsert sink: rows keyed by the user's columns, replays overwrite (PostgreSQL, SQLite).

The seeds' consistency table: a resettable source with an *idempotent* sink is effectively
exactly-once. Rows are written as records arrive (``INSERT ... ON CONFLICT (keys) DO UPDATE``,
one database transaction per flush), not held until a checkpoint completes: a restore replays
the records after the checkpoint, which write the same keys with the same values again, so the
*final table* equals that of a run that never failed. Readers may see values from beyond the
latest checkpoint, and after a restore a key may briefly show an older value until the replay
reaches it (Flink's idempotent sinks, e.g. an Elasticsearch or JDBC upsert sink, behave so).

Two conditions make the final table deterministic:

- every record with a given key comes from one sink subtask, in order: the sink follows a
  keyed operator whose key determines the key columns (the sink cannot check this);
- a task of an earlier job attempt that still runs after a restore (Spark gives a killed
  Python worker seconds before destroying it) must not overwrite what the replay wrote: every
  row carries the writing job (``_sp_job``) and attempt (``_sp_attempt``), and an update of
  this job's row applies only from the same or a later attempt (a fencing token, as Kafka's
  producer epochs). Another job's row is overwritten (a re-run into the same table).

Sink transactions have no parts: the driver has nothing to commit or abort.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from sparkpoint.connectors.sinks import (
    OpenTransaction,
    SinkWriter,
    TwoPhaseCommitSink,
    WriterContext,
    job_tag,
    transaction_id,
)
from sparkpoint.connectors.sql_sink import (
    _MAX_IDENTIFIER,
    ColumnType,
    _check_identifier,
    _native,
    display_url,
    insert_rows,
    sink_transaction,
)
from sparkpoint.errors import ConfigurationError
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch

#: Fencing columns ahead of the user's: who wrote the row (job tag) and in which job attempt.
FENCE_COLUMNS = ("_sp_job", "_sp_attempt")
#: The temporary table a flush is copied into on PostgreSQL: ``<table>__sp_upsert``.
TEMPORARY_SUFFIX = "__sp_upsert"
_MAX_TABLE_NAME = _MAX_IDENTIFIER - len(TEMPORARY_SUFFIX)
_DIALECTS: dict[str, Callable[[sa.Table], postgresql.Insert | sqlite.Insert]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}


def _schema(table: str, columns: Mapping[str, ColumnType], keys: Sequence[str]) -> sa.Table:
    """The target table: the user's columns, the fencing columns, the key as primary key."""
    user = [sa.Column(name, typ, nullable=name not in keys) for name, typ in columns.items()]
    return sa.Table(
        table,
        sa.MetaData(),
        *user,
        sa.Column("_sp_job", sa.String(32), nullable=False),
        sa.Column("_sp_attempt", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint(*keys, name=f"{table}_pk"),
    )


class UpsertSink(TwoPhaseCommitSink):
    """Upserts records into ``table`` of database ``url``, keyed by ``key_columns``.

    ``columns``: each column to write and its SQLAlchemy type; ``key_columns``: the columns
    (among ``columns``) that identify a row. A missing table is created with the key as its
    primary key; an existing one must have the columns, the fencing columns ``_sp_job`` and
    ``_sp_attempt``, and a primary key or unique constraint on exactly the key columns. Tasks
    write every ``flush_rows`` records and at each pre-commit and epoch end; within a flush the
    last record of a key wins. The constructor connects (a wrong URL fails before the job
    starts). Only PostgreSQL and SQLite (``ON CONFLICT`` on both)."""

    delivery: ClassVar[str] = "idempotent"

    def __init__(
        self,
        url: str,
        table: str,
        columns: Mapping[str, ColumnType],
        key_columns: Sequence[str],
        *,
        flush_rows: int = 10_000,
    ) -> None:
        where = f"UpsertSink {table}"
        self.url = url
        self.table = _check_identifier("UpsertSink: table name", table, _MAX_TABLE_NAME)
        if not columns:
            raise ConfigurationError(f"{where}: give the columns to write, name -> type")
        for name in columns:
            _check_identifier(f"{where}: column name", name, _MAX_IDENTIFIER)
        self.columns = dict(columns)
        keys = [key_columns] if isinstance(key_columns, str) else list(key_columns)
        unknown = [k for k in keys if k not in self.columns]
        if not keys or unknown or len(set(keys)) != len(keys):
            raise ConfigurationError(
                f"{where}: key_columns must name distinct columns among {', '.join(columns)}, "
                f"not {keys!r}"
            )
        self.key_columns = keys
        if flush_rows < 1:
            raise ConfigurationError(f"{where}: flush_rows must be >= 1, not {flush_rows}")
        self.flush_rows = flush_rows
        try:
            parsed = sa.make_url(url)
        except sa.exc.ArgumentError as err:
            raise ConfigurationError(f"{where}: {url!r} is not a database URL") from err
        backend = parsed.get_backend_name()
        if backend not in _DIALECTS:
            raise ConfigurationError(
                f"{where}: {display_url(url)} is a {backend} database; the upsert sink writes "
                "to PostgreSQL or SQLite (INSERT ... ON CONFLICT)"
            )
        if backend == "sqlite" and not os.path.isabs(parsed.database or ""):
            raise ConfigurationError(
                f"{where}: {display_url(url)} must name an absolute file path "
                "(sqlite:////abs/path.db): executors open it from other processes"
            )
        self._ensure_schema()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_cached_table"}

    def __repr__(self) -> str:
        return f"UpsertSink({display_url(self.url)!r}, {self.table!r}, keys={self.key_columns})"

    def target(self) -> sa.Table:
        """The target table as a SQLAlchemy Core object (built once per process, not pickled)."""
        if "_cached_table" not in self.__dict__:
            self.__dict__["_cached_table"] = _schema(self.table, self.columns, self.key_columns)
        return self.__dict__["_cached_table"]

    def transaction(self, purpose: str) -> AbstractContextManager[Connection]:
        """One database transaction (:func:`~sparkpoint.connectors.sql_sink.sink_transaction`)."""
        return sink_transaction(self.url, f"UpsertSink {self.table}", purpose)

    def _ensure_schema(self) -> None:
        """Create a missing table; an existing one must have the columns and a unique key."""
        target, where = self.target(), f"UpsertSink {self.table}"
        with self.transaction("create its table") as conn:
            target.metadata.create_all(conn, checkfirst=True)
            inspector = sa.inspect(conn)
            have = {c["name"] for c in inspector.get_columns(self.table)}
            missing = [c.name for c in target.columns if c.name not in have]
            if missing:
                raise ConfigurationError(
                    f"{where}: table {self.table} exists without column(s) {', '.join(missing)}"
                )
            unique: list[set[str | None]] = [
                set(inspector.get_pk_constraint(self.table)["constrained_columns"])
            ]
            unique += [set(u["column_names"]) for u in inspector.get_unique_constraints(self.table)]
            indexes = inspector.get_indexes(self.table)
            unique += [set(i["column_names"]) for i in indexes if i["unique"]]
            if set(self.key_columns) not in unique:
                raise ConfigurationError(
                    f"{where}: table {self.table} has no primary key or unique constraint on "
                    f"exactly ({', '.join(self.key_columns)}); ON CONFLICT needs one"
                )

    def upsert(self, conn: Connection, rows: list[tuple[Any, ...]]) -> None:
        """``INSERT ... ON CONFLICT (keys) DO UPDATE`` of ``rows`` (the sink's columns, then
        the fencing columns; distinct keys), fenced: this job's row is updated only from the
        same or a later attempt. On psycopg the rows go by COPY into a temporary table first
        (several times faster than a multi-row INSERT of distinct keys)."""
        target = self.target()
        names = [*self.columns, *FENCE_COLUMNS]
        insert = _DIALECTS[conn.dialect.name](target)
        if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg":
            staged = self._copy_to_temporary(conn, names, rows)
            insert = insert.from_select(names, sa.select(*(staged.c[n] for n in names)))
            rows = []
        excluded = insert.excluded
        updated = [c.name for c in target.columns if c.name not in self.key_columns]
        fence = (target.c._sp_job != excluded._sp_job) | (
            target.c._sp_attempt <= excluded._sp_attempt
        )
        statement = insert.on_conflict_do_update(
            index_elements=self.key_columns,
            set_={name: excluded[name] for name in updated},
            where=fence,
        )
        if rows:
            conn.execute(statement, [dict(zip(names, r, strict=True)) for r in rows])
        else:
            conn.execute(statement)

    def _copy_to_temporary(
        self, conn: Connection, names: list[str], rows: list[tuple[Any, ...]]
    ) -> sa.Table:
        """COPY ``rows`` into this connection's temporary copy of the target (emptied at the
        end of every database transaction)."""
        quote = conn.dialect.identifier_preparer.quote
        name = self.table + TEMPORARY_SUFFIX
        conn.exec_driver_sql(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {quote(name)} "
            f"(LIKE {quote(self.table)}) ON COMMIT DELETE ROWS"
        )
        staged = sa.Table(
            name, sa.MetaData(), *(sa.Column(c.name, c.type) for c in self.target().columns)
        )
        insert_rows(conn, staged, names, rows)
        return staged

    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        return _UpsertWriter(self, ctx, open_txn)

    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        """Nothing to commit: the rows were written as the records arrived."""
        return 0

    def abort_uncommitted(
        self,
        job_id: str,
        uid: str,
        keep: set[str],
        before_attempt: int | None = None,
        in_epoch: int | None = None,
    ) -> int:
        """Nothing to abort: a replay overwrites what the aborted records wrote."""
        return 0


class _UpsertWriter(SinkWriter):
    """Buffers records by key (the last one wins); each flush upserts them in key order in one
    database transaction."""

    def __init__(self, sink: UpsertSink, ctx: WriterContext, open_txn: OpenTransaction | None):
        self._sink, self._ctx, self._seq = sink, ctx, 0
        self._txn = open_txn or self._begin()
        self._names = list(sink.columns)
        self._key_at = [self._names.index(k) for k in sink.key_columns]
        self._buffer: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._buffered = 0

    def _begin(self) -> OpenTransaction:
        self._seq += 1
        return OpenTransaction(transaction_id=transaction_id(self._ctx, self._seq))

    def write(self, batch: Batch) -> None:
        n = len(batch)
        if not n:
            return
        for row in zip(*self._values(batch), strict=True):
            key = tuple(row[i] for i in self._key_at)
            if None in key:
                record = dict(zip(self._names, row, strict=True))
                raise ConfigurationError(
                    f"sink {self._ctx.uid}: a record has no value for key column(s) "
                    f"{', '.join(self._sink.key_columns)}: {record}"
                )
            self._buffer[key] = row
        self._buffered += n
        self._txn.records += n
        self._txn.bytes += batch.nbytes
        if self._buffered >= self._sink.flush_rows:
            self._flush()

    def _values(self, batch: Batch) -> list[list[Any]]:
        """One list of Python values per column, in the sink's column order."""
        where = f"sink {self._ctx.uid} (table {self._sink.table})"
        if batch.is_columnar:
            cols = batch.columns
            missing = [n for n in self._names if n not in cols]
            if missing:
                raise ConfigurationError(
                    f"{where}: records have no field(s) {', '.join(missing)} "
                    f"(fields: {', '.join(cols)})"
                )
            return [cols[n].tolist() for n in self._names]
        try:
            return [[_native(r[n]) for r in batch.rows] for n in self._names]
        except (KeyError, TypeError, IndexError) as err:
            raise ConfigurationError(
                f"{where}: every record must be a dict with the fields {', '.join(self._names)} "
                f"({type(err).__name__}: {err})"
            ) from err

    def _flush(self) -> None:
        if not self._buffer:
            return
        try:  # in key order: two flushes that share keys lock them in one order, no deadlock
            ordered = [self._buffer[k] for k in sorted(self._buffer)]
        except TypeError:  # keys of mixed types
            ordered = list(self._buffer.values())
        fence = (job_tag(self._ctx.job_id), self._ctx.attempt)
        rows = [(*r, *fence) for r in ordered]
        c = self._ctx
        with self._sink.transaction(f"upsert rows of sink {c.uid}[{c.subtask}]") as conn:
            self._sink.upsert(conn, rows)
        self._buffer, self._buffered = {}, 0

    def pre_commit(self, checkpoint_id: int) -> SinkTransactionModel:
        self._flush()
        txn, self._txn = self._txn, self._begin()
        return SinkTransactionModel(
            transaction_id=txn.transaction_id, parts=[], records=txn.records, bytes=txn.bytes
        )

    def close_epoch(self) -> OpenTransaction:
        self._flush()
        return self._txn
