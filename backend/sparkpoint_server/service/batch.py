"""One unit of work of the control plane: a transaction, then commands and deletions.

Everything decided while applying a batch of events, a timer tick or a request is written in
one database transaction. Commands to jobs and deletions of checkpoint state wait in the batch
until that transaction committed (DESIGN §1: the database row before the notification; never
delete state the database still lists).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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

    def command(self, job_id: str, attempt: int, payload: Any) -> None:
        self.commands.append(p.envelope(job_id, attempt, self.now, payload))
        self.touched.add(job_id)

    def later(self, action: Callable[[], None]) -> None:
        """Run ``action`` after the commit (best effort: failures are logged)."""
        self.after_commit.append(action)

    def run_after_commit(self) -> None:
        for action in self.after_commit:
            try:
                action()
            except Exception:  # a deletion that fails leaves garbage, never wrong state
                log.exception("post-commit action failed")
