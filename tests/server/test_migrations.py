"""The schema comes only from the migrations: they must agree with the models."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text

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


def test_0003_turns_json_null_acknowledgements_into_sql_null(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate(url, "0002")
    engine = create_engine(url)
    row = "INSERT INTO checkpoint_subtasks (job_id, checkpoint_id, operator_id, subtask, attempt, "
    row += "clock_flagged, ack) VALUES ('j', 1, 'pv', {n}, 1, 0, {ack})"
    with engine.begin() as conn:
        conn.execute(text(row.format(n=0, ack="'null'")))  # written before its acknowledgement
        conn.execute(text(row.format(n=1, ack="'{\"checkpoint_id\": 1}'")))

    migrate(url)

    with engine.connect() as conn:
        acks = conn.execute(text("SELECT subtask, ack FROM checkpoint_subtasks ORDER BY 1")).all()
    engine.dispose()
    assert acks == [(0, None), (1, '{"checkpoint_id": 1}')]
