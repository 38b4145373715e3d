"""One unit of work of the control plane: a transaction, then commands and deletions.

Everything decided while applying a batch of events, a timer tick or a request is written in
one database transaction. Commands to jobs and deletions of checkpoint state wait in the batch
until that transaction committed (DESIGN §1: the database row before the notification; never
delete state the database still lists).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkpoint import protocol as p
from sparkpoint_server.storage.repository import BatchWriter

log = logging.getLogger(__name__)


@dataclass
class Batch:
    writer: BatchWriter
    now: int
    commands: list[p.Envelope] = field(default_factory=list)
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # job ids whose runtime changed
    # Completions whose ``_metadata`` is being written: (job runtime, checkpoint, future).
    completions: list[tuple[Any, Any, Future[Any]]] = field(default_factory=list)
    pool: ThreadPoolExecutor | None = None  # the I/O pool; None: run inline
    # Pending checkpoints acknowledged in this batch: (job, id) -> (runtime, latest ack time).
    acknowledged: dict[tuple[str, int], tuple[Any, int]] = field(default_factory=dict)

    def io(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run blocking I/O on the pool (or now, without one); the result is a future."""
        if self.pool is not None:
            return self.pool.submit(fn, *args)
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as err:
            future.set_exception(err)
        return future

    def command(self, job_id: str, attempt: int, payload: Any) -> None:
        self.commands.append(p.envelope(job_id, attempt, self.now, payload))
        self.touched.add(job_id)

    def later(self, action: Callable[[], None]) -> None:
        """Delete state after the commit, in the background (best effort: logged on failure);
        the ingest does not wait for the filesystem (Flink disposes checkpoints the same way,
        in an I/O executor)."""
        self.after_commit.append(action)


class Disposer:
    """Runs deletions after their transaction committed, in order, on one background thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkpoint-dispose")
        self._last: Future[None] | None = None

    def submit(self, actions: list[Callable[[], None]]) -> None:
        if actions:
            self._last = self._pool.submit(_run_all, actions)

    def wait_idle(self) -> None:
        """Wait until every submitted deletion ran (tests, shutdown)."""
        if self._last is not None:
            self._last.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _run_all(actions: list[Callable[[], None]]) -> None:
    for action in actions:
        try:
            action()
        except Exception:  # a deletion that fails leaves garbage, never wrong state
            log.exception("disposing checkpoint state failed")
