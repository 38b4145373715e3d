"""What a running job tells the person who started it: one line per thing that happened.

``sparkpoint run`` prints, on stderr: the job starting (its id, mode, checkpoint storage; in
connected mode the control plane's API and dashboard), RUNNING on which Spark application,
every k-th completed checkpoint with its duration (``--log-every``), each aborted checkpoint,
each failure with its cause in one line, each restore, status changes with their cause, and
a summary when the job ends. ``--quiet`` keeps failures, restores and the end only;
``--log-format json`` prints each line as one JSON object (``time``, ``level``, ``job``,
``event``, ``message`` and the event's fields) for log collectors.

Spark's own log goes to ``<local dir>/<job id>/spark.log`` (``runtime/log4j2.properties``),
so task failures reach the console as Sparkpoint's one line, not as Java stack traces.

:class:`ConsoleEventSink` sees every event the job publishes (it is one more event sink);
connected jobs also report here what only the control plane decides (a completion).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from sparkpoint import protocol as p
from sparkpoint.events import EventSink

LOG_FORMATS = ("text", "json")

#: Statuses whose change the console reports (RUNNING once per attempt, with the Spark app).
_REPORTED = {
    p.JobStatus.RESTARTING,
    p.JobStatus.FAILING,
    p.JobStatus.CANCELLING,
    p.JobStatus.FAILED,
    p.JobStatus.CANCELED,
}


class Console:
    """Writes the job's lines (text or JSON) to ``stream``."""

    def __init__(
        self,
        job_id: str,
        *,
        log_format: str = "text",
        quiet: bool = False,
        every: int = 10,
        stream: TextIO | None = None,
    ) -> None:
        if log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {LOG_FORMATS}, not {log_format!r}")
        self.job_id = job_id
        self.log_format = log_format
        self.quiet = quiet
        self.every = max(1, every)
        self.stream = stream if stream is not None else sys.stderr
        self.checkpoints = 0  # completed, counted for ``every``
        # The attempt this driver started in, when it took over a job that earlier drivers
        # ran (the supervisor's next driver after one died): its counts start there. The
        # connected authority sets it from the first restore it obeys.
        self.took_over_at: int | None = None

    def line(
        self, event: str, message: str, *, level: str = "info", always: bool = False, **fields: Any
    ) -> None:
        """One line; ``level`` "info" lines are left out when quiet, unless ``always``."""
        if self.quiet and level == "info" and not always:
            return
        if self.log_format == "json":
            record = {
                "time": round(time.time(), 3),
                "level": level,
                "job": self.job_id,
                "event": event,
                "message": message,
                **{k: v for k, v in fields.items() if v is not None},
            }
            text = json.dumps(record, default=str)
        else:
            mark = "" if level == "info" else f"{level.upper()}: "
            text = f"sparkpoint {self.job_id[:12]}: {mark}{message}"
        print(text, file=self.stream, flush=True)

    def checkpoint_completed(
        self, checkpoint_id: int, kind: str, duration_ms: float | None, size: int | None
    ) -> None:
        """The 1st, then every ``every``-th completed checkpoint, and every savepoint."""
        self.checkpoints += 1
        if kind == p.CheckpointKind.CHECKPOINT.value and (self.checkpoints - 1) % self.every:
            return
        took = f" in {duration_ms:,.0f} ms" if duration_ms is not None else ""
        sized = f", {size_text(size)}" if size is not None else ""
        self.line(
            "checkpoint_completed",
            f"{kind} {checkpoint_id} completed{took}{sized} ({self.checkpoints} so far)",
            checkpoint_id=checkpoint_id,
            duration_ms=duration_ms,
            state_size=size,
        )

    def ended(
        self, status: str, records: int, duration_s: float, checkpoints: int, restores: int
    ) -> None:
        """How the job ended, with its summary (also when quiet)."""
        rate = records / duration_s if duration_s > 0 else 0.0
        since = ""
        if self.took_over_at is not None:
            since = f" since this driver took over at attempt {self.took_over_at}"
        self.line(
            "job_ended",
            f"{status}: {records:,} records in {duration_s:.1f} s ({rate:,.0f}/s){since}, "
            f"{checkpoints} checkpoints completed, {restores} restores",
            level="info" if status == "FINISHED" else "error",
            always=True,
            status=status,
            records=records,
            duration_s=round(duration_s, 3),
            checkpoints=checkpoints,
            restores=restores,
            took_over_at=self.took_over_at,
        )


def size_text(size: int) -> str:
    """Bytes as people read them: ``812 B``, ``23.7 KiB``, ``1.2 GiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{size} B"


class ConsoleEventSink(EventSink):
    """Turns the job's published events into console lines."""

    def __init__(
        self,
        console: Console,
        *,
        spark_log: str | None = None,
        chains: Mapping[str, str] | None = None,
    ) -> None:
        """``chains``: each vertex's operators (``events -> parse``), which a failure of a
        vertex that chains several names, as Flink names a task by its chain."""
        self.console = console
        self.spark_log = spark_log
        self.chains = chains or {}
        self._running_attempt: int | None = None

    #: The event types that make a line (others are not even decoded).
    SHOWN = frozenset(
        {
            "job_registered",
            "job_status",
            "checkpoint_completed",
            "checkpoint_aborted",
            "task_failed",
            "job_restored",
        }
    )

    def publish(self, events: Sequence[p.Envelope]) -> None:
        for env in events:
            if env.type in self.SHOWN:
                self._show(env.attempt, env.decoded())

    def _show(self, attempt: int, event: Any) -> None:
        c = self.console
        if isinstance(event, p.JobRegistered):
            storage = event.config.get("checkpoint_dir") or event.config.get("checkpoint_storage")
            interval = event.config.get("interval_ms") or 0
            every = f"every {interval / 1000:g} s" if interval else "off (final only)"
            guarantee = f", {event.guarantee.level.replace('_', '-')}" if event.guarantee else ""
            c.line(
                "job_started",
                f"job {c.job_id} ({event.job_name}) starting; checkpoints {every} to "
                f"{storage}{guarantee}",
                job_name=event.job_name,
            )
        elif isinstance(event, p.JobStatusChanged):
            self._status(attempt, event)
        elif isinstance(event, p.CheckpointCompleted):
            c.checkpoint_completed(
                event.checkpoint_id,
                event.kind.value,
                event.end_to_end_duration_ms,
                event.state_size,
            )
        elif isinstance(event, p.CheckpointAborted):
            c.line(
                "checkpoint_aborted",
                f"checkpoint {event.checkpoint_id} aborted: {_one_line(event.reason)}",
                level="warning",
                checkpoint_id=event.checkpoint_id,
            )
        elif isinstance(event, p.TaskFailed):
            where = ""
            if event.operator_id:
                chain = self.chains.get(event.operator_id, event.operator_id)
                shown = "" if chain == event.operator_id else f": {chain}"
                where = f" ({event.operator_id}[{event.subtask}]{shown})"
            log = f" (Spark's log: {self.spark_log})" if self.spark_log else ""
            c.line(
                "task_failed",
                f"attempt {attempt} failed in epoch {event.epoch}{where}: "
                f"{_one_line(event.cause)}{log}",
                level="error",
                epoch=event.epoch,
                cause=event.cause,
                operator_id=event.operator_id,
                subtask=event.subtask,
            )
        elif isinstance(event, p.JobRestored):
            if event.checkpoint_id is None and attempt <= 1:
                return  # a connected job's first start, "restored" from the beginning
            point = (
                f"checkpoint {event.checkpoint_id} ({event.external_path})"
                if event.checkpoint_id is not None
                else "the beginning (no checkpoint completed yet)"
            )
            c.line(
                "job_restored",
                f"attempt {attempt} restored from {point}; {event.committed_transactions} "
                f"transactions committed again, {event.aborted_parts} uncommitted parts aborted",
                level="warning" if attempt > 1 else "info",
                checkpoint_id=event.checkpoint_id,
            )

    def _status(self, attempt: int, event: p.JobStatusChanged) -> None:
        c = self.console
        if event.status is p.JobStatus.RUNNING and self._running_attempt != attempt:
            self._running_attempt = attempt
            app = event.spark_application_id or "?"
            ui = f", Spark UI {event.spark_ui_url}" if event.spark_ui_url else ""
            c.line(
                "job_running",
                f"attempt {attempt} running on Spark application {app}{ui}",
                attempt=attempt,
            )
        elif event.status in _REPORTED or (event.status is p.JobStatus.FINISHED and event.cause):
            cause = f": {_one_line(event.cause)}" if event.cause else ""
            failed = event.status in (p.JobStatus.FAILING, p.JobStatus.FAILED)
            c.line(
                "job_status",
                f"{event.status.value}{cause}",
                level="error" if failed else "warning",
                status=event.status.value,
            )


def _one_line(text: str, limit: int = 300) -> str:
    """The first line of ``text``, cut to ``limit`` characters."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"
