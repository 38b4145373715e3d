"""The schema comes only from the migrations: they must agree with the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect

from sparkpoint_server.storage.db import migrate
from sparkpoint_server.storage.models import Base


def test_models_and_migrations_agree(engine: Engine) -> None:
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_migrations_create_every_table(engine: Engine) -> None:
    tables = set(inspect(engine).get_table_names())
    assert tables == {*Base.metadata.tables, "alembic_version"}


def test_migrating_twice_changes_nothing(database_url: str, engine: Engine) -> None:
    migrate(database_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
