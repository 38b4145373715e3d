"""The control plane's service: the one authority for connected jobs (DESIGN §1, §3).

Three things change its state, one at a time (a lock): batches of job events from the ingest,
timer ticks (periodic triggers, checkpoint timeouts, due restarts), and REST requests. Each is
one unit of work: decide with the pure coordinator, write everything in one database
transaction, then send the commands and delete what is no longer needed. A unit that fails
rolls back and the jobs it touched are rebuilt from the database, so memory never runs ahead
of what is stored.

Storage is never called under the lock (see :mod:`~sparkpoint_server.service.storage_io`):
a completion's ``_metadata`` is written after its unit committed, on a thread of its own and
bounded in time, and a fourth kind of unit records the outcome (on the finisher thread, or on
the ingest's after its next batch, whichever comes first); restore reads happen before
a request or a batch takes the lock; a failover's check of the checkpoint files it may
restore (:mod:`~sparkpoint_server.service.failover`) too, or, for a due restart, on a thread
of its own whose end ticks again.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import redis
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CheckpointTriggerError
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.signing import Signer, job_key, load_or_create_secret, verify
from sparkpoint.transport import ReceivedMessage, Streams
from sparkpoint_server.config import Settings
from sparkpoint_server.coordination.job import ORIGIN_PIN, JobRuntime
from sparkpoint_server.ingest.consumer import RejectedEvent, TransientIngestError
from sparkpoint_server.service import completions, disposal, origins, senders, storage_io
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service import failover as fo
from sparkpoint_server.service import final_checkpoint as final
from sparkpoint_server.service import heartbeats as hb
from sparkpoint_server.service import requests as r
from sparkpoint_server.service.batch import Batch, CommandSender, Disposer
from sparkpoint_server.service.events import EventApplier, RejectedEventError, UnknownJobError
from sparkpoint_server.service.recovery import load_active_jobs, load_job
from sparkpoint_server.service.registration import read_restore_points, start_paths
from sparkpoint_server.service.storage_io import StorageRoots, parse_roots
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
        self.streams = streams or Streams()
        self.clock = clock or SystemClock()
        self.stats = stats
        self.jobs: dict[str, JobRuntime] = {}
        # Since when the ingest reads events (None: it cannot): no heartbeat can arrive while
        # it cannot, so no driver is declared lost then, and each gets a full timeout after.
        self._ingest_up_since: float | None = self.clock.monotonic_ms()
        # The monotonic time before which every event that entered the events stream is
        # applied (:meth:`ingest_read_through`); None: no ingest reports it (events applied by
        # hand), so checkpoints expire by the clock alone.
        self._read_through: float | None = None
        self._lock = threading.RLock()
        self.storage_timeout_s = settings.storage_timeout
        self.roots = StorageRoots(str(settings.data_dir), parse_roots(settings.storage_roots))
        self.disposer = Disposer(self.storage_timeout_s)
        # Savepoints being disposed of (service.disposal): no restore by path reads them.
        self.disposing: set[storage_io.Location] = set()
        # Where registrations and restore requests read a checkpoint they start from, until
        # they are applied (:meth:`starting_from`): retention keeps what is there.
        self.starting: Counter[storage_io.Location] = Counter()
        # Every event is verified with its job's key and every command signed with it
        # (sparkpoint.signing); the secret they derive from stays in the data directory.
        # A job's key is derived once (two HMACs), not for every event verified and command
        # signed; an event of an unknown job id has it derived too, hence a bounded cache.
        secret = load_or_create_secret(settings.data_dir)
        self.key_of = functools.lru_cache(maxsize=4096)(lambda job_id: job_key(secret, job_id))
        self.signer = Signer(self.key_of, f"cp-{uuid.uuid4().hex}")
        self.sender = CommandSender(
            client, self.streams, self.signer, retry_for_s=settings.redis_retry_window
        )
        # Completions whose ``_metadata`` is written finish here, one unit at a time.
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkpoint-finish")
        self.checkpoint_dir = str(settings.checkpoint_dir)
        self.savepoint_dir = str(settings.savepoint_dir)
        self.events = EventApplier(
            self.jobs,
            self.clock,
            checkpoint_dir=self.checkpoint_dir,
            savepoint_dir=self.savepoint_dir,
            on_stale=self._count_stale,
            heartbeat_timeout_ms=settings.heartbeat_timeout_ms,
            roots=self.roots,
            disposing=self.disposing,
        )

    @property
    def lock(self) -> AbstractContextManager[bool]:
        """The coordination lock (hold it briefly: never around storage I/O)."""
        return self._lock

    # ------------------------------------------------------------------ units of work

    @contextmanager
    def unit(self) -> Iterator[Batch]:
        """One transaction; then the commands and the deletions (see the module docstring)."""
        with self._lock:
            session = self.sessions()
            batch = Batch(
                BatchWriter(session), self.clock.now_ms(), jobs=self.jobs, starting=self.starting
            )
            try:
                yield batch
                d.record_acknowledged(batch)
                batch.writer.flush()
                session.commit()
            except BaseException:
                session.rollback()
                session.close()
                self._reload(batch.touched)
                raise
            session.close()
            try:
                self.sender.send(batch.commands)
            finally:  # what was committed is carried out, whatever became of the commands
                self.disposer.submit(batch.after_commit)
                for rt, cid in batch.completions:
                    self._write_completion(rt, cid)

    @contextmanager
    def starting_from(self, paths: Iterable[str]) -> Iterator[None]:
        """While a registration or a restore request reads the checkpoints at ``paths`` and
        until it is applied, no retention deletes them (:func:`~.origins.relied_on`)."""
        # (A path with a NUL byte is no place: reading it fails, and the job is refused.)
        places = [at for path in paths if "\x00" not in path for at in storage_io.aliases(path)]
        if not places:  # most ingest batches: no registration, no lock taken
            yield
            return
        with self._lock:
            self.starting.update(places)
        try:
            yield
        finally:
            with self._lock:
                self.starting -= Counter(places)  # in place; a place no reader holds goes

    # ------------------------------------------------------------------ completions

    def _write_completion(self, rt: JobRuntime, cid: int) -> None:
        """Start writing a completion's ``_metadata`` (:func:`completions.start_write`); its
        end finishes it."""
        written = completions.start_write(rt, cid, self.storage_timeout_s)
        if written is not None:
            written.add_done_callback(self._on_written)

    def _on_written(self, _: object) -> None:
        try:
            self._finisher.submit(self._finish_written)
        except RuntimeError:  # closed: the next start completes it from the stored acks
            log.info("a completion's write ended after the control plane closed")

    def _finish_written(self) -> None:
        """Finish, in one unit, every completion whose write ended (in id order per job)."""
        try:
            with self._lock:
                ready = [
                    (rt, cid)
                    for rt in self.jobs.values()
                    for cid in completions.ready_completions(rt)
                ]
                if not ready:
                    return
                with self.unit() as batch:
                    for rt, cid in ready:
                        batch.touched.add(rt.job_id)
                        completions.finish_completion(batch, rt, cid)
        except Exception:  # the jobs were rebuilt from the database; their acks stay stored
            log.exception("finishing completed checkpoints failed")

    def _reload(self, job_ids: set[str]) -> None:
        with self.sessions() as session:
            for job_id in job_ids:
                row = session.get(Job, job_id)
                if row is None:
                    self.jobs.pop(job_id, None)
                else:
                    self.jobs[job_id] = load_job(session, row, self.clock, self.checkpoint_dir)

    def wait_idle(self) -> None:
        """Wait for the completions being written and the failover checks (each at most the
        storage timeout), and the background deletions submitted so far."""
        while True:
            with self._lock:
                writes = [
                    e.written
                    for rt in self.jobs.values()
                    for e in rt.finalizing.values()
                    if e.written is not None
                ]
                writes += [
                    rt.failover_check.future
                    for rt in self.jobs.values()
                    if rt.failover_check is not None and not rt.failover_check.settled
                ]
            if not writes:
                break
            wait(writes)
            self._finisher.submit(lambda: None).result()  # after the finishes they queued
        self.disposer.wait_idle()

    def close(self) -> None:
        self._finisher.shutdown(wait=True)
        self.disposer.close()

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
        active = [rt for rt in self.jobs.values() if rt.active]  # not recovery._kept's
        for rt in active:
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
        self.sender.send(commands)
        log.info("control plane recovered %d unfinished job(s)", len(active))

    # ------------------------------------------------------------------ ingest

    def verify_event(self, envelope: p.Envelope) -> str | None:
        """The ingest's check of an event's signature: why it is forged, or None."""
        return verify(self.key_of(envelope.job_id), envelope)

    def handle_batch(self, messages: list[ReceivedMessage]) -> list[RejectedEvent]:
        """The ingest handler: apply a batch of events in one transaction, except replayed
        copies of events applied before (:mod:`~sparkpoint_server.service.senders`).

        Returns:
            The events of unknown jobs and the replays, refused (the consumer dead-letters
            them).

        Raises:
            RejectedEventError: when one event contradicts the job's state; the consumer then
                retries the events in smaller batches and dead-letters that one.
        """
        rejected: list[RejectedEvent] = []
        with self.starting_from(start_paths(messages)):
            self._apply_batch(messages, rejected)
        # The completions whose write ended meanwhile finish here, in a unit of their own, as
        # on the finisher thread (which then finds nothing left): under a steady ingest that
        # thread's unit waited for the interpreter lock at every statement while it held the
        # coordination lock, and the ingest waited for it.
        self._finish_written()
        return rejected

    def _apply_batch(self, messages: list[ReceivedMessage], rejected: list[RejectedEvent]) -> None:
        points = read_restore_points(self, messages)
        try:
            verdicts = fo.check_registrations(self, messages)
            with self.unit() as batch:
                batch.restore_points = points
                batch.failover_verdicts = verdicts
                fresh, replays = senders.screen(batch.writer.session, messages)
                rejected.extend(replays)
                for m in fresh:
                    batch.touched.add(m.envelope.job_id)
                    try:
                        self.events.apply(batch, m.envelope, m.payload)
                    except UnknownJobError as err:
                        rejected.append(RejectedEvent(m.entry_id, str(err)))
        except (OperationalError, InterfaceError) as err:  # the database is away, not the event
            raise TransientIngestError(f"database unavailable: {err}") from err

    def ingest_health(self, up: bool) -> None:
        """The ingest reads the events stream again (``up``) or cannot (Redis or the database
        is away): the heartbeat timeout counts only while it reads."""
        with self._lock:
            if not up:
                self._ingest_up_since = None
            elif self._ingest_up_since is None:
                self._ingest_up_since = self.clock.monotonic_ms()

    def track_ingest(self) -> None:
        """An ingest will report how far it has read (:meth:`ingest_read_through`); until it
        does, no deadline passes: what the jobs sent may wait in the stream."""
        self._read_through = -math.inf

    def ingest_read_through(self, monotonic_ms: float) -> None:
        """Every event that entered the events stream before ``monotonic_ms`` is applied.

        Checkpoint deadlines and heartbeat timeouts are judged by arrival, as in Flink, where
        acknowledgements queue in the JobManager's mailbox ahead of the timeout: an ingest
        behind its stream (a burst, a restart with a backlog) expires no checkpoint and loses
        no driver whose events wait unread.
        """
        self._read_through = max(self._read_through or -math.inf, monotonic_ms)

    def _heard_until(self) -> float:
        now = self.clock.monotonic_ms()
        return now if self._read_through is None else min(now, self._read_through)

    # ------------------------------------------------------------------ timers

    def tick(self) -> None:
        """Timers of every running job: due restarts, drivers silent past the heartbeat
        timeout, expired checkpoints, a final checkpoint that waited after one failed,
        periodic triggers, a failover past the tolerable checkpoint failures."""
        with self._lock:
            due = [rt for rt in self.jobs.values() if self._timers_due(rt)]
            released = origins.released_pins(self.jobs, self.starting)
            # What an ended job's retention dropped (a restart replays it) is handed out here.
            ended = [
                rt for rt in self.jobs.values() if not rt.active and rt.coordinator.subsumed_waiting
            ]
            if not due and not released and not ended:
                return
            with self.unit() as batch:
                for rt, cid in released:
                    batch.touched.add(rt.job_id)
                    d.unpin(batch, rt, cid, ORIGIN_PIN, drain=False)
                for rt in ended:
                    batch.touched.add(rt.job_id)
                    d.discard_subsumed(batch, rt)
                for rt in due:
                    batch.touched.add(rt.job_id)
                    self._tick_job(batch, rt)

    def _timers_due(self, rt: JobRuntime) -> bool:
        if rt.held_acks:
            return True
        if rt.restart_due_at is not None:
            checking = rt.failover_check is not None and not rt.failover_check.future.done()
            return rt.restart_due_at <= self.clock.now_ms() and not checking
        now = self._heard_until()
        if self._driver_silent(rt, now):
            return True
        if rt.status is not p.JobStatus.RUNNING:
            return False
        overdue = any(now >= pc.deadline_monotonic_ms() for pc in rt.coordinator.pending.values())
        stopping = rt.stop_checkpoint is not None or rt.final_requested
        queued = (
            bool(rt.queued_checkpoints)
            and rt.tasks_running
            and rt.coordinator.pending_count < rt.coordinator.config.max_concurrent
        )
        if overdue or final.due(rt):
            return True
        return not stopping and (queued or rt.periodic_due())

    def _checked(self, rt: JobRuntime) -> fo.Verdicts | None:
        """The verdicts of the check of a due restart's checkpoint files; None while it runs
        (started here, on a thread of its own: its end ticks again)."""
        check = rt.failover_check
        assert rt.restart_due_at is not None
        if check is None or (check.due_at, check.attempt) != (rt.restart_due_at, rt.attempt):
            check = rt.failover_check = fo.FailoverCheck.start(rt, self.storage_timeout_s)
            check.future.add_done_callback(lambda _: self._on_checked(check))
            return None
        if not check.future.done():
            return None
        rt.failover_check = None
        return check.verdicts()

    def _on_checked(self, check: fo.FailoverCheck) -> None:
        def tick() -> None:
            try:
                self.tick()
            except Exception:  # the jobs were rebuilt from the database; the timer ticks again
                log.exception("restarting after a failover check failed")
            finally:
                check.settled = True

        try:
            self._finisher.submit(tick)
        except RuntimeError:  # closed: the next start's timer restarts the job
            check.settled = True

    def _driver_silent(self, rt: JobRuntime, now: float) -> bool:
        listening = self._ingest_up_since
        if listening is None:
            return False
        return hb.silent(rt, now, self.settings.heartbeat_timeout_ms, counting_from=listening)

    def _tick_job(self, batch: Batch, rt: JobRuntime) -> None:
        held, rt.held_acks = rt.held_acks, []
        for attempt, ack in held:  # a completion that was not recorded: completed again
            result = rt.coordinator.acknowledge(attempt, ack)
            if result.completed is not None:
                completions.complete_and_subsume(batch, rt, result.completed, self.savepoint_dir)
        if rt.restart_due_at is not None:
            if rt.restart_due_at <= batch.now and rt.status is p.JobStatus.RESTARTING:
                verdicts = self._checked(rt)
                if verdicts is not None:
                    fo.restart_now(batch, rt, verdicts)
            return
        if self._driver_silent(rt, self._heard_until()):
            hb.driver_lost(batch, rt, self.settings.heartbeat_timeout_ms)
            return
        expired = rt.coordinator.expire_overdue(self._heard_until(), rt.epoch_ends.why_expired)
        d.handle_failed(batch, rt, expired)
        if final.trigger_if_due(batch, rt):
            return
        # Flink suspends periodic checkpoints while a job stops with a savepoint or ends.
        stopping = rt.stop_checkpoint is not None or rt.final_requested
        if not stopping and d.trigger_queued(batch, rt):  # manual requests go first
            return
        if rt.status is p.JobStatus.RUNNING and not stopping and rt.periodic_due():
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

    def dispose_savepoint(self, path: str) -> dict[str, Any]:
        """Forget a savepoint and delete its files (:mod:`~.disposal`); returns what went."""
        return disposal.dispose_savepoint(self, path)

    def update_checkpoint_config(self, job_id: str, changes: dict[str, int]) -> dict[str, Any]:
        """Change interval, timeout, tolerable failures, min pause or retained count."""
        return r.update_checkpoint_config(self, job_id, changes)

    def set_restart_strategy(
        self, job_id: str, conf: dict[str, str | int | float]
    ) -> dict[str, Any]:
        """Replace the job's restart strategy (Flink keys)."""
        return r.set_restart_strategy(self, job_id, conf)


__all__ = ["ControlPlane", "RejectedEventError"]
