"""What a failed Spark call's error text says: the task's own error in one line, or the
executor that was lost (Spark's ``ExecutorLostFailure``, a shuffle fetch from an executor that
is gone), which is then the cause; and the subtask of a Python worker that crashed."""

from __future__ import annotations

import re

# Spark's words for a task whose Python worker died without a Python error (the OOM killer,
# a segfault, a kill): no note can name its subtask, only its task and stage do.
_WORKER_CRASHED_RE = re.compile(
    r"Lost task (?P<task>\d+)\.\d+ in stage (?P<stage>\d+)\.\d+ \(TID \d+\) \([^)]*\): "
    r"(?:[\w$]+\.)*SparkException: Python worker exited unexpectedly"
)
_CAUSE = re.compile(r"^([\w.]+(?:Error|Exception|Failure|Interrupt)): (.*)$", re.MULTILINE)
# "Lost task 0.0 in stage 3.0 (TID 12) (127.0.0.1 executor 1): ExecutorLostFailure (executor 1
# exited caused by one of the running tasks) Reason: Remote RPC client disassociated. ..."
_EXECUTOR_LOST = re.compile(
    r"\((\S+) executor (\w+)\): ExecutorLostFailure \([^)]*\) Reason: ([^\n]*)"
)
# "FetchFailed(BlockManagerId(1, 127.0.0.1, 36449, None), shuffleId=0, ...), message=\n
# org.apache.spark.shuffle.FetchFailedException: Failed to connect to /127.0.0.1:36449"
_FETCH_FAILED = re.compile(
    r"FetchFailed\(BlockManagerId\((\w+), ([^,]+),.*?message=\s*(?:[\w.]+: )?([^\n]*)", re.DOTALL
)
# "... has failed the maximum allowable number of times: 1. Most recent failure reason:\n
# org.apache.spark.shuffle.FetchFailedException: Failed to connect to /127.0.0.1:36449"
_FETCH_EXCEPTION = re.compile(r"FetchFailedException: ([^\n]*)")
# "... most recent failure: Lost task 1.0 in stage 225.0 (TID 451) (10.0.0.6 executor driver):
# org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider ..."
_LOST_TASK = re.compile(
    r"most recent failure: Lost task ([\d.]+) in stage ([\d.]+) \(TID \d+\) "
    r"\((\S+) executor (\w+)\): (?:[\w$]+\.)*(\w+): ([^\n]*)"
)


def executor_lost_cause(executor_id: str, host: str, reason: str) -> str:
    """The one-line cause of an epoch that failed because an executor was lost."""
    reason = " ".join(reason.split()) or "lost"
    return f"executor {executor_id} on {host} lost: {reason}"[:500]


def failure_cause(err: BaseException) -> str:
    """The task's own error from a Spark failure, in one line.

    An executor's loss (Spark's ``ExecutorLostFailure``, a shuffle fetch from an executor that
    is gone) is its own cause: ``executor 1 on 127.0.0.1 lost: <Spark's reason>``.
    """
    text = str(err)
    lost = _EXECUTOR_LOST.search(text)
    if lost is not None:
        host, executor, reason = lost.groups()
        return executor_lost_cause(executor, host, reason)
    fetch = _FETCH_FAILED.search(text)
    if fetch is not None:
        executor, host, message = fetch.groups()
        return executor_lost_cause(executor, host.strip(), f"shuffle fetch failed: {message}")
    fetch_exception = _FETCH_EXCEPTION.search(text)
    if fetch_exception is not None:  # a stage aborted after a fetch failure: no executor id
        message = fetch_exception[1]
        host = re.search(r"/([\w.:-]+?):\d+", message)
        where = f"an executor on {host[1]}" if host is not None else "an executor"
        return f"{where} lost: shuffle fetch failed: {message.strip()}"[:500]
    matches = [
        m
        for m in _CAUSE.finditer(text)
        if "py4j" not in m.group(1).lower() and "org.apache.spark" not in m.group(1)
    ]
    if matches:
        name, message = matches[-1].groups()
        return f"{name.rsplit('.', 1)[-1]}: {message.strip()}"
    lost_task = _LOST_TASK.search(text)
    if lost_task is not None:  # Spark's own error for the task (a Python worker that crashed)
        task, stage, host, executor, name, message = lost_task.groups()
        first_sentence = message.strip().split(". ", 1)[0].rstrip(".")
        where = f"task {task} of stage {stage}, executor {executor} on {host}"
        return f"{name}: {first_sentence} ({where})"[:500]
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first[:500]


def crashed_subtask(
    text: str, stage_ids: list[int], vertices: list[str] | None
) -> tuple[str, int] | None:
    """The subtask whose Python worker died without a Python error, from Spark's error text
    and the stage ids of the epoch's Spark job, when the job's ``vertices`` form a chain
    (:func:`~sparkpoint.runtime.failover.chain`: one stage per vertex, in that order); else
    None."""
    found = _WORKER_CRASHED_RE.search(text)
    ordered = sorted(set(stage_ids))
    if found is None or vertices is None or len(ordered) != len(vertices):
        return None
    stage = int(found["stage"])
    if stage not in ordered:
        return None
    return vertices[ordered.index(stage)], int(found["task"])
