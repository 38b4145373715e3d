"""The control plane's service: the one authority for connected jobs (DESIGN §1, §3).

Three things change its state, one at a time (a lock): batches of job events from the ingest,
timer ticks (periodic triggers, checkpoint timeouts, due restarts), and REST requests. Each is
one unit of work: decide with the pure coordinator, write everything in one database
transaction, then send the commands and delete what is no longer needed. A unit that fails
rolls back and the jobs it touched are rebuilt from the database, so memory never runs ahead
of what is stored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CheckpointTriggerError
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.transport import ReceivedMessage, Streams, send_commands
from sparkpoint_server.config import Settings
from sparkpoint_server.coordination.job import JobRuntime
from sparkpoint_server.errors import ConflictError, JobNotFoundError
from sparkpoint_server.ingest.consumer import TransientIngestError
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service import requests as r
from sparkpoint_server.service.batch import Batch, Disposer
from sparkpoint_server.service.events import EventApplier, RejectedEventError
from sparkpoint_server.service.recovery import load_active_jobs, load_job
from sparkpoint_server.storage.models import Job
from sparkpoint_server.storage.repository import BatchWriter

log = logging.getLogger(__name__)


class ControlPlane:
    """Coordinates every connected job; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        client: redis.Redis | None,
        *,
        streams: Streams | None = None,
        clock: Clock | None = None,
        stats: Any = None,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.client = client
        self.streams = streams or Streams()
        self.clock = clock or SystemClock()
        self.stats = stats
        self.jobs: dict[str, JobRuntime] = {}
        self._lock = threading.RLock()
        self.disposer = Disposer()
        # Writing ``_metadata`` files is I/O: several completions of a batch write at once.
        self._io = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sparkpoint-metadata")
        self.checkpoint_dir = str(settings.checkpoint_dir)
        self.savepoint_dir = str(settings.savepoint_dir)
        self.events = EventApplier(
            self.jobs,
            self.clock,
            checkpoint_dir=self.checkpoint_dir,
            savepoint_dir=self.savepoint_dir,
            on_stale=self._count_stale,
        )

    # ------------------------------------------------------------------ units of work

    @contextmanager
    def unit(self) -> Iterator[Batch]:
        """One transaction; then the commands and the deletions (see the module docstring)."""
        with self._lock:
            session = self.sessions()
            batch = Batch(BatchWriter(session), self.clock.now_ms(), pool=self._io)
            try:
                yield batch
                d.finish_completions(batch)
                d.record_acknowledged(batch)
                batch.writer.flush()
                session.commit()
            except BaseException:
                session.rollback()
                session.close()
                self._reload(batch.touched)
                raise
            session.close()
            self._send(batch.commands)
            self.disposer.submit(batch.after_commit)

    def _send(self, commands: list[p.Envelope]) -> None:
        if not commands or self.client is None:
            return
        try:
            send_commands(self.client, self.streams, commands)
        except redis.RedisError:
            # The decisions are stored; a job that misses a command times out its checkpoint
            # or is restarted, and completions are sent again at the next start.
            log.exception("sending %d command(s) failed", len(commands))

    def _reload(self, job_ids: set[str]) -> None:
        with self.sessions() as session:
            for job_id in job_ids:
                row = session.get(Job, job_id)
                if row is None:
                    self.jobs.pop(job_id, None)
                else:
                    self.jobs[job_id] = load_job(session, row, self.clock, self.checkpoint_dir)

    def wait_idle(self) -> None:
        """Wait for the background deletions submitted so far."""
        self.disposer.wait_idle()

    def close(self) -> None:
        self.disposer.close()
        self._io.shutdown(wait=True)

    def _count_stale(self) -> None:
        if self.stats is not None:
            self.stats.stale_messages += 1

    # ------------------------------------------------------------------ start

    def recover(self) -> None:
        """Rebuild every unfinished job from the database; re-send what a crash may have lost:
        the triggers of pending checkpoints and the completions whose sinks have not committed
        (the job ignores what it already has)."""
        with self._lock, self.sessions() as session:
            self.jobs.clear()
            for rt in load_active_jobs(session, self.clock, self.checkpoint_dir):
                self.jobs[rt.job_id] = rt
        commands = []
        now = self.clock.now_ms()
        for rt in self.jobs.values():
            # A trigger may have been lost between the commit and the send: the job ignores
            # one it already has (by id), so pending checkpoints are triggered again.
            for pc in sorted(rt.coordinator.pending.values(), key=lambda c: c.checkpoint_id):
                stop = pc.checkpoint_id == rt.stop_checkpoint
                commands.append(p.envelope(rt.job_id, pc.attempt, now, d.trigger_command(pc, stop)))
            for cid in sorted(rt.uncommitted):
                cp = rt.coordinator.store.get(cid)
                if cp is not None:
                    payload = p.NotifyCheckpointComplete(checkpoint_id=cid)
                    commands.append(p.envelope(rt.job_id, cp.attempt, now, payload))
        self._send(commands)
        log.info("control plane recovered %d unfinished job(s)", len(self.jobs))

    # ------------------------------------------------------------------ ingest

    def handle_batch(self, messages: list[ReceivedMessage]) -> None:
        """The ingest handler: apply a batch of events in one transaction.

        Raises:
            RejectedEventError: when one event contradicts the job's state; the consumer then
                retries the events one by one and dead-letters that one.
        """
        try:
            with self.unit() as batch:
                for m in messages:
                    batch.touched.add(m.envelope.job_id)
                    self.events.apply(batch, m.envelope, m.payload)
        except (OperationalError, InterfaceError) as err:  # the database is away, not the event
            raise TransientIngestError(f"database unavailable: {err}") from err

    # ------------------------------------------------------------------ timers

    def tick(self) -> None:
        """Timers of every running job: due restarts, expired checkpoints, periodic triggers,
        a failover past the tolerable checkpoint failures."""
        with self._lock:
            due = [rt for rt in self.jobs.values() if self._timers_due(rt)]
            if not due:
                return
            with self.unit() as batch:
                for rt in due:
                    batch.touched.add(rt.job_id)
                    self._tick_job(batch, rt)

    def _timers_due(self, rt: JobRuntime) -> bool:
        if rt.restart_due_at is not None:
            return rt.restart_due_at <= self.clock.now_ms()
        if rt.status is not p.JobStatus.RUNNING:
            return False
        now = self.clock.monotonic_ms()
        overdue = any(now >= pc.deadline_monotonic_ms() for pc in rt.coordinator.pending.values())
        stopping = rt.stop_checkpoint is not None or rt.final_requested
        return overdue or (not stopping and rt.coordinator.periodic_due())

    def _tick_job(self, batch: Batch, rt: JobRuntime) -> None:
        if rt.restart_due_at is not None:
            if rt.restart_due_at <= batch.now and rt.status is p.JobStatus.RESTARTING:
                d.restart_now(batch, rt)
            return
        d.handle_failed(batch, rt, rt.coordinator.expire_overdue())
        # Flink suspends periodic checkpoints while a job stops with a savepoint or ends.
        stopping = rt.stop_checkpoint is not None or rt.final_requested
        if rt.status is p.JobStatus.RUNNING and not stopping and rt.coordinator.periodic_due():
            try:
                d.trigger(batch, rt, periodic=True)
            except CheckpointTriggerError as err:  # raced with a pause or max concurrent
                log.debug("periodic trigger refused: %s", err)

    # ------------------------------------------------------------------ REST requests

    def trigger_checkpoint(self, job_id: str) -> str:
        """Trigger a checkpoint now; returns the request id."""
        return r.trigger_checkpoint(self, job_id)

    def trigger_savepoint(self, job_id: str, target_directory: str | None, cancel_job: bool) -> str:
        """Trigger a savepoint (then cancel the job if ``cancel_job``); returns the request id."""
        return r.trigger_savepoint(self, job_id, target_directory, cancel_job)

    def stop_with_savepoint(self, job_id: str, target_directory: str | None) -> str:
        """Take a savepoint, then finish the job; returns the request id."""
        return r.stop_with_savepoint(self, job_id, target_directory)

    def restore(self, job_id: str, checkpoint_id: int | None, savepoint_path: str | None) -> str:
        """Restore checkpoint N or a savepoint into a new attempt; returns the request id."""
        return r.restore(self, job_id, checkpoint_id, savepoint_path)

    def cancel(self, job_id: str) -> str:
        """Cancel the job; returns the request id."""
        return r.cancel(self, job_id)

    def update_checkpoint_config(self, job_id: str, changes: dict[str, int]) -> dict[str, Any]:
        """Change interval, timeout, tolerable failures, min pause or retained count."""
        return r.update_checkpoint_config(self, job_id, changes)

    def set_restart_strategy(
        self, job_id: str, conf: dict[str, str | int | float]
    ) -> dict[str, Any]:
        """Replace the job's restart strategy (Flink keys)."""
        return r.set_restart_strategy(self, job_id, conf)

    # ------------------------------------------------------------------ lookups

    def runtime(self, job_id: str) -> JobRuntime:
        rt = self.jobs.get(job_id)
        if rt is not None:
            return rt
        with self.sessions() as session:
            exists = session.execute(select(Job.job_id).where(Job.job_id == job_id)).first()
        if exists is None:
            raise JobNotFoundError(job_id)
        raise ConflictError(f"job {job_id} is not running (it has finished, failed or stopped)")

    def active_runtime(self, job_id: str) -> JobRuntime:
        rt = self.runtime(job_id)
        if not rt.active:
            raise ConflictError(f"job {job_id} is {rt.status.value}; the request needs a live job")
        return rt


__all__ = ["ControlPlane", "RejectedEventError"]
