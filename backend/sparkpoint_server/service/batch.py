"""One unit of work of the control plane: a transaction, then commands and deletions.

Everything decided while applying a batch of events, a timer tick or a request is written in
one database transaction. Commands to jobs and deletions of checkpoint state wait in the batch
until that transaction committed (DESIGN §1: the database row before the notification; never
delete state the database still lists).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis

from sparkpoint import protocol as p
from sparkpoint.signing import Signer
from sparkpoint.transport import (
    RETRY_FOR_S,
    RedisUnreachableError,
    Streams,
    TransportError,
    send_commands,
)
from sparkpoint_server.errors import StorageUnavailableError
from sparkpoint_server.service import storage_io
from sparkpoint_server.service.storage_io import Location
from sparkpoint_server.storage.repository import BatchWriter

log = logging.getLogger(__name__)


@dataclass
class Batch:
    writer: BatchWriter
    now: int
    commands: list[p.Envelope] = field(default_factory=list)
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # job ids whose runtime changed
    # Completions decided in this batch whose ``_metadata`` is written once it committed,
    # outside the lock: (job runtime, checkpoint id).
    completions: list[tuple[Any, int]] = field(default_factory=list)
    # Pending checkpoints acknowledged in this batch: (job, id) -> (runtime, latest ack time).
    acknowledged: dict[tuple[str, int], tuple[Any, int]] = field(default_factory=dict)
    # Read before the lock was taken: ``--from-checkpoint`` path -> RestorePoint or the error.
    restore_points: dict[str, Any] = field(default_factory=dict)
    # Checked before the lock was taken: job id -> the verdicts on the files of the checkpoints
    # a failover of that job may restore (``service.failover``), for drivers registering again.
    failover_verdicts: dict[str, Any] = field(default_factory=dict)
    # Every job the control plane holds (job id -> runtime): a decision about one job that
    # another may depend on (retention keeping another job's origin) looks them up here.
    jobs: dict[str, Any] = field(default_factory=dict)
    # Where registrations and restore requests read the checkpoints they start from, before
    # they are applied (the control plane's, live): retention keeps those too.
    starting: Collection[Location] = field(default_factory=tuple)

    def command(self, job_id: str, attempt: int, payload: Any) -> None:
        self.commands.append(p.envelope(job_id, attempt, self.now, payload))
        self.touched.add(job_id)

    def later(self, action: Callable[[], None]) -> None:
        """Delete state after the commit, in the background (best effort: logged on failure);
        the ingest does not wait for the filesystem (Flink disposes checkpoints the same way,
        in an I/O executor)."""
        self.after_commit.append(action)


class Disposer:
    """Runs deletions after their transaction committed, in order, on one background thread;
    each is given up after ``timeout_s`` seconds (it leaves garbage, never wrong state)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkpoint-dispose")
        self._last: Future[None] | None = None
        self._timeout_s = timeout_s

    def submit(self, actions: list[Callable[[], None]]) -> None:
        if actions:
            self._last = self._pool.submit(_run_all, actions, self._timeout_s)

    def wait_idle(self) -> None:
        """Wait until every submitted deletion ran (tests, shutdown)."""
        if self._last is not None:
            self._last.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _run_all(actions: list[Callable[[], None]], timeout_s: float) -> None:
    for action in actions:
        try:
            storage_io.call("disposing checkpoint state", timeout_s, action)
        except StorageUnavailableError:  # a deletion that fails leaves garbage, never wrong state
            log.exception("disposing checkpoint state failed")


class CommandSender:
    """Sends the commands of committed units to the jobs, in the order the units committed,
    without a unit waiting for Redis under the coordination lock.

    Commands go at once when Redis takes them (one attempt, as a unit ends). When it does not
    (down, or refusing for a while: :func:`~sparkpoint.transport.retrying`), they wait in a
    queue, and so do those of every unit after them, while a thread of their own retries the
    first for up to ``retry_for_s``; then the queue goes, in order. Commands Redis did not
    take in that time are given up: the decisions are stored, a job that misses a command
    times out its checkpoint or is restarted, and completions are notified again at the next
    start (a later completion subsumes an earlier one's notification, as in Flink).
    """

    def __init__(
        self,
        client: redis.Redis | None,
        streams: Streams,
        signer: Signer,
        retry_for_s: float = RETRY_FOR_S,
    ) -> None:
        self.client, self.streams, self.signer = client, streams, signer
        self.retry_for_s = retry_for_s
        self._queue: deque[list[p.Envelope]] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()

    def send(self, commands: list[p.Envelope]) -> None:
        """Send ``commands`` now, or queue them behind those that wait for Redis."""
        if not commands or self.client is None:
            return
        with self._lock:
            if self._queue:
                self._queue.append(commands)
                return
        try:
            self._send(commands, retry_for_s=0)
        except RedisUnreachableError as err:
            log.warning("%s wait for Redis: %s", _count(commands), err)
            with self._lock:
                self._queue.append(commands)
                self._idle.clear()
            threading.Thread(target=self._drain, name="sparkpoint-commands", daemon=True).start()
        except TransportError as err:
            log.warning("%s not sent: %s", _count(commands), err)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no command waits for Redis; whether none does."""
        return self._idle.wait(timeout_s)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._idle.set()
                    return
                commands = self._queue[0]
            try:
                self._send(commands, retry_for_s=self.retry_for_s)
            except TransportError as err:
                with self._lock:
                    given_up = [c for waiting in self._queue for c in waiting]
                    self._queue.clear()
                log.warning("%s given up: %s", _count(given_up), err)
                continue
            with self._lock:
                self._queue.popleft()

    def _send(self, commands: list[p.Envelope], *, retry_for_s: float) -> None:
        assert self.client is not None
        send_commands(
            self.client, self.streams, commands, signer=self.signer, retry_for_s=retry_for_s
        )


def _count(commands: list[p.Envelope]) -> str:
    kinds = ", ".join(sorted({c.type for c in commands}))
    return f"{len(commands)} command(s) ({kinds})"
