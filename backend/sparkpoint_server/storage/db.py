"""Engines, sessions and migrations of the control plane's database (SQLite or PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parents[3] / "migrations"


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def create_db_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and foreign keys on.

    WAL lets the REST API read while the ingest writes; the busy timeout makes a writer wait
    for the other instead of failing with "database is locked". JSON columns (acknowledgements
    with their handles) are written with orjson: the stdlib encoder was a tenth of the ingest.
    """
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            json_serializer=_json_dumps,
            json_deserializer=orjson.loads,
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    engine = create_engine(
        url,
        pool_pre_ping=True,
        pool_size=8,
        max_overflow=8,
        json_serializer=_json_dumps,
        json_deserializer=orjson.loads,
    )
    # An executemany INSERT (the ingest's upsert of subtask rows, heartbeats) goes as a few
    # multi-row statements, as with psycopg2, instead of a statement per row: psycopg 3's
    # pipeline spent a tenth of the ingest in Python per row. (SQLite's executemany loops in
    # C: no gain there.)
    engine.dialect.use_insertmanyvalues_wo_returning = True
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    """Alembic's configuration for ``url``, with the repository's ``migrations/``.

    Raises:
        FileNotFoundError: Sparkpoint was installed without its source tree (the migrations
            live beside ``backend/``; install it with ``pip install -e``).
    """
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise FileNotFoundError(
            f"the control plane's migrations are not at {MIGRATIONS_DIR}: install Sparkpoint "
            "from its source tree (pip install -e .)"
        )
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` with the Alembic migrations."""
    command.upgrade(alembic_config(url), revision)
