"""Failover strategies (Flink's ``jobmanager.execution.failover-strategy``): what restarts.

``full`` restarts every vertex from the latest completed checkpoint. ``region`` (the default, as
Flink's) restarts only the failover region of the failed subtask: the connected component of
the job graph (:meth:`~sparkpoint.job_graph.JobGraph.regions`) that holds it. A failure is
attributed to a subtask by a note that the runners add to the task's exception
(:func:`attributed`): in this process it is on the exception, from Spark it is in the task's
traceback text; a Python worker that died without a Python error (killed, crashed) leaves no
note, and is named by its task and stage when the job is a :func:`chain`. A failure that names
no subtask (a lost executor, the driver's own error, an epoch without a report) restarts the
whole job, and so does any failure of a job whose graph
is one region: that job takes exactly the path of ``full``.
"""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Callable, Iterator

from sparkpoint import protocol as p
from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.job_graph import JobGraph, Region

_NOTE = "(in Sparkpoint subtask {uid}[{subtask}])"
# On an error that a restart replays unchanged (Flink's ``SuppressRestartsException``): a
# ConfigurationError of a task (a checkpoint that does not fit the job, an invalid operator).
_NO_RESTART_NOTE = "(Sparkpoint: a configuration error, which no restart can fix)"
_NOTE_RE = re.compile(r"\(in Sparkpoint subtask (?P<uid>[^\s\[\]]+)\[(?P<subtask>\d+)\]\)")


class FailoverStrategy(enum.Enum):
    """Flink's values of ``jobmanager.execution.failover-strategy``."""

    REGION = "region"
    FULL = "full"


def check_failover_strategy(strategy: str) -> FailoverStrategy:
    """The strategy named ``strategy``.

    Raises:
        ConfigurationError: no such strategy.
    """
    try:
        return FailoverStrategy(strategy)
    except ValueError as err:
        raise ConfigurationError(
            f"unknown failover strategy {strategy!r}; use region or full"
        ) from err


def attributed(uid: str, subtask: int, task: Iterator[object]) -> Iterator[object]:
    """``task``'s elements; an exception it raises carries a note naming ``uid[subtask]``
    (Python's ``add_note``: the exception's message, and so the failure's cause, is
    unchanged; the note is in its traceback, which Spark ships to the driver), and a
    :class:`ConfigurationError` one more: no restart can fix it (:func:`suppresses_restarts`)."""
    try:
        yield from task
    except Exception as err:
        if failed_subtask(err) is None:
            _add_note(err, _NOTE.format(uid=uid, subtask=subtask))
            if isinstance(err, ConfigurationError):
                _add_note(err, _NO_RESTART_NOTE)
        raise


def _add_note(err: BaseException, note: str) -> None:
    if hasattr(err, "add_note"):
        err.add_note(note)
    else:  # Python 3.10: read in this process only; from Spark, the whole job restarts
        setattr(err, "__notes__", [*getattr(err, "__notes__", ()), note])  # noqa: B010


def _chain_texts(err: BaseException) -> Iterator[str]:
    """The notes and messages of ``err`` and the exceptions in its chain."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield from getattr(current, "__notes__", ())
        yield str(current)
        current = current.__cause__ or current.__context__


def failed_subtask(err: BaseException) -> tuple[str, int] | None:
    """The subtask that raised ``err`` (or an exception in its chain), if a note names it:
    on the exception itself, or in the text of a Spark error that carries its traceback."""
    for text in _chain_texts(err):
        found = _NOTE_RE.search(text)
        if found is not None:
            return found["uid"], int(found["subtask"])
    return None


def suppresses_restarts(err: BaseException) -> bool:
    """Whether a subtask's failure is one that a restart would replay unchanged (a task's
    :class:`ConfigurationError`, noted by :func:`attributed`): the job fails without asking
    its restart strategy, as Flink's ``SuppressRestartsException`` does."""
    return any(_NO_RESTART_NOTE in text for text in _chain_texts(err))


def chain(graph: JobGraph) -> list[str] | None:
    """The uids of the job's vertices when each feeds only the next (one source, each keyed
    vertex behind the one before it, none broadcast): an epoch's Spark job then has one stage
    per vertex, numbered in that order (Spark numbers a stage's parents first), and task i of a
    stage is subtask i of its vertex. None for any other shape."""
    vertices = graph.all_vertices()
    if len(graph.sources) != 1:
        return None
    for before, vertex in itertools.pairwise(vertices):
        keyed = graph.downstream(before.uid)
        if keyed is None or keyed.uid != vertex.uid or keyed.inputs != (before.uid,):
            return None
        if keyed.broadcast_inputs:
            return None
    return [v.uid for v in vertices]


def failover_region(graph: JobGraph, strategy: str, vertex: str | None) -> Region | None:
    """The region that a failure of ``vertex`` restarts, or None: the whole job (``full``, a
    failure that names no vertex, or a job of one region)."""
    if check_failover_strategy(strategy) is FailoverStrategy.FULL or vertex is None:
        return None
    regions = graph.regions()
    if len(regions) < 2:
        return None
    return next((r for r in regions if vertex in r.vertices), None)


def restore_error(restore: Callable[[], object]) -> str | None:
    """Run ``restore``; the error of one that failed (a sink's database away while it commits
    the restored checkpoint's transactions again, a state file unreadable), which is one more
    failure for the restart strategy to decide, else None. A :class:`ConfigurationError`
    propagates: the checkpoint does not fit the job, and no restart would change that."""
    try:
        restore()
    except ConfigurationError:
        raise
    except (SparkpointError, OSError) as err:
        return str(err)
    return None


def task_failed(
    epoch: int,
    cause: str,
    failed: tuple[str, int] | None,
    region: Region | None,
    recoverable: bool = True,
) -> p.TaskFailed:
    """The report of a failed epoch: the subtask that raised it when known (the exception
    history names it, as Flink's names the failed task), the region that restarts alone,
    if any (None: the whole job), and whether a restart can fix it."""
    return p.TaskFailed(
        epoch=epoch,
        cause=cause,
        recoverable=recoverable,
        operator_id=failed[0] if failed is not None else None,
        subtask=failed[1] if failed is not None else None,
        region=region.name if region is not None else None,
        region_vertices=list(region.vertices) if region is not None else None,
    )
