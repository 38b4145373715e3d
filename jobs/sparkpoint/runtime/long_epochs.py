"""An epoch that runs far past its target says so, and what Spark is doing meanwhile.

An epoch is one Spark job, and the driver waits for it. When a task hangs (its checkpoint
storage unreachable and retrying, a sink's database that stopped answering, a source that
blocks), the driver waits silently: nothing reaches the console until the epoch ends or
fails. :class:`LongEpochWatch` tells every :data:`WARN_AFTER_S` which epoch has run how long
and how far its Spark stages got (per operator, when each stage runs one: tasks done, running,
failed), and once more when it ends, so that the person watching a stalled job sees where it
stands and whether it moves.
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

#: How long an epoch runs before its driver says so, and then how often (epochs aim at about
#: a second).
WARN_AFTER_S = 30.0


class LongEpochWatch:
    """A context around one epoch's Spark job (job group ``group``, described by ``desc``);
    ``vertices``: the operators of its stages in order, when each stage runs one
    (:func:`~sparkpoint.runtime.failover.chain`)."""

    def __init__(self, sc: Any, group: str, desc: str, vertices: list[str] | None = None) -> None:
        self.sc = sc
        self.group = group
        self.desc = desc
        self.vertices = vertices
        self.after_s = WARN_AFTER_S
        self.started = 0.0
        self.said = threading.Event()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="long-epoch-watch", daemon=True)

    def __enter__(self) -> LongEpochWatch:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._ended.set()
        self._thread.join()
        if self.said.is_set():
            how = "ended" if kind is None else "failed"
            log.warning("%s %s after %.1f s", self.desc, how, time.monotonic() - self.started)

    def _watch(self) -> None:
        while not self._ended.wait(self.after_s):
            self._say()

    def _say(self) -> None:
        ran = time.monotonic() - self.started
        log.warning(
            "%s has run for %.0f s and has not ended (an epoch aims at about a second): %s",
            self.desc,
            ran,
            self.progress(),
        )
        self.said.set()

    def progress(self) -> str:
        """The epoch's Spark stages and their tasks, as Spark's status tracker has them."""
        try:
            tracker = self.sc.statusTracker()
            stages = [
                stage
                for job_id in sorted(tracker.getJobIdsForGroup(self.group))
                if (job := tracker.getJobInfo(job_id)) is not None
                for stage_id in sorted(job.stageIds)
                if (stage := tracker.getStageInfo(stage_id)) is not None
            ]
        except Exception as err:  # a Spark that cannot say: the warning stands without it
            return f"Spark cannot say how far it got ({type(err).__name__})"
        if not stages:
            return "no Spark stage of it has started"
        names = (
            self.vertices
            if self.vertices is not None and len(self.vertices) == len(stages)
            else [f"stage {s.stageId}" for s in stages]
        )
        return "; ".join(
            f"{name}: {s.numCompletedTasks} of {s.numTasks} tasks done, "
            f"{s.numActiveTasks} running"
            + (f", {s.numFailedTasks} failed" if s.numFailedTasks else "")
            for name, s in zip(names, stages, strict=True)
        )
