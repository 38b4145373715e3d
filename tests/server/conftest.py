"""Fixtures of the control plane's tests: a migrated database on SQLite and on PostgreSQL,
and ``harness``: a control plane on that database with a real Redis.

PostgreSQL: a fresh database per test session on the server of ``DATABASE_TEST_URL``
(``postgresql://postgres@127.0.0.1:5432/test`` by default, where CI starts one), dropped at the
end. Without a reachable server the PostgreSQL variants fail (they are not skipped): the issue
asks for both databases.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint.transport import Streams, redis_client
from sparkpoint_server.config import normalize_database_url
from sparkpoint_server.storage.db import create_db_engine, migrate, session_factory
from sparkpoint_server.storage.models import Base

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_harness import REDIS_URL, Harness

PG_ADMIN_URL = normalize_database_url(
    os.environ.get("DATABASE_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test")
)


def _reset(engine: Engine) -> None:
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())


@pytest.fixture(scope="session")
def postgresql_database_url() -> Iterator[str]:
    """A migrated PostgreSQL database of its own for this test session."""
    name = f"sparkpoint_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        migrate(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def sqlite_database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'sparkpoint.db'}"
    migrate(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated, empty database: each test runs once on SQLite and once on PostgreSQL."""
    url: str = request.getfixturevalue(f"{request.param}_database_url")
    engine = create_db_engine(url)
    _reset(engine)
    engine.dispose()
    yield url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def harness(tmp_path: Path, sessions: sessionmaker[Session]) -> Iterator[Harness]:
    """A control plane on the test database and the real Redis, on streams of its own."""
    client = redis_client(REDIS_URL)
    streams = Streams(prefix=f"test-{uuid.uuid4().hex[:8]}")
    yield Harness(tmp_path, sessions, client, streams)
    for key in client.scan_iter(f"{streams.prefix}:*"):
        client.delete(key)
    client.close()
