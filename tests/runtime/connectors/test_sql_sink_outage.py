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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

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


class _Away(NamedTuple):
    proxy: TcpProxy
    url: str  # PostgreSQL through the proxy
    table: str


@pytest.fixture
def away(pg_engine: sa.Engine) -> Iterator[_Away]:
    """A table of the test's own on PostgreSQL, reached through a proxy the test cuts; the
    sink's three tables are dropped after."""
    pg = sa.make_url(PG_URL)
    proxy = TcpProxy(pg.host or "127.0.0.1", pg.port or 5432)
    url = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    table = f"sp_away_{uuid.uuid4().hex[:12]}"
    try:
        yield _Away(proxy, url, table)
    finally:
        proxy.close()
        with pg_engine.begin() as conn:
            for suffix in ("", "__sparkpoint_staged", "__sparkpoint_commits"):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}{suffix}")


def test_a_database_away_at_commit_and_at_restore_is_ridden_out_by_restarts(
    spark: Any, tmp_path: Path, away: _Away
) -> None:
    events = _DatabaseAway(away.proxy, at=2)
    result, _ = run_pv_sql(
        spark, tmp_path, "away", url=away.url, table=away.table, attempts=5, event_sink=events
    )
    commit, restore, *_ = events.failures()
    where = f"the database of SqlSink {away.table} at postgresql+psycopg://postgres@127.0.0.1:"
    assert commit.startswith("committing checkpoint 2 failed: ") and where in commit
    assert restore.startswith("restore of attempt 2 failed: ") and where in restore
    assert result.status is p.JobStatus.FINISHED and away.proxy.cuts > 0
    rows = Counter(table_rows(PG_URL, away.table))
    assert rows == expected_rows()  # no row lost, none twice
    assert table_rows(PG_URL, away.table + "__sparkpoint_staged") == []


def test_a_database_away_when_a_job_starts_from_a_checkpoint_is_ridden_out(
    spark: Any, tmp_path: Path, away: _Away
) -> None:
    # A job fails for good after a few checkpoints; a new one resumes from its latest while the
    # database is away: its restore fails once, is restored again, and the table ends exact.
    failure = FailureInjection("keyed", subtask=1, records=200, at_epoch=3)
    with pytest.raises(JobFailedError):
        run_pv_sql(spark, tmp_path, "first", failure, url=away.url, table=away.table, attempts=0)
    done = (tmp_path / "first" / "chk" / "pv-sql-first").glob("chk-*/_metadata")
    latest = max((m.parent for m in done), key=lambda d: int(d.name.removeprefix("chk-")))
    events = _DatabaseAway(away.proxy, at=None)
    result, _ = run_pv_sql(
        spark,
        tmp_path,
        "resumed",
        url=away.url,
        table=away.table,
        event_sink=events,
        from_checkpoint=f"file://{latest}",
    )
    [restore] = events.failures()
    assert restore.startswith(f"restore of file://{latest} failed: cannot reach the database")
    assert result.status is p.JobStatus.FINISHED and away.proxy.cuts > 0
    assert Counter(table_rows(PG_URL, away.table)) == expected_rows()
