"""The job driver: builds a job's runtime and runs it under its checkpoint authority.

With ``--standalone`` the authority runs in-process
(:class:`~sparkpoint.runtime.authority.InProcessAuthority`: the checkpoint coordinator and the
restart strategy). Otherwise the control plane is the authority
(:class:`~sparkpoint.runtime.connected.ControlPlaneAuthority`, ``docs/control-plane.md``) and
the driver talks to it through Redis streams. Either way
:class:`~sparkpoint.runtime.execution.JobExecution` does the job's side: epochs on Spark,
accepting them, committing sinks and restoring checkpoints.

How a driver ends: it returns (FINISHED), or raises :class:`JobFailedError` (failed for good),
:class:`JobCanceledError` (SIGTERM or SIGINT: it stopped at an epoch boundary, CANCELED), or
:class:`~sparkpoint.runtime.spark.SparkLostError` (its Spark JVM or SparkContext is gone: the
process must end, and ``sparkpoint run`` starts a new driver under the restart strategy).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkpoint import protocol as p
from sparkpoint.checkpointing.restart import RestartStrategy, restart_strategy_from_config
from sparkpoint.checkpointing.storage import (
    CheckpointStorage,
    FileSystemCheckpointStorage,
    checkpoint_storage_from_options,
)
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.console import Console, ConsoleEventSink
from sparkpoint.errors import ConfigurationError
from sparkpoint.events import EventSink, FanOutEventSink, InMemoryEventSink, JsonLinesEventSink
from sparkpoint.graph import JobGraph
from sparkpoint.options import JobOptions, check_epoch_options, check_state_options
from sparkpoint.runtime.authority import (
    Authority,
    InProcessAuthority,
    JobCanceledError,
    JobFailedError,
)
from sparkpoint.runtime.connected import ControlPlaneAuthority
from sparkpoint.runtime.control_plane_link import ControlPlaneLink
from sparkpoint.runtime.epochs import EpochRunner
from sparkpoint.runtime.execution import JobExecution
from sparkpoint.runtime.failover import check_failover_strategy
from sparkpoint.runtime.local import LocalEpochRunner
from sparkpoint.runtime.plan import FailureInjection
from sparkpoint.runtime.planner import EpochPlanner, planned_source
from sparkpoint.runtime.spark import (
    SparkEpochRunner,
    SparkLostError,
    WarmUpFailedError,
    spark_session,
)

__all__ = [
    "JobCanceledError",
    "JobDriver",
    "JobFailedError",
    "JobResult",
    "durable_working_state",
    "job_restart_strategy",
]
log = logging.getLogger(__name__)


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
    # Region failovers: (region name, the checkpoint it restored; None: the beginning).
    region_restores: list[tuple[str, int | None]] = field(default_factory=list)

    @property
    def records_per_second(self) -> float:
        return self.records / self.duration_s if self.duration_s > 0 else 0.0


class JobDriver:
    """Runs one job graph to its end: bounded input, a stop, a cancel, or a failure for good."""

    #: How many runs this process started (``sparkpoint run`` tells a job file that ran none).
    runs: ClassVar[int] = 0

    def __init__(
        self,
        graph: JobGraph,
        options: JobOptions,
        *,
        spark: Any = None,
        clock: Clock | None = None,
        events: EventSink | None = None,
        failure: FailureInjection | None = None,
        in_process: bool = False,
    ) -> None:
        """``spark``: the SparkSession to run on (default: one for ``options.master``);
        ``in_process``: no Spark at all, the epochs run in this process
        (:class:`~sparkpoint.runtime.local.LocalEpochRunner`, for tests)."""
        check_state_options(options)
        check_epoch_options(options)
        check_failover_strategy(options.failover_strategy)
        self.graph = graph
        self.options = options
        self.clock = clock or SystemClock()
        self.job_id = options.job_id
        self.memory = InMemoryEventSink(max_events=options.max_events_in_memory)
        self.console = Console(
            options.job_id,
            log_format=options.log_format,
            quiet=options.quiet,
            every=options.log_every,
        )
        self.spark_log = os.path.join(options.local_dir, "logs", f"{options.job_id}-spark.log")
        # A given session logs as it does; without Spark there is no Spark log.
        shown = None if spark is not None or in_process else self.spark_log
        chains = {v.id: v.name for v in graph.vertices()}
        shows = ConsoleEventSink(self.console, spark_log=shown, chains=chains)
        sinks: list[EventSink] = [self.memory, shows]
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
        self.restart = job_restart_strategy(options)
        planner = EpochPlanner(
            planned_source(graph),
            self.clock,
            target_ms=options.epoch_target_ms,
            min_records=options.min_epoch_records,
            max_records=options.max_epoch_records,
            checkpoint_timeout_ms=options.checkpoint.timeout_ms,
        )
        console = self.console
        planner.say = lambda event, text, level: console.line(event, text, level=level)
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
        self.job.console = self.console
        self.authority: Authority
        if link is None:
            self.authority = InProcessAuthority(self.job, self.restart, self.storage)
        else:
            self.authority = ControlPlaneAuthority(
                self.job, self.restart, link, timeout_ms=options.control_plane_timeout_ms
            )
        self._spark = spark
        self._in_process = in_process
        self._signals: _SignalCancel | None = None

    def run(self) -> JobResult:
        """Steps: (1) prepare (standalone: read ``--from-checkpoint``; connected: register and
        obey the control plane's first ``restore``), (2) Spark session (the job's RUNNING names
        its application), (3) epochs under the authority until the job ends, (4) a finished
        job's working state goes.

        SIGTERM and SIGINT (in the main thread) cancel the job at the next epoch boundary.

        Raises:
            JobFailedError: the job failed for good.
            JobCanceledError: a signal canceled the job.
            SparkLostError: this process's Spark is gone; a new driver process can go on.
        """
        JobDriver.runs += 1
        started = self.clock.monotonic_ms()
        job = self.job
        try:
            with _cancel_on_signals(self.authority) as self._signals:
                self._run(job)
        finally:
            if job.status is not p.JobStatus.CREATED:  # else it never started: the error says why
                over = job.status in (
                    p.JobStatus.FINISHED,
                    p.JobStatus.CANCELED,
                    p.JobStatus.FAILED,
                )
                self.console.ended(
                    job.status.value if over else "INTERRUPTED",
                    job.records,
                    (self.clock.monotonic_ms() - started) / 1000,
                    len(job.completed),
                    len(job.restores),
                )
                self._unfired_failure(job)
        canceled_by = self._signals.received if self._signals else []
        if job.status is p.JobStatus.CANCELED and canceled_by:
            raise JobCanceledError(
                f"job {self.job_id} canceled by {signal.Signals(canceled_by[0]).name}",
                canceled_by[0],
            )
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
            region_restores=list(job.region_restores),
        )

    def _unfired_failure(self, job: JobExecution) -> None:
        """Say so when ``--fail-after`` asked for a failure that never happened: it fires in
        the first source split, which may hold fewer records than the job."""
        after = self.options.fail_after
        if after is not None and job.status is p.JobStatus.FINISHED and job.attempt == 1:
            self.console.line(
                "failure_not_injected",
                f"--fail-after {after:,} injected no failure: it fails the job once the first "
                f"split of its first source has read {after:,} records, and that split ended "
                "before; ask for fewer records",
                level="warning",
                fail_after=after,
            )

    def _run(self, job: JobExecution) -> None:
        """The steps of :meth:`run`."""
        try:
            # Step 1: before Spark starts, so that a wrong path or no control plane fails at once.
            self.storage.check_writable(self.job_id, local_dir=self.options.local_dir)
            self.authority.prepare()
            if job.status in (p.JobStatus.FINISHED, p.JobStatus.CANCELED):
                return  # the control plane says it ended (a cancel, or it had ended before)
            # Step 2
            runner = self._runner()
            job.spark = runner.application()
            self._warm_up(runner)
            # Step 3
            self.authority.run(runner)
            # Step 4
            if job.status is p.JobStatus.FINISHED:
                shutil.rmtree(os.path.join(self.options.local_dir, self.job_id), ignore_errors=True)
                self.storage.discard_working_state(self.job_id)
        except JobFailedError as err:  # FAILED says why, as the control plane's does
            job.set_status(p.JobStatus.FAILED, str(err).removeprefix(f"job {job.job_id} failed: "))
            raise
        except SparkLostError as err:
            raise SparkLostError(err.cause, self.job_id) from err
        finally:
            try:
                self.events.close()
            finally:
                self.authority.close()  # releases the job's lease (connected)

    def _runner(self) -> EpochRunner:
        if self._in_process:
            return LocalEpochRunner(self.graph)

        def build() -> Any:
            return spark_session(self.options.master, self.graph.name, spark_log=self.spark_log)

        try:
            session = self._spark or build()
        except KeyboardInterrupt:
            # pyspark's SIGINT handler, in place from the SparkContext's start until arm()
            # below puts the job's back: the Ctrl-C cancels the job as the job's handler does
            # (the SparkContext is up: asking again only builds the session).
            if self._signals is None or not self._signals.active:
                raise
            self._signals.interrupted(signal.SIGINT)
            session = build()
        if self._signals is not None:
            self._signals.arm()  # the SparkContext may have put pyspark's SIGINT handler
        return SparkEpochRunner(self.graph, session)

    def _warm_up(self, runner: EpochRunner) -> None:
        """Start the Python workers. A failure (a worker killed, ...) goes through the restart
        strategy as an epoch's would; nothing ran yet, so there is nothing to restore."""
        while not self.authority.cancel_requested:
            try:
                runner.warm_up()
                return
            except WarmUpFailedError as err:
                decision = self.restart.on_failure(self.clock.now_ms())
                if not decision.restart:
                    raise JobFailedError(
                        f"job {self.job_id} failed: {err.cause} ({decision.message})"
                    ) from err
                log.warning("job %s: %s; %s", self.job_id, err, decision.message)
                self.authority.wait_unless_canceled(decision.delay_ms)


def job_restart_strategy(options: JobOptions) -> RestartStrategy:
    """The job's restart strategy, as its options configure it (Flink's defaults)."""
    conf: dict[str, str | int | float] = dict(options.restart_strategy)
    return restart_strategy_from_config(
        conf, checkpointing_enabled=options.checkpoint.interval_ms > 0
    )


class _SignalCancel:
    """While the job runs, the first SIGTERM or SIGINT asks ``authority`` to cancel and is
    kept in ``received``. The previous handlers come back at once, so a second signal acts as
    it did before (terminates, or KeyboardInterrupt). Only in the main thread."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, authority: Authority) -> None:
        self.authority = authority
        self.received: list[int] = []
        self.active = threading.current_thread() is threading.main_thread()
        self.previous = {s: signal.getsignal(s) for s in self.SIGNALS} if self.active else {}

    def arm(self) -> None:
        """Install the handlers (again: a new SparkContext installs pyspark's own SIGINT
        handler, which cancels Spark's jobs and raises KeyboardInterrupt mid-epoch)."""
        if self.active and not self.received:
            for s in self.SIGNALS:
                signal.signal(s, self._on_signal)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.interrupted(signum)

    def interrupted(self, signum: int) -> None:
        """``signum`` arrived (here, or in a handler that was not this one's)."""
        self.received.append(signum)
        self.restore()
        self.authority.request_cancel()


@contextmanager
def _cancel_on_signals(authority: Authority) -> Iterator[_SignalCancel]:
    """:class:`_SignalCancel` armed for the block; the previous handlers come back after it."""
    signals = _SignalCancel(authority)
    signals.arm()
    try:
        yield signals
    finally:
        signals.restore()


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
