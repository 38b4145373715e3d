"""An epoch runner without Spark: the same subtasks, run one after the other in this process.

:class:`LocalEpochRunner` runs an epoch as :class:`~sparkpoint.runtime.spark.SparkEpochRunner`
does, with the same task code (:func:`~sparkpoint.runtime.tasks.run_source_task`,
:func:`~sparkpoint.runtime.tasks.run_keyed_task`): every vertex in topological order, each
subtask to its end, the elements it sends to the next stage kept in memory and handed to
their target subtask (what Spark's shuffle does), the tail vertices' reports returned. A task
that raises fails the epoch with its error as the cause, as a failed Spark task does
(``spark.task.maxFailures=1``); the authority then recovers the job from its checkpoint.

Everything crosses a process boundary as on Spark: each subtask gets its own copy of the job
graph and the epoch's plan, shipped with cloudpickle as Spark ships a stage's closure, and every
element between stages (and every report to the driver) is pickled and unpickled — so a
function or a record that does not survive pickling fails here as it would on a cluster, and
no subtask shares an object with another.

What it does not have: parallel tasks, Python workers that die, executors, a shuffle that
spills or fetches over the network. Each subtask's input arrives channel after channel (all of
upstream subtask 0's elements, then 1's, ...): one of the orders Spark's shuffle may deliver,
so barrier alignment, snapshots and commits run exactly as on Spark. For job tests that need
seconds, not minutes; what only Spark shows keeps its Spark tests.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import cloudpickle

from sparkpoint.graph import JobGraph, SourceVertex, Vertex
from sparkpoint.runtime.failover import attributed, failed_subtask, suppresses_restarts
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.spark import EpochFailedError, SparkApplication
from sparkpoint.runtime.tasks import TaskInfo, run_keyed_task, run_source_task

APPLICATION_ID = "in-process"


class LocalEpochRunner:
    """Runs the epochs of one job graph in this process (see the module docstring)."""

    def __init__(self, graph: JobGraph) -> None:
        self.graph = graph
        self._task_attempts = itertools.count()  # unique per run, as Spark's task attempt ids

    def warm_up(self) -> None:
        """Nothing to start."""

    def application(self) -> SparkApplication:
        return SparkApplication(application_id=APPLICATION_ID, ui_url=None)

    def run(self, plan: EpochPlan) -> list[TaskReport]:
        """Run one epoch; raises :class:`EpochFailedError` when any subtask raised."""
        outputs: dict[str, list[list[_Shipped]]] = {}
        try:
            shipped = cloudpickle.dumps((self.graph, plan))  # as Spark ships a stage's closure
            for vertex in self.graph.all_vertices():  # topological: inputs first
                outputs[vertex.uid] = self._run_vertex(shipped, vertex, outputs)
        except Exception as err:
            cause = f"{type(err).__name__}: {err}"
            failed = failed_subtask(err)
            raise EpochFailedError(plan.epoch, cause, failed, not suppresses_restarts(err)) from err
        tails = [v.uid for v in self.graph.all_vertices() if self.graph.downstream(v.uid) is None]
        return [pickle.loads(data) for uid in tails for out in outputs[uid] for _, data in out]

    def _run_vertex(
        self, shipped: bytes, vertex: Vertex, outputs: dict[str, list[list[_Shipped]]]
    ) -> list[list[_Shipped]]:
        """Each subtask's output, in subtask order."""
        uid, n = vertex.uid, vertex.parallelism
        results = []
        if isinstance(vertex, SourceVertex):
            for i in range(n):
                graph, plan = cloudpickle.loads(shipped)  # each task its own copy
                task = run_source_task(graph, plan, i, self._info(i), vertex=uid)
                results.append(_pickled(attributed(uid, i, task)))
            return results
        inputs: list[list[_Shipped]] = [[] for _ in range(n)]
        for upstream in vertex.inputs:
            for out in outputs[upstream]:
                for target, data in out:
                    inputs[target].append((target, data))
        for i in range(n):
            graph, plan = cloudpickle.loads(shipped)
            elements = _unpickled(inputs[i])
            task = run_keyed_task(graph, plan, i, elements, self._info(i), vertex=uid)
            results.append(_pickled(attributed(uid, i, task)))
        return results

    def _info(self, partition: int) -> TaskInfo:
        return TaskInfo(partition=partition, task_attempt=next(self._task_attempts))


# An element as it crosses the exchange: its target subtask (what Spark's partitioner reads;
# None for the reports of the last stage) and the element pickled.
_Shipped = tuple[Any, bytes]


def _pickled(elements: Iterable[Any]) -> list[_Shipped]:
    return [
        (e[0] if isinstance(e, tuple) else None, pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL))
        for e in elements
    ]


def _unpickled(elements: list[_Shipped]) -> Iterator[Any]:
    return (pickle.loads(data) for _, data in elements)
