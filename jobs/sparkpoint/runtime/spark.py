"""The one module of the runtime that touches pyspark: runs an epoch as one Spark job.

An epoch is ``parallelize(source subtasks) -> mapPartitions(source task) ->
partitionBy(keyed parallelism, identity) -> mapPartitions(keyed task) -> collect()``, with one
more ``partitionBy -> mapPartitions(keyed task)`` per further keyed stage (one Spark shuffle
per exchange). The shuffle keeps each upstream task's order per target partition, so barriers
are never overtaken; the order in which channels arrive varies, which the barrier handler aligns.
Spark's own retries are off (execution contract 1): any task failure fails the epoch, and so
does a shuffle fetch failure (``spark.stage.maxConsecutiveAttempts=1``), and so does an
executor lost while the epoch ran, although Spark re-runs a lost executor's tasks without
counting a failure: the cause names it (``executor 1 on 10.0.0.6 lost: worker lost: ...``).
A driver whose Spark JVM died or whose SparkContext stopped cannot run another epoch:
:class:`SparkLostError` says so, and the driver process ends for its supervisor to start a
new one.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.graph import JobGraph, SourceVertex, Vertex
from sparkpoint.protocol_types import MAX_EXECUTORS
from sparkpoint.runtime.failover import attributed, chain, failed_subtask, suppresses_restarts
from sparkpoint.runtime.long_epochs import LongEpochWatch
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.spark_failures import crashed_subtask, executor_lost_cause, failure_cause
from sparkpoint.runtime.tasks import TaskInfo, run_keyed_task, run_source_task

_log = logging.getLogger(__name__)


class EpochFailedError(SparkpointError):
    """A task of the epoch failed; ``cause`` is the task's error in one line; ``recoverable``
    False: a restart would replay it unchanged (:func:`~sparkpoint.runtime.failover.
    suppresses_restarts`)."""

    def __init__(
        self,
        epoch: int,
        cause: str,
        failed: tuple[str, int] | None = None,
        recoverable: bool = True,
    ) -> None:
        super().__init__(f"epoch {epoch} failed: {cause}")
        self.epoch = epoch
        self.cause = cause
        self.failed = failed  # the failed subtask (vertex uid, index), when the failure names it
        self.recoverable = recoverable


class WarmUpFailedError(SparkpointError):
    """Starting the Python workers failed; ``cause`` is the task's error in one line."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"warm-up failed: {cause}")
        self.cause = cause


class SparkLostError(SparkpointError):
    """This process's Spark is gone (its JVM died, its SparkContext stopped): no epoch can run
    here any more, but a new driver process can recover the job. ``cause`` is one line."""

    def __init__(self, cause: str, job_id: str | None = None) -> None:
        job = f"job {job_id}: " if job_id else ""
        super().__init__(f"{job}lost the driver's Spark: {cause}")
        self.cause = cause
        self.job_id = job_id


@dataclass(frozen=True)
class SparkApplication:
    """The Spark application that runs a driver's epochs, as its RUNNING status reports it."""

    application_id: str
    ui_url: str | None  # None when the Spark UI is off (spark.ui.enabled=false)


@dataclass(frozen=True)
class ExecutorInfo:
    """One executor of the application (Spark's ``ExecutorSummary``, the driver left out)."""

    executor_id: str
    host: str
    cores: int
    active: bool
    remove_reason: str | None = None  # why Spark removed it (None while active)

    def model(self) -> p.ExecutorModel:
        return p.ExecutorModel(
            executor_id=self.executor_id,
            host=self.host,
            cores=self.cores,
            active=self.active,
            remove_reason=self.remove_reason,
        )


#: Sparkpoint's log4j configuration for the driver JVM (see its header).
LOG4J_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


def spark_session(master: str, app_name: str, spark_log: str | None = None) -> Any:
    """The active SparkSession, or a new one configured for the execution contract.

    ``spark_log``: a new session's Spark log goes to this file and only Spark's errors other
    than task failures to the console (``log4j2.properties``); None: Spark's own logging.
    A local master's Python workers come from :mod:`sparkpoint.runtime.python_daemon`: the
    workers of tasks killed with a failed epoch leave a line in ``spark_log``, not a
    traceback on the console.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from sparkpoint.runtime import python_daemon

    active = SparkSession.getActiveSession()
    if active is not None:
        check_session(active)
        return active
    builder = SparkSession.builder
    if spark_log is not None:
        os.makedirs(os.path.dirname(os.path.abspath(spark_log)), exist_ok=True)
        builder = builder.config(
            "spark.driver.extraJavaOptions",
            f'"-Dlog4j.configurationFile=file:{LOG4J_CONFIG}" "-Dsparkpoint.spark.log={spark_log}"',
        )
    if master == "local" or master.startswith("local["):  # its workers write to our console
        builder = builder.config("spark.python.daemon.module", python_daemon.__name__)
        if spark_log is not None:
            builder = builder.config(f"spark.executorEnv.{python_daemon.SPARK_LOG_ENV}", spark_log)
    if spark_log is not None:  # also while it starts: a Ctrl-C then breaks py4j's call
        _quiet_py4j_root_records()
    try:
        session = (
            builder.master(master)
            .appName(app_name)
            .config("spark.task.maxFailures", "1")
            # Fetch failures do not count as task failures: Spark would re-run the stages.
            .config("spark.stage.maxConsecutiveAttempts", "1")
            .config("spark.speculation", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.python.worker.reuse", "true")
            .getOrCreate()
        )
        if spark_log is None:  # else the configuration keeps WARN in the file, ERROR on screen
            session.sparkContext.setLogLevel("ERROR")
        else:
            _quiet_accumulator_server(session.sparkContext)
    except Exception as err:
        lost = spark_lost(err)
        if lost is not None:
            raise SparkLostError(f"while the SparkSession of {master} started: {lost}") from err
        raise
    check_session(session)
    return session


def _quiet_accumulator_server(context: Any) -> None:
    """pyspark's accumulator server (a ``socketserver`` in the driver) prints a traceback on
    the console when the JVM dies and its connection ends (``EOFError``); the driver reports
    that death in one line already, so the server's errors go to the debug log instead."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda _request, address: _log.debug(
            "pyspark accumulator connection from %s failed", address, exc_info=True
        )


def _py4j_root_record(record: logging.LogRecord) -> bool:
    """False (drop) for what py4j logs on the root logger when the JVM's connection broke
    (``logging.exception("Exception while sending command.")``, with a traceback); the driver
    reports a lost Spark in one line. Kept in the debug log."""
    if f"{os.sep}py4j{os.sep}" not in record.pathname:
        return True
    _log.debug("py4j: %s", record.getMessage(), exc_info=record.exc_info)
    return False


def _quiet_py4j_root_records() -> None:
    root = logging.getLogger()
    if _py4j_root_record not in root.filters:
        root.addFilter(_py4j_root_record)


#: Spark's retries, each with its default on a cluster: Sparkpoint needs every one at 1.
_RETRY_KEYS = {"spark.task.maxFailures": "4", "spark.stage.maxConsecutiveAttempts": "4"}


def check_session(session: Any) -> None:
    """Refuse a session whose settings would break exactly-once (retries, speculation).

    Local masters (``local``, ``local[N]``) are not checked for retries: ``local[N]`` sets
    ``spark.task.maxFailures`` to 1 itself, and :func:`spark_session` sets the rest.
    """
    conf = session.sparkContext.getConf()
    if conf.get("spark.speculation", "false").lower() == "true":
        raise ConfigurationError("spark.speculation must be false: Sparkpoint recovers itself")
    master = conf.get("spark.master", "")
    if re.match(r"local\[[^,\]]+\]$|local$", master):
        return
    for key, default in _RETRY_KEYS.items():
        retries = conf.get(key, default)
        if int(retries) != 1:
            raise ConfigurationError(
                f"{key} must be 1 (is {retries}): Spark's own retries are off, "
                "Sparkpoint recovers a failed epoch from its checkpoint"
            )


def spark_lost(err: BaseException | None = None) -> str | None:
    """Why this process's Spark is gone, in one line, or None while it still works.

    Gone: the JVM that PySpark launched has exited, ``err`` is a lost connection to it (Py4J
    network errors, refused connections), it never started, or the SparkContext stopped.
    """
    from py4j.protocol import Py4JNetworkError
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    code = proc.poll() if proc is not None else None
    if proc is not None and code is not None:
        return f"the Spark JVM (pid {proc.pid}) exited with {_exit_text(code)}"
    if err is None:
        pass
    elif isinstance(err, (Py4JNetworkError, ConnectionError)):
        return f"the connection to the Spark JVM failed: {_one_line(err)}"
    elif "JAVA_GATEWAY_EXITED" in str(getattr(err, "getCondition", lambda: "")()):
        return f"the Spark JVM exited before it started: {_one_line(err)}"
    sc = SparkContext._active_spark_context
    if gateway is not None and sc is not None:
        try:
            if sc._jsc is None or sc._jsc.sc().isStopped():
                return "the SparkContext was stopped"
        except Exception as probe:  # any failure to ask means the JVM is gone
            return f"the Spark JVM does not answer: {_one_line(probe)}"
    return None


def _exit_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:300]


def _task_info() -> TaskInfo:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("Sparkpoint tasks run inside Spark tasks only")
    return TaskInfo(partition=ctx.partitionId(), task_attempt=ctx.taskAttemptId())


def _import_runtime(_: int) -> int:
    import sparkpoint.runtime.tasks  # noqa: F401

    return 0


def _identity(key: int) -> int:
    return key


def _numeric(executor_id: str) -> int:
    return int(executor_id) if executor_id.isdigit() else -1


class SparkEpochRunner:
    """Runs the epochs of one job graph on a SparkSession."""

    def __init__(self, graph: JobGraph, session: Any) -> None:
        self.graph = graph
        self.session = session
        self.sc = session.sparkContext
        self._executors: tuple[ExecutorInfo, ...] = ()
        self._listed: frozenset[str] | None = None  # the active ids _executors was read with
        self._chain = chain(graph)  # a crashed worker's stage names its vertex (failover.chain)

    def warm_up(self) -> None:
        """Start the Python workers and import the runtime there before the first epoch, so
        that the first checkpoint's duration is not start-up time.

        Raises:
            WarmUpFailedError: a task failed (a Python worker died, ...); try again.
            SparkLostError: this process's Spark is gone.
        """
        slots = max(self.sc.defaultParallelism, sum(s.parallelism for s in self.graph.sources))
        try:
            self.sc.setJobGroup("sparkpoint-warm-up", "start Python workers")
            self.sc.parallelize(range(slots), slots).map(_import_runtime).collect()
        except Exception as err:
            raise self._failure(err, WarmUpFailedError(failure_cause(err))) from err
        finally:
            self._clear_job_group()

    def application(self) -> SparkApplication:
        """The Spark application of the session: its id and the address of its UI."""
        try:
            return SparkApplication(application_id=self.sc.applicationId, ui_url=self.sc.uiWebUrl)
        except Exception as err:
            raise self._failure(err, None) from err

    def executors(self) -> list[ExecutorInfo]:
        """The application's executors and their hosts, removed ones with Spark's reason.

        Read from Spark's status store (what the Spark UI shows) only when the scheduler's
        executors differ from the last read: one call per epoch otherwise.
        """
        try:
            ids = self._executor_ids()
            if ids != self._listed:
                self._executors = self._read_executors()
                self._listed = frozenset(e.executor_id for e in self._executors if e.active)
        except Exception as err:
            raise self._failure(err, None) from err
        return list(self._executors)

    def _executor_ids(self) -> frozenset[str]:
        """The executors the scheduler has now: it drops a lost one before re-running its
        tasks, so a task that Spark re-ran elsewhere shows here as a missing executor."""
        joined = self.sc._jsc.sc().getExecutorIds().mkString("\n")
        return frozenset(x for x in str(joined).split("\n") if x)

    def _read_executors(self) -> tuple[ExecutorInfo, ...]:
        summaries = self.sc._jsc.sc().statusStore().executorList(False)
        found = []
        for i in range(summaries.size()):
            s = summaries.apply(i)
            executor_id = str(s.id())
            if executor_id == "driver":
                continue
            reason = s.removeReason()
            found.append(
                ExecutorInfo(
                    executor_id=executor_id,
                    host=str(s.hostPort()).rsplit(":", 1)[0],
                    cores=int(s.totalCores()),
                    active=bool(s.isActive()),
                    remove_reason=str(reason.get()) if reason.isDefined() else None,
                )
            )
        found.sort(key=lambda e: (not e.active, -_numeric(e.executor_id)))
        return tuple(found[:MAX_EXECUTORS])

    def _lost_cause(self, lost: frozenset[str]) -> str:
        """The cause of an epoch during which executors were lost: the first one, with its
        host and Spark's reason once the status store has it (it hears of it a moment later)."""
        executor_id = min(lost, key=_numeric)
        known = {e.executor_id: e for e in self._executors}
        deadline = time.monotonic() + 2.0
        while True:
            self._listed = None  # read again
            current = {e.executor_id: e for e in self.executors()}
            info = current.get(executor_id) or known.get(executor_id)
            if (info is not None and not info.active) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        host = info.host if info is not None else "an unknown host"
        reason = info.remove_reason if info is not None and info.remove_reason else "removed"
        return executor_lost_cause(executor_id, host, reason)

    def _failure(self, err: Exception, otherwise: SparkpointError | None) -> Exception:
        """What a Spark call's error means: the Spark is lost, else ``otherwise`` (None: the
        error itself)."""
        lost = spark_lost(err)
        if lost is not None:
            return SparkLostError(lost)
        return otherwise if otherwise is not None else err

    def _crashed_subtask(self, group: str, err: Exception) -> tuple[str, int] | None:
        """:func:`~sparkpoint.runtime.spark_failures.crashed_subtask` with the stages of the
        epoch's Spark job (job group ``group``); None when Spark cannot say."""
        if self._chain is None or spark_lost(err) is not None:
            return None
        try:
            tracker = self.sc.statusTracker()
            jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
            stages = [s for job in jobs if job is not None for s in job.stageIds]
        except Exception:  # the failure is reported all the same, naming no subtask
            _log.debug("could not read the stages of %s", group, exc_info=True)
            return None
        return crashed_subtask(str(err), stages, self._chain)

    def _clear_job_group(self) -> None:
        if spark_lost() is None:  # a dead JVM cannot be asked; the error says so already
            self.sc.setLocalProperty("spark.jobGroup.id", None)

    def _vertex_rdd(self, plan: EpochPlan, vertex: Vertex, rdds: dict[str, Any]) -> Any:
        """The RDD of one vertex's subtasks: a source's from ``parallelize``; a keyed one's
        behind one shuffle of the union of its inputs' RDDs."""
        graph, uid = self.graph, vertex.uid
        if isinstance(vertex, SourceVertex):

            def source(index: int, _items: Any) -> Any:
                task = run_source_task(graph, plan, index, _task_info(), vertex=uid)
                return attributed(uid, index, task)

            n = vertex.parallelism
            return self.sc.parallelize(range(n), n).mapPartitionsWithIndex(source)

        def keyed(index: int, items: Any) -> Any:
            task = run_keyed_task(graph, plan, index, items, _task_info(), vertex=uid)
            return attributed(uid, index, task)

        inputs = [rdds[i] for i in vertex.inputs]
        rdd = inputs[0] if len(inputs) == 1 else self.sc.union(inputs)
        return rdd.partitionBy(vertex.parallelism, _identity).mapPartitionsWithIndex(keyed)

    def run(self, plan: EpochPlan) -> list[TaskReport]:
        """Run one epoch; raises :class:`EpochFailedError` when any task failed."""
        graph = self.graph
        group = p.spark_job_group(plan.job_name, plan.attempt, plan.epoch)
        desc = f"{plan.job_name} ({plan.job_id}) attempt {plan.attempt} epoch {plan.epoch}"
        if plan.barrier is not None:
            desc += f" checkpoint {plan.barrier.checkpoint_id}"
        try:
            before = self._executor_ids()
            self.sc.setJobGroup(group, desc, interruptOnCancel=True)
            rdds: dict[str, Any] = {}
            for vertex in graph.all_vertices():  # topological: inputs first
                rdds[vertex.uid] = self._vertex_rdd(plan, vertex, rdds)
            tails = [rdds[v.uid] for v in graph.all_vertices() if graph.downstream(v.uid) is None]
            rdd = tails[0] if len(tails) == 1 else self.sc.union(tails)
            with LongEpochWatch(self.sc, group, desc, self._chain):
                reports = list(rdd.collect())
            lost = before - self._executor_ids()
        except Exception as err:
            failed = failed_subtask(err) or self._crashed_subtask(group, err)
            epoch_failed = EpochFailedError(
                plan.epoch, failure_cause(err), failed, not suppresses_restarts(err)
            )
            raise self._failure(err, epoch_failed) from err
        finally:
            self._clear_job_group()
        if lost:
            # Spark re-runs the tasks of an executor whose worker was lost without counting a
            # failure (spark.task.maxFailures does not apply): the epoch is failed here instead,
            # and recovered from its checkpoint like any other failed epoch.
            raise EpochFailedError(plan.epoch, self._lost_cause(lost))
        return reports
