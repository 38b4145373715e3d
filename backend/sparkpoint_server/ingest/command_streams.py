"""Deleting the command streams of jobs that ended, once nothing in them can still matter.

A job's driver reads ``<prefix>:commands:<job_id>`` in the group ``job`` and acknowledges what
it obeyed (and trims it, :class:`sparkpoint.transport.CommandChannel`). Once the job is
FINISHED, CANCELED or FAILED, its stream is deleted when either:

- the driver read and acknowledged every command in it, or
- its newest command is older than ``grace_ms`` and still unacknowledged: no driver reads
  the stream (a driver that starts later reads from the stream's end, so it would never see
  those commands).

A command sent after the deletion (a driver of the ended job registered again, a restarted
control plane re-sending) creates the stream anew, and a driver whose group disappeared
reads it from its start. The deletion is a WATCHed transaction: a command added between the
check and the deletion keeps the stream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint.clock import Clock, SystemClock
from sparkpoint.failure_streak import FailureStreak
from sparkpoint.stream_retention import consumption
from sparkpoint.transport import Streams
from sparkpoint_server.coordination.job import TERMINAL
from sparkpoint_server.storage.models import Job

log = logging.getLogger(__name__)

EndedJobs = Callable[[list[str]], set[str]]
"""Of the given job ids, those whose job is FINISHED, CANCELED or FAILED."""

_QUERY_CHUNK = 500


def ended_jobs_in(sessions: sessionmaker[Session]) -> EndedJobs:
    """An :data:`EndedJobs` that asks the control plane's database."""
    terminal = sorted(status.value for status in TERMINAL)

    def ended(job_ids: list[str]) -> set[str]:
        found: set[str] = set()
        with sessions() as session:
            for start in range(0, len(job_ids), _QUERY_CHUNK):
                chunk = job_ids[start : start + _QUERY_CHUNK]
                query = select(Job.job_id).where(Job.job_id.in_(chunk), Job.status.in_(terminal))
                found.update(session.scalars(query))
        return found

    return ended


class CommandStreamRetention:
    """Deletes the command streams of ended jobs; see the module docstring."""

    def __init__(
        self,
        client: redis.Redis,
        ended_jobs: EndedJobs,
        *,
        streams: Streams = Streams(),  # noqa: B008 - a frozen dataclass
        grace_ms: int = 300_000,
        clock: Clock | None = None,
    ) -> None:
        """Prepare the retention (no I/O until :meth:`sweep`).

        Args:
            client: A Redis client returning bytes.
            ended_jobs: Which of some jobs ended.
            streams: The stream names.
            grace_ms: How long an unacknowledged command of an ended job is kept.
            clock: Wall-clock time, compared with the entry ids' milliseconds.
        """
        self.client = client
        self.ended_jobs = ended_jobs
        self.streams = streams
        self.grace_ms = grace_ms
        self.clock = clock or SystemClock()

    def sweep(self) -> list[str]:
        """Delete the command streams of ended jobs that may go.

        Returns:
            The ids of the jobs whose command stream was deleted.

        Raises:
            redis.RedisError: Redis failed (the next sweep tries again).
        """
        prefix = self.streams.commands("")
        job_ids = [key.decode()[len(prefix) :] for key in self._keys(prefix + "*")]
        if not job_ids:
            return []
        deleted = [
            job_id for job_id in sorted(self.ended_jobs(job_ids)) if self._delete_if_done(job_id)
        ]
        if deleted:
            log.info("deleted the command streams of %d ended job(s)", len(deleted))
        return deleted

    def run(self, stop: threading.Event, interval_s: float) -> None:
        """Sweep every ``interval_s`` until ``stop`` is set; never raises."""
        failures = FailureStreak("the sweep of ended jobs' command streams", log, traceback=False)
        while not stop.wait(interval_s):
            try:
                self.sweep()
            except Exception:  # Redis or the database away: the next sweep retries
                failures.failed()
            else:
                failures.ended()

    def _keys(self, pattern: str) -> Iterable[bytes]:
        return self.client.scan_iter(match=pattern, count=1000, _type="stream")

    def _delete_if_done(self, job_id: str) -> bool:
        stream = self.streams.commands(job_id)
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(stream)
                state = consumption(pipe, stream)  # immediate mode while watching
                if state is None:
                    return False
                age_ms = self.clock.now_ms() - state.last_entry.ms
                if not (state.all_acknowledged or age_ms >= self.grace_ms):
                    return False
                pipe.multi()
                pipe.delete(stream)
                pipe.execute()
            except redis.WatchError:
                log.info("kept %s: a command was added while checking it", stream)
                return False
        return True
