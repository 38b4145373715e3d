"""Transactional SQL sink: exactly-once rows in a database table, without PREPARE TRANSACTION.

Tasks stage rows in ``<table>__sparkpoint_staged``, tagged with the sink uid, transaction,
part (transaction, epoch and task attempt, as the file sink's parts: execution contract 2) and
sequence number. The driver commits a transaction in ONE database transaction: move the rows of
its listed parts into the target table, delete them from staging, log it in
``<table>__sparkpoint_commits`` (a second commit is then a no-op). An abort deletes only the
staged rows of its own job (:mod:`~sparkpoint.connectors.sinks`). Tested on SQLite and
PostgreSQL. The sink is pickled to executors: it holds plain values; each process opens its own
engine on first use.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from datetime import datetime, timezone
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from sparkpoint.connectors.sinks import (
    OpenTransaction,
    SinkWriter,
    TwoPhaseCommitSink,
    WriterContext,
    transaction_id,
    written_by,
)
from sparkpoint.errors import CheckpointError, ConfigurationError, SparkpointError
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch

STAGED_SUFFIX = "__sparkpoint_staged"
COMMITS_SUFFIX = "__sparkpoint_commits"
#: Staging columns ahead of the user's; user columns may not start with ``_sp_``.
META_COLUMNS = ("_sp_sink_uid", "_sp_transaction_id", "_sp_part", "_sp_seq")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MAX_IDENTIFIER = 63  # PostgreSQL truncates longer names silently
_LONGEST_SUFFIX = COMMITS_SUFFIX + "_pk"
_MAX_TABLE_NAME = _MAX_IDENTIFIER - len(_LONGEST_SUFFIX)
_IN_CHUNK = 500  # part names per IN (...) list

ColumnType = sa.types.TypeEngine[Any] | type[sa.types.TypeEngine[Any]]


class SqlSinkUnavailableError(SparkpointError):
    """The sink's database cannot be reached; the message names the URL without password."""


def display_url(url: str) -> str:
    """The URL as it may be shown: the password replaced by ``***``."""
    return sa.make_url(url).render_as_string(hide_password=True)


def _database_of(url: str) -> str:
    """Which database ``url`` names, without a secret: no password, no query."""
    u = sa.make_url(url)
    bare = sa.URL.create(u.drivername, u.username, None, u.host, u.port, u.database)
    return bare.render_as_string(hide_password=False)


_ENGINES: dict[tuple[int, str], Engine] = {}


def _engine(url: str) -> Engine:
    """This process's engine for ``url`` (a forked child opens its own)."""
    key = (os.getpid(), url)
    engine = _ENGINES.get(key)
    if engine is None:
        backend = sa.make_url(url).get_backend_name()
        if backend == "sqlite":
            # Busy timeout: subtasks and the driver write the same file. BEGIN IMMEDIATE takes
            # the write lock up front (SQLAlchemy's recipe): no lock upgrade fails halfway.
            engine = sa.create_engine(url, connect_args={"timeout": 60})
            event.listen(engine, "connect", lambda c, _: setattr(c, "isolation_level", None))
            event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        else:
            args = {"connect_timeout": 10} if backend == "postgresql" else {}
            engine = sa.create_engine(url, pool_pre_ping=True, connect_args=args)
        _ENGINES[key] = engine
    return engine


@contextmanager
def sink_transaction(url: str, sink: str, purpose: str) -> Iterator[Connection]:
    """One transaction of ``sink`` (its class and table) on the database at ``url``. A
    connection that fails, at the start or in the middle (the database stopped, the network
    cut), is a :class:`SqlSinkUnavailableError` naming the URL, never the password: a restore
    that meets it is one more failure for the restart strategy, not the end of the job."""
    where = f"the database of {sink} at {display_url(url)}"
    try:
        conn = _engine(url).connect()
    except sa.exc.DBAPIError as err:
        raise SqlSinkUnavailableError(f"cannot reach {where} to {purpose}: {err.orig}") from err
    try:
        with conn, conn.begin():
            yield conn
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as err:
        raise SqlSinkUnavailableError(f"lost {where} to {purpose}: {err.orig}") from err


def dispose_engines() -> None:
    """Close every pooled connection this process holds (tests, end of a job)."""
    for key in [k for k in _ENGINES if k[0] == os.getpid()]:
        _ENGINES.pop(key).dispose()


class _Tables(NamedTuple):
    target: sa.Table
    staged: sa.Table
    commits: sa.Table


def _schema(table: str, columns: Mapping[str, ColumnType]) -> _Tables:
    """The target, staging and commit-log tables as SQLAlchemy Core objects."""
    md, staged, commits = sa.MetaData(), table + STAGED_SUFFIX, table + COMMITS_SUFFIX

    def user() -> list[sa.Column[Any]]:
        return [sa.Column(name, typ) for name, typ in columns.items()]

    def text(*names: str) -> list[sa.Column[Any]]:
        return [sa.Column(name, sa.String(255), nullable=False) for name in names]

    seq = sa.Column("_sp_seq", sa.BigInteger, nullable=False, autoincrement=False)
    staged_key = sa.PrimaryKeyConstraint(*META_COLUMNS[1:], name=staged + "_pk")
    log = [
        *text("transaction_id", "sink_uid"),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("transaction_id", name=commits + "_pk"),
    ]
    return _Tables(
        sa.Table(table, md, *user()),
        sa.Table(staged, md, *text(*META_COLUMNS[:3]), seq, *user(), staged_key),
        sa.Table(commits, md, *log),
    )


class SqlSink(TwoPhaseCommitSink):
    """Writes records into table ``table`` of database ``url``, exactly once.

    ``columns``: each column to write and its SQLAlchemy type (``{"app_id": String, "pv":
    BigInteger}``); records must have these fields (others are not written). A missing table is
    created; an existing one must have the columns. Tasks stage every ``flush_rows`` rows and at
    each pre-commit and epoch end. The constructor connects (on the driver: a wrong URL fails
    before the job starts) and creates the staging and commit-log tables."""

    def __init__(
        self,
        url: str,
        table: str,
        columns: Mapping[str, ColumnType],
        *,
        flush_rows: int = 50_000,
    ) -> None:
        self.url = url
        self.table = _check_identifier("SqlSink: table name", table, _MAX_TABLE_NAME)
        self.staged_table, self.commits_table = table + STAGED_SUFFIX, table + COMMITS_SUFFIX
        if not columns:
            raise ConfigurationError(f"SqlSink {table}: give the columns to write, name -> type")
        for name in columns:
            _check_identifier(f"SqlSink {table}: column name", name, _MAX_IDENTIFIER)
        self.columns = dict(columns)
        if flush_rows < 1:
            raise ConfigurationError(f"SqlSink {table}: flush_rows must be >= 1, not {flush_rows}")
        self.flush_rows = flush_rows
        try:
            parsed = sa.make_url(url)
        except sa.exc.ArgumentError as err:
            raise ConfigurationError(f"SqlSink {table}: {url!r} is not a database URL") from err
        if parsed.get_backend_name() == "sqlite" and not os.path.isabs(parsed.database or ""):
            raise ConfigurationError(
                f"SqlSink {table}: {display_url(url)} must name an absolute file path "
                "(sqlite:////abs/path.db): executors open it from other processes"
            )
        self._ensure_schema()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_cached_tables"}

    def __repr__(self) -> str:
        return f"SqlSink({display_url(self.url)!r}, {self.table!r}, {list(self.columns)})"

    @property
    def location(self) -> str:
        """The database and the table: the URL's driver, user, host, port and database name,
        never its password nor its query (which may hold one: ``?password=``, ODBC strings)."""
        return f"{_database_of(self.url)} {self.table}"

    def at(self, location: str) -> SqlSink | None:
        """The sink of another table of this sink's database whose tables hold this sink's
        columns (a fork into another table commits the restored checkpoint's transactions
        in the original's). Another database: None, since a checkpoint holds no password."""
        database, _, table = location.rpartition(" ")
        if database != _database_of(self.url) or table == self.table:
            return None
        try:
            if not sa.inspect(_engine(self.url)).has_table(table + STAGED_SUFFIX):
                return None
            return SqlSink(self.url, table, self.columns, flush_rows=self.flush_rows)
        except (ConfigurationError, SqlSinkUnavailableError, sa.exc.SQLAlchemyError):
            return None

    def tables(self) -> _Tables:
        """The three tables as SQLAlchemy Core objects (built once per process, not pickled)."""
        if "_cached_tables" not in self.__dict__:
            self.__dict__["_cached_tables"] = _schema(self.table, self.columns)
        return self.__dict__["_cached_tables"]

    def _transaction(self, purpose: str) -> AbstractContextManager[Connection]:
        return sink_transaction(self.url, f"SqlSink {self.table}", purpose)

    def _ensure_schema(self) -> None:
        """Create the missing tables; an existing one must have the sink's columns."""
        t = self.tables()
        with self._transaction("create its tables") as conn:
            t.target.metadata.create_all(conn, checkfirst=True)
            inspector = sa.inspect(conn)
            for table in (t.target, t.staged):
                have = {c["name"] for c in inspector.get_columns(table.name)}
                missing = [c.name for c in table.columns if c.name not in have]
                if missing:
                    raise ConfigurationError(
                        f"SqlSink {self.table}: table {table.name} exists without "
                        f"column(s) {', '.join(missing)}"
                    )

    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        return _SqlSinkWriter(self, ctx, open_txn)

    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        """Move a pre-committed transaction's staged rows into the target table, once.

        One database transaction: (1) a transaction already in the commit log is done: return
        0; (2) INSERT INTO the target the rows of the listed parts, by part and sequence; (3)
        every listed part must have had rows, and all of them the pre-commit's record count,
        else CheckpointError naming the part (nothing is committed); (4) delete the
        transaction's staged rows (those of losing task attempts too); (5) write the
        commit-log row. A transaction without parts wrote nothing and is not logged.
        """
        txn_id, parts = transaction.transaction_id, list(transaction.parts)
        if not parts:
            return 0
        for part in parts:
            if not txn_id.startswith(f"{uid}-") or not part.startswith(f"{txn_id}.e"):
                raise CheckpointError(f"sink {uid}: {part!r} is not a part of {txn_id} it wrote")
        target, staged, commits = self.tables()
        logged = sa.select(commits.c.transaction_id).where(commits.c.transaction_id == txn_id)
        ours = (staged.c._sp_sink_uid == uid) & (staged.c._sp_transaction_id == txn_id)
        names = list(self.columns)
        log_row = {"transaction_id": txn_id, "sink_uid": uid, "rows": transaction.records}
        try:
            with self._transaction(f"commit transaction {txn_id} of sink {uid}") as conn:
                conn.execution_options(preserve_rowcount=True)  # INSERT ... SELECT's count
                # Step 1
                if conn.execute(logged).first() is not None:
                    return 0
                # Step 2
                rows = (
                    sa.select(*(staged.c[n] for n in names))
                    .where(ours & staged.c._sp_part.in_(parts))
                    .order_by(staged.c._sp_part, staged.c._sp_seq)
                )
                moved = conn.execute(sa.insert(target).from_select(names, rows)).rowcount
                # Step 3
                if moved != transaction.records:
                    self._check_rows(conn, uid, transaction, moved)
                # Step 4
                conn.execute(sa.delete(staged).where(ours))
                # Step 5
                log_row["committed_at"] = datetime.now(timezone.utc)
                conn.execute(sa.insert(commits).values(**log_row))
        except (sa.exc.IntegrityError, CheckpointError):
            # The commit log's key, or rows gone between steps 1 and 2 (PostgreSQL reads what
            # committed before each statement): another process committed it meanwhile, e.g.
            # the job that wrote it while a job restored from its checkpoint commits it again.
            with self._transaction(f"check transaction {txn_id} of sink {uid}") as conn:
                if conn.execute(logged).first() is not None:
                    return 0
            raise
        return len(parts)

    def _check_rows(self, conn: Connection, uid: str, txn: SinkTransactionModel, n: int) -> None:
        """Step 3 of :meth:`commit` when ``n`` rows moved, not the records pre-committed."""
        txn_id, staged = txn.transaction_id, self.tables().staged
        query = (
            sa.select(staged.c._sp_part, sa.func.count())
            .where((staged.c._sp_sink_uid == uid) & (staged.c._sp_transaction_id == txn_id))
            .where(staged.c._sp_part.in_(txn.parts))
            .group_by(staged.c._sp_part)
        )
        counts: dict[str, int] = {row[0]: row[1] for row in conn.execute(query)}
        where = f"cannot commit transaction {txn_id} of sink {uid}"
        for part in txn.parts:
            if not counts.get(part):
                raise CheckpointError(
                    f"{where}: part {part} has no rows in {self.staged_table} "
                    f"and the transaction is not in {self.commits_table}"
                )
        found = sum(counts.values()) if n < 0 else n
        if found != txn.records:
            raise CheckpointError(
                f"{where}: its parts hold {found} staged rows, the pre-commit recorded "
                f"{txn.records} (parts {', '.join(txn.parts)})"
            )

    def abort_uncommitted(
        self,
        job_id: str,
        uid: str,
        keep: set[str],
        before_attempt: int | None = None,
        in_epoch: int | None = None,
    ) -> int:
        """Delete the staged rows that job ``job_id`` wrote for sink ``uid`` (in an attempt
        before ``before_attempt`` when given) whose part is not in ``keep``; another job's rows
        stay. Returns the parts removed."""
        staged = self.tables().staged
        mine = staged.c._sp_sink_uid == uid
        what = f"abort the uncommitted parts of job {job_id} in sink {uid}"
        with self._transaction(what) as conn:
            found = conn.execute(sa.select(staged.c._sp_part).where(mine).distinct()).scalars()
            drop = sorted(
                p for p in set(found) - keep if written_by(job_id, uid, p, before_attempt, in_epoch)
            )
            for i in range(0, len(drop), _IN_CHUNK):
                chunk = staged.c._sp_part.in_(drop[i : i + _IN_CHUNK])
                conn.execute(sa.delete(staged).where(mine & chunk))
        return len(drop)


class _SqlSinkWriter(SinkWriter):
    """Buffers rows; each flush stages them in one database transaction of the task's own."""

    def __init__(self, sink: SqlSink, ctx: WriterContext, open_txn: OpenTransaction | None):
        self._sink, self._ctx, self._seq = sink, ctx, 0
        self._txn = open_txn or self._begin()
        self._names = list(sink.columns)
        self._buffer: list[tuple[Any, ...]] = []
        self._part_rows = 0  # rows staged or buffered in the current part

    def _begin(self) -> OpenTransaction:
        self._seq += 1
        return OpenTransaction(transaction_id=transaction_id(self._ctx, self._seq))

    @property
    def _part(self) -> str:
        """This epoch's and task attempt's part of the open transaction (contract 2)."""
        return f"{self._txn.transaction_id}.e{self._ctx.epoch}-t{self._ctx.task_attempt}"

    def write(self, batch: Batch) -> None:
        n = len(batch)
        if not n:
            return
        values = self._values(batch)
        tags = (repeat(self._ctx.uid), repeat(self._txn.transaction_id), repeat(self._part))
        seqs = range(self._part_rows, self._part_rows + n)
        self._buffer.extend(zip(*tags, seqs, *values, strict=False))  # tags repeat
        self._part_rows += n
        self._txn.records += n
        self._txn.bytes += batch.nbytes
        if len(self._buffer) >= self._sink.flush_rows:
            self._flush()

    def _values(self, batch: Batch) -> list[list[Any]]:
        """One list of Python values per column, in the sink's column order."""
        where = f"sink {self._ctx.uid} (transaction {self._txn.transaction_id}, part {self._part})"
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
        staged = self._sink.tables().staged
        with self._sink._transaction(f"stage part {self._part} of sink {self._ctx.uid}") as conn:
            insert_rows(conn, staged, [*META_COLUMNS, *self._names], self._buffer)
        self._buffer = []

    def _close_part(self) -> None:
        self._flush()
        if self._part_rows:  # a part without rows is never listed
            self._txn.parts.append(self._part)
            self._part_rows = 0

    def pre_commit(self, checkpoint_id: int) -> SinkTransactionModel:
        self._close_part()
        txn, self._txn = self._txn, self._begin()
        return SinkTransactionModel(
            transaction_id=txn.transaction_id,
            parts=txn.parts,
            records=txn.records,
            bytes=txn.bytes,
            location=self._sink.location,
        )

    def close_epoch(self) -> OpenTransaction:
        self._close_part()
        return self._txn


def _native(value: Any) -> Any:
    """A numpy scalar as the Python value the database drivers bind."""
    return value.item() if isinstance(value, np.generic) else value


def insert_rows(conn: Connection, table: sa.Table, names: Sequence[str], rows: list[Any]) -> None:
    """Bulk insert: COPY on psycopg, the driver's executemany on SQLite, else SQLAlchemy's."""
    dialect, raw = conn.dialect, conn.connection.driver_connection
    quote = dialect.identifier_preparer.quote
    into = f"{dialect.identifier_preparer.format_table(table)} ({', '.join(map(quote, names))})"
    if dialect.name == "postgresql" and dialect.driver == "psycopg":
        with raw.cursor() as cur, cur.copy(f"COPY {into} FROM STDIN") as copy:  # type: ignore[union-attr]
            for row in rows:
                copy.write_row(row)
    elif dialect.name == "sqlite":
        with closing(raw.cursor()) as cur:  # type: ignore[union-attr]
            cur.executemany(f"INSERT INTO {into} VALUES ({', '.join('?' * len(names))})", rows)
    else:
        conn.execute(sa.insert(table), [dict(zip(names, row, strict=True)) for row in rows])


def _check_identifier(what: str, name: str, longest: int) -> str:
    """``name`` when it is an identifier of at most ``longest`` characters, not ``_sp_...``."""
    ok = isinstance(name, str) and _IDENTIFIER.match(name) and len(name) <= longest
    if not ok or name.startswith("_sp_"):
        raise ConfigurationError(
            f"{what} {name!r} is not an identifier of at most {longest} characters (letters, "
            "digits and _, not starting with a digit nor _sp_; PostgreSQL keeps 63 characters "
            f"and the sink adds up to {_LONGEST_SUFFIX!r} to the table name)"
        )
    return name
