"""Sink outputs for the tests: a directory, or a table of its own on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import BigInteger, String

from sparkpoint.connectors.sinks import FileSink, TwoPhaseCommitSink
from sparkpoint.connectors.sql_sink import SqlSink, dispose_engines
from sparkpoint.testing import committed_lines, uncommitted_files

COLUMNS: dict[str, Any] = {"app_id": String, "pv": BigInteger}
PG_URL = os.environ.get(
    "SPARKPOINT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def pg_engine() -> Iterator[sa.Engine]:
    """PostgreSQL for the suite (.ci/run starts it); unreachable: CI fails, elsewhere skips."""
    engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 5})
    try:
        engine.connect().close()
    except sa.exc.OperationalError as err:
        engine.dispose()
        reason = f"PostgreSQL at {PG_URL} is not reachable ({err.orig})"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; .ci/run should have started it")
        pytest.skip(reason=reason)
    yield engine
    engine.dispose()


def database(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """(URL, a table name of the test's own) on ``kind`` (``sqlite`` or ``postgresql``); the
    sink's three tables are dropped after."""
    table = f"sp_test_{uuid.uuid4().hex[:12]}"
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'sink.db'}"
        engine = sa.create_engine(url)
    else:
        engine = request.getfixturevalue("pg_engine")
        url = PG_URL
    yield url, table
    dispose_engines()
    with engine.begin() as conn:
        for suffix in ("", "__sparkpoint_staged", "__sparkpoint_commits"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}{suffix}")
    if kind == "sqlite":
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(URL, a table name of this test's own) on SQLite, then on PostgreSQL."""
    yield from database(request, request.param, tmp_path)


@dataclass
class Output:
    """A sink and how to read what it committed and what it holds uncommitted."""

    sink: TwoPhaseCommitSink
    url: str = ""

    def committed(self) -> list[tuple[str, int]]:
        if isinstance(self.sink, FileSink):
            lines = committed_lines(self.sink.directory)
            return sorted((r["app_id"], r["pv"]) for r in map(json.loads, lines))
        assert isinstance(self.sink, SqlSink)
        return sorted(
            (a, int(n)) for a, n in self._query(f"SELECT app_id, pv FROM {self.sink.table}")
        )

    def uncommitted(self) -> int:
        """Uncommitted parts: hidden files, or parts with staged rows."""
        if isinstance(self.sink, FileSink):
            return len(uncommitted_files(self.sink.directory))
        assert isinstance(self.sink, SqlSink)
        return int(
            self._query(f"SELECT COUNT(DISTINCT _sp_part) FROM {self.sink.staged_table}")[0][0]
        )

    def _query(self, sql: str) -> list[Any]:
        engine = sa.create_engine(self.url)
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.exec_driver_sql(sql)]
        engine.dispose()
        return rows


@pytest.fixture(params=["file", "sqlite", "postgresql"])
def output(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Output]:
    """The file sink, then the SQL sink on SQLite and on PostgreSQL."""
    if request.param == "file":
        yield Output(FileSink(str(tmp_path / "out")))
        return
    for url, table in database(request, request.param, tmp_path):
        yield Output(SqlSink(url, table, COLUMNS), url)
