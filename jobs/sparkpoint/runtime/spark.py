"""The one module of the runtime that touches pyspark: runs an epoch as one Spark job.

An epoch is ``parallelize(source subtasks) -> mapPartitions(source task) ->
partitionBy(keyed parallelism, identity) -> mapPartitions(keyed task) -> collect()``. The
shuffle keeps each upstream task's order per target partition, so barriers are never
overtaken; the order in which channels arrive varies, which the barrier handler aligns.
Spark's own retries are off (execution contract 1): any task failure fails the epoch.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.graph import JobGraph
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.tasks import TaskInfo, run_keyed_task, run_source_task


class EpochFailedError(SparkpointError):
    """A task of the epoch failed; ``cause`` is the task's error in one line."""

    def __init__(self, epoch: int, cause: str) -> None:
        super().__init__(f"epoch {epoch} failed: {cause}")
        self.epoch = epoch
        self.cause = cause


@dataclass(frozen=True)
class SparkApplication:
    """The Spark application that runs a driver's epochs, as its RUNNING status reports it."""

    application_id: str
    ui_url: str | None  # None when the Spark UI is off (spark.ui.enabled=false)


def spark_session(master: str, app_name: str) -> Any:
    """The active SparkSession, or a new one configured for the execution contract."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        check_session(active)
        return active
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.task.maxFailures", "1")
        .config("spark.speculation", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    check_session(session)
    return session


def check_session(session: Any) -> None:
    """Refuse a session whose settings would break exactly-once (retries, speculation)."""
    conf = session.sparkContext.getConf()
    if conf.get("spark.speculation", "false").lower() == "true":
        raise ConfigurationError("spark.speculation must be false: Sparkpoint recovers itself")
    master = conf.get("spark.master", "")
    retries = conf.get("spark.task.maxFailures", "1" if master.startswith("local") else "4")
    if int(retries) != 1 and not re.match(r"local\[[^,\]]+\]$|local$", master):
        raise ConfigurationError(
            f"spark.task.maxFailures must be 1 (is {retries}): Spark's own retries are off, "
            "Sparkpoint recovers a failed epoch from its checkpoint"
        )


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


_CAUSE = re.compile(r"^([\w.]+(?:Error|Exception|Failure|Interrupt)): (.*)$", re.MULTILINE)


def failure_cause(err: BaseException) -> str:
    """The task's own error from a Spark failure, in one line."""
    text = str(err)
    matches = [
        m
        for m in _CAUSE.finditer(text)
        if "py4j" not in m.group(1).lower() and "org.apache.spark" not in m.group(1)
    ]
    if matches:
        name, message = matches[-1].groups()
        return f"{name.rsplit('.', 1)[-1]}: {message.strip()}"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first[:500]


class SparkEpochRunner:
    """Runs the epochs of one job graph on a SparkSession."""

    def __init__(self, graph: JobGraph, session: Any) -> None:
        self.graph = graph
        self.session = session
        self.sc = session.sparkContext

    def warm_up(self) -> None:
        """Start the Python workers and import the runtime there before the first epoch, so
        that the first checkpoint's duration is not start-up time."""
        slots = max(self.sc.defaultParallelism, self.graph.source.parallelism)
        self.sc.setJobGroup("sparkpoint-warm-up", "start Python workers")
        self.sc.parallelize(range(slots), slots).map(_import_runtime).collect()

    def application(self) -> SparkApplication:
        """The Spark application of the session: its id and the address of its UI."""
        return SparkApplication(application_id=self.sc.applicationId, ui_url=self.sc.uiWebUrl)

    def run(self, plan: EpochPlan) -> list[TaskReport]:
        """Run one epoch; raises :class:`EpochFailedError` when any task failed."""
        graph = self.graph
        group = p.spark_job_group(plan.job_name, plan.attempt, plan.epoch)
        desc = f"{plan.job_name} ({plan.job_id}) attempt {plan.attempt} epoch {plan.epoch}"
        if plan.barrier is not None:
            desc += f" checkpoint {plan.barrier.checkpoint_id}"
        self.sc.setJobGroup(group, desc, interruptOnCancel=True)
        n = graph.source.parallelism

        def source(index: int, _items: Any) -> Any:
            return run_source_task(graph, plan, index, _task_info())

        rdd = self.sc.parallelize(range(n), n).mapPartitionsWithIndex(source)
        if graph.keyed is not None:

            def keyed(index: int, items: Any) -> Any:
                return run_keyed_task(graph, plan, index, items, _task_info())

            rdd = rdd.partitionBy(graph.keyed.parallelism, _identity)
            rdd = rdd.mapPartitionsWithIndex(keyed)
        try:
            return list(rdd.collect())
        except Exception as err:
            raise EpochFailedError(plan.epoch, failure_cause(err)) from err
        finally:
            self.sc.setLocalProperty("spark.jobGroup.id", None)
