"""Percentile summaries of completed checkpoints (Flink's ``StatsSummary``), kept incrementally.

``GET /jobs/{id}/checkpoints`` summarises every completed checkpoint of a job. Reading and
sorting 10,000 rows per request costs tens of milliseconds, so :class:`CheckpointSummaries`
keeps each job's sorted columns in memory and, per request, only compares two numbers that the
caller reads anyway: how many checkpoints are completed and the newest completed id.

- Nothing changed: the cached summary is returned.
- Only newer checkpoints completed (ids keep increasing, a completed checkpoint's numbers
  never change): just those rows are read and inserted into the sorted columns.
- Anything else (retention deleted rows, an older checkpoint completed late): everything is
  read again.

The cache belongs to one app (``install_api`` puts it in ``app.state``), so it never mixes two
databases; each process validates against the database, so several processes stay correct.
Percentiles are computed in Python: SQLite and PostgreSQL give the same numbers.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sparkpoint_server.storage.models import Checkpoint

C = Checkpoint.__table__.c

COMPLETED = "COMPLETED"
SUMMARY_FIELDS = ("end_to_end_duration", "state_size", "checkpointed_size", "alignment_buffered")
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))
_INSORT_MAX = 64  # more new values than this: append and sort instead
_COLUMNS = (C.checkpoint_id, C.kind, *(C[name] for name in SUMMARY_FIELDS))


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of sorted values, estimated as Flink does.

    Flink's histograms use Apache Commons Math's ``Percentile`` with its default (legacy)
    estimation: position ``q * (n + 1)``, linear interpolation between its neighbours, clamped
    to the smallest and largest value.
    """
    n = len(ordered)
    pos = q * (n + 1)
    if pos < 1:
        return float(ordered[0])
    if pos >= n:
        return float(ordered[-1])
    low = math.floor(pos)
    lower, upper = ordered[low - 1], ordered[low]
    return float(lower + (pos - low) * (upper - lower))


def summarize_sorted(ordered: Sequence[float]) -> dict[str, float | None]:
    """Flink's ``StatsSummaryDto`` (min, max, avg, p50..p999) of sorted values; ``None`` each
    when there are none."""
    if not ordered:
        return {"min": None, "max": None, "avg": None, **{name: None for name, _ in QUANTILES}}
    summary: dict[str, float | None] = {
        "min": ordered[0],
        "max": ordered[-1],
        "avg": math.fsum(ordered) / len(ordered),
    }
    for name, q in QUANTILES:
        summary[name] = quantile(ordered, q)
    return summary


def stats_summary(values: Iterable[float | None]) -> dict[str, float | None]:
    """:func:`summarize_sorted` of the non-null ``values``, in any order."""
    return summarize_sorted(sorted(v for v in values if v is not None))


def min_max_avg(values: Iterable[float | None]) -> dict[str, float | None]:
    """Flink's ``MinMaxAvgStatistics`` of the non-null values; ``None`` each when empty."""
    present = [v for v in values if v is not None]
    if not present:
        return {"min": None, "max": None, "avg": None}
    return {"min": min(present), "max": max(present), "avg": math.fsum(present) / len(present)}


@dataclass(frozen=True)
class CompletedSummary:
    """What a job's completed checkpoints add up to."""

    summary: dict[str, dict[str, float | None]]  # by SUMMARY_FIELDS
    latest_checkpoint: int | None  # the newest completed checkpoint (not savepoint)
    latest_savepoint: int | None


@dataclass
class _Columns:
    count: int = 0
    max_id: int | None = None
    latest: dict[str, int] = field(default_factory=dict)  # kind -> newest id
    values: list[list[Any]] = field(default_factory=lambda: [[] for _ in SUMMARY_FIELDS])
    result: CompletedSummary | None = None

    def add(self, rows: Sequence[Sequence[Any]]) -> None:
        """Account for completed checkpoints ``(id, kind, *SUMMARY_FIELDS)`` not seen yet."""
        for row in rows:
            checkpoint_id, kind = row[0], row[1]
            self.max_id = checkpoint_id if self.max_id is None else max(self.max_id, checkpoint_id)
            self.latest[kind] = max(self.latest.get(kind, checkpoint_id), checkpoint_id)
        self.count += len(rows)
        for index, column in enumerate(self.values):
            new = [row[2 + index] for row in rows if row[2 + index] is not None]
            if len(new) > _INSORT_MAX:
                column.extend(new)
                column.sort()
            else:
                for value in new:
                    bisect.insort(column, value)
        self.result = None

    def summary(self) -> CompletedSummary:
        if self.result is None:
            self.result = CompletedSummary(
                summary={
                    name: summarize_sorted(column)
                    for name, column in zip(SUMMARY_FIELDS, self.values, strict=True)
                },
                latest_checkpoint=self.latest.get("checkpoint"),
                latest_savepoint=self.latest.get("savepoint"),
            )
        return self.result


class CheckpointSummaries:
    """Per-job summaries of completed checkpoints, refreshed from the database on change.

    Args:
        max_jobs: how many jobs' columns stay in memory (least recently read go first).
    """

    def __init__(self, max_jobs: int = 64) -> None:
        self.max_jobs = max_jobs
        self._jobs: OrderedDict[str, _Columns] = OrderedDict()
        self._lock = threading.Lock()

    def get(
        self, session: Session, job_id: str, completed: int, newest: int | None
    ) -> CompletedSummary:
        """The summary of the job's completed checkpoints.

        Args:
            session: an open session.
            job_id: the job.
            completed: how many completed checkpoints the caller just counted.
            newest: the newest completed checkpoint id the caller just read.
        """
        with self._lock:
            columns = self._jobs.get(job_id)
            if columns is not None:
                self._jobs.move_to_end(job_id)
                if columns.count == completed and columns.max_id == newest:
                    return columns.summary()
                if newest is not None and columns.max_id is not None and newest > columns.max_id:
                    rows = self._completed(session, job_id, after=columns.max_id)
                    if columns.count + len(rows) == completed:
                        columns.add(rows)
                        return columns.summary()
            columns = _Columns()
            columns.add(self._completed(session, job_id))
            self._jobs[job_id] = columns
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > self.max_jobs:
                self._jobs.popitem(last=False)
            return columns.summary()

    @staticmethod
    def _completed(
        session: Session, job_id: str, after: int | None = None
    ) -> Sequence[Sequence[Any]]:
        where = [C.job_id == job_id, C.status == COMPLETED]
        if after is not None:
            where.append(C.checkpoint_id > after)
        return [tuple(row) for row in session.execute(select(*_COLUMNS).where(*where))]
