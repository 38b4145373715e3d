"""The job driver: builds a job's runtime and runs it under its checkpoint authority.

With ``--standalone`` the authority runs in-process
(:class:`~sparkpoint.runtime.authority.InProcessAuthority`: the checkpoint coordinator and the
restart strategy). Otherwise the control plane is the authority
(:class:`~sparkpoint.runtime.connected.ControlPlaneAuthority`, ``docs/control-plane.md``) and
the driver talks to it through Redis streams. Either way
:class:`~sparkpoint.runtime.execution.JobExecution` does the job's side: epochs on Spark,
accepting them, committing sinks and restoring checkpoints.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.restart import restart_strategy_from_config
from sparkpoint.checkpointing.storage import (
    CheckpointStorage,
    FileSystemCheckpointStorage,
    checkpoint_storage_from_options,
)
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.errors import ConfigurationError
from sparkpoint.events import EventSink, FanOutEventSink, InMemoryEventSink, JsonLinesEventSink
from sparkpoint.graph import JobGraph
from sparkpoint.options import JobOptions
from sparkpoint.runtime.authority import Authority, InProcessAuthority, JobFailedError
from sparkpoint.runtime.connected import ControlPlaneAuthority, ControlPlaneLink
from sparkpoint.runtime.execution import JobExecution
from sparkpoint.runtime.plan import FailureInjection
from sparkpoint.runtime.planner import EpochPlanner
from sparkpoint.runtime.spark import SparkEpochRunner, spark_session

__all__ = ["JobDriver", "JobFailedError", "JobResult", "durable_working_state"]


@dataclass
class JobResult:
    job_id: str
    status: p.JobStatus
    attempt: int
    epochs: int
    records: int
    duration_s: float
    completed_checkpoints: list[int] = field(default_factory=list)
    restores: list[int | None] = field(default_factory=list)
    events: InMemoryEventSink | None = None

    @property
    def records_per_second(self) -> float:
        return self.records / self.duration_s if self.duration_s > 0 else 0.0


class JobDriver:
    """Runs one job graph to its end: bounded input, a stop, a cancel, or a failure for good."""

    def __init__(
        self,
        graph: JobGraph,
        options: JobOptions,
        *,
        spark: Any = None,
        clock: Clock | None = None,
        events: EventSink | None = None,
        failure: FailureInjection | None = None,
    ) -> None:
        self.graph = graph
        self.options = options
        self.clock = clock or SystemClock()
        self.job_id = options.job_id
        self.memory = InMemoryEventSink(max_events=options.max_events_in_memory)
        sinks: list[EventSink] = [self.memory]
        if events is not None:
            sinks.append(events)
        if options.events_log:
            sinks.append(JsonLinesEventSink(options.events_log))
        link = None if options.standalone else ControlPlaneLink.connect(options)
        if link is not None:
            sinks.append(link.events)
        self.events = FanOutEventSink(*sinks)
        self.storage = checkpoint_storage_from_options(
            options.checkpoint_storage, options.checkpoint_dir, options.max_inline_state_bytes
        )
        restart_conf: dict[str, str | int | float] = dict(options.restart_strategy)
        self.restart = restart_strategy_from_config(
            restart_conf, checkpointing_enabled=options.checkpoint.interval_ms > 0
        )
        planner = EpochPlanner(
            graph.source.source,
            self.clock,
            target_ms=options.epoch_target_ms,
            min_records=options.min_epoch_records,
            max_records=options.max_epoch_records,
        )
        if failure is None and options.fail_after is not None:
            failure = FailureInjection("source", subtask=0, offset=options.fail_after)
        self.job = JobExecution(
            graph,
            options,
            self.clock,
            self.events,
            self.storage,
            planner,
            failure=failure,
            durable=durable_working_state(options, self.storage),
        )
        self.authority: Authority
        if link is None:
            self.authority = InProcessAuthority(self.job, self.restart, self.storage)
        else:
            self.authority = ControlPlaneAuthority(
                self.job, self.restart, link, timeout_ms=options.control_plane_timeout_ms
            )
        self._spark = spark

    def run(self) -> JobResult:
        """Steps: (1) prepare (standalone: read ``--from-checkpoint``; connected: register and
        obey the control plane's first ``restore``), (2) Spark session (the job's RUNNING names
        its application), (3) epochs under the authority until the job ends, (4) a finished
        job's working state goes."""
        started = self.clock.monotonic_ms()
        job = self.job
        try:
            # Step 1: before Spark starts, so that a wrong path or no control plane fails at once.
            self.authority.prepare()
            # Step 2
            session = self._spark or spark_session(self.options.master, self.graph.name)
            runner = SparkEpochRunner(self.graph, session)
            job.spark = runner.application()
            runner.warm_up()
            # Step 3
            self.authority.run(runner)
            # Step 4
            if job.status is p.JobStatus.FINISHED:
                shutil.rmtree(os.path.join(self.options.local_dir, self.job_id), ignore_errors=True)
                self.storage.discard_working_state(self.job_id)
        except JobFailedError:
            job.set_status(p.JobStatus.FAILED)
            raise
        finally:
            self.events.close()
            self.authority.close()
        return JobResult(
            job_id=self.job_id,
            status=job.status,
            attempt=job.attempt,
            epochs=job.epoch,
            records=job.records,
            duration_s=(self.clock.monotonic_ms() - started) / 1000,
            completed_checkpoints=list(job.completed),
            restores=list(job.restores),
            events=self.memory,
        )


def durable_working_state(options: JobOptions, storage: CheckpointStorage) -> bool:
    """Whether working state is also kept in checkpoint storage between epochs.

    On by default when the master is not local: on a cluster the next epoch's task may run on
    another machine. Local masters (``local[*]``, ``local-cluster[...]``) share one disk.
    """
    if options.durable_working_state is False:
        return False
    can = isinstance(storage, FileSystemCheckpointStorage)
    if options.durable_working_state and not can:
        raise ConfigurationError("--durable-working-state on needs --checkpoint-dir")
    return can and (options.durable_working_state or not options.master.startswith("local"))
