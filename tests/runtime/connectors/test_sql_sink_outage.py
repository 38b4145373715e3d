"""A SQL sink's database that goes away while a standalone job commits, and is still away
when the restore commits again, is ridden out by the restart strategy: the job finishes with
exactly the rows of a failure-free run.

PostgreSQL is reached through a TCP proxy of the test's own (``tests/support/tcp_proxy.py``),
cut once checkpoint 2 completed (before its transactions are committed) and restored once the
restore has failed: the driver used to end at the first failed commit, and a restore whose
commit failed ended it as well, where the control plane restarts a connected job.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sparkpoint import protocol as p
from sparkpoint.events import InMemoryEventSink
from sparkpoint.runtime.driver import JobFailedError
from sparkpoint.testing import FailureInjection

from ...support.tcp_proxy import TcpProxy
from ..test_sql_sink_exactly_once import expected_rows, run_pv_sql, table_rows
from .conftest import PG_URL

pytestmark = pytest.mark.spark


class _DatabaseAway(InMemoryEventSink):
    """Cuts ``proxy`` when checkpoint ``at`` completed (None: at the job's first event);
    restores it at the first failed restore."""

    def __init__(self, proxy: TcpProxy, at: int | None) -> None:
        super().__init__()
        self.proxy, self.at = proxy, at

    def publish(self, events: Sequence[p.Envelope]) -> None:
        first = not self.events
        super().publish(events)
        if first and self.at is None:
            self.proxy.cut()
        for e in events:
            ev = e.decoded()
            if isinstance(ev, p.CheckpointCompleted) and ev.checkpoint_id == self.at:
                self.proxy.cut()
            elif isinstance(ev, p.TaskFailed) and ev.cause.startswith("restore of"):
                self.proxy.restore()

    def failures(self) -> list[str]:
        return [ev.cause for e in self.events if isinstance(ev := e.decoded(), p.TaskFailed)]


def test_a_database_away_at_commit_and_at_restore_is_ridden_out_by_restarts(
    spark: Any, tmp_path: Path, pg_engine: sa.Engine
) -> None:
    pg = sa.make_url(PG_URL)
    proxy = TcpProxy(pg.host or "127.0.0.1", pg.port or 5432)
    url = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    table = f"sp_away_{uuid.uuid4().hex[:12]}"
    events = _DatabaseAway(proxy, at=2)
    try:
        result, _ = run_pv_sql(
            spark, tmp_path, "away", url=url, table=table, attempts=5, event_sink=events
        )
        commit, restore, *_ = events.failures()
        where = f"the database of SqlSink {table} at postgresql+psycopg://postgres@127.0.0.1:"
        assert commit.startswith("committing checkpoint 2 failed: ") and where in commit
        assert restore.startswith("restore of attempt 2 failed: ") and where in restore
        assert result.status is p.JobStatus.FINISHED and proxy.cuts > 0
        rows = Counter(table_rows(PG_URL, table))
        assert rows == expected_rows()  # no row lost, none twice
        assert table_rows(PG_URL, table + "__sparkpoint_staged") == []
    finally:
        proxy.close()
        with pg_engine.begin() as conn:
            for suffix in ("", "__sparkpoint_staged", "__sparkpoint_commits"):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}{suffix}")


def test_a_database_away_when_a_job_starts_from_a_checkpoint_is_ridden_out(
    spark: Any, tmp_path: Path, pg_engine: sa.Engine
) -> None:
    # A job fails for good after a few checkpoints; a new one resumes from its latest while the
    # database is away: its restore fails once, is restored again, and the table ends exact.
    pg = sa.make_url(PG_URL)
    proxy = TcpProxy(pg.host or "127.0.0.1", pg.port or 5432)
    url = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    table = f"sp_away_{uuid.uuid4().hex[:12]}"
    try:
        failure = FailureInjection("keyed", subtask=1, records=200, at_epoch=3)
        with pytest.raises(JobFailedError):
            run_pv_sql(spark, tmp_path, "first", failure, url=url, table=table, attempts=0)
        done = (tmp_path / "first" / "chk" / "pv-sql-first").glob("chk-*/_metadata")
        latest = max((m.parent for m in done), key=lambda d: int(d.name.removeprefix("chk-")))
        events = _DatabaseAway(proxy, at=None)
        result, _ = run_pv_sql(
            spark,
            tmp_path,
            "resumed",
            url=url,
            table=table,
            event_sink=events,
            from_checkpoint=f"file://{latest}",
        )
        [restore] = events.failures()
        assert restore.startswith(f"restore of file://{latest} failed: cannot reach the database")
        assert result.status is p.JobStatus.FINISHED and proxy.cuts > 0
        assert Counter(table_rows(PG_URL, table)) == expected_rows()
    finally:
        proxy.close()
        with pg_engine.begin() as conn:
            for suffix in ("", "__sparkpoint_staged", "__sparkpoint_commits"):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}{suffix}")
