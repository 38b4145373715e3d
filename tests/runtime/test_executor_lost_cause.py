"""An epoch that failed because an executor was lost says so in one line, whichever of
Spark's messages reported the loss (as the driver's Py4J error text carries them); a Python
worker that crashed is attributed to its subtask where the job's shape allows."""

from __future__ import annotations

from sparkpoint.runtime.spark_failures import crashed_subtask, executor_lost_cause, failure_cause

EXECUTOR_LOST = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 7.0 "
    "failed 1 times, most recent failure: Lost task 1.0 in stage 7.0 (TID 31) (10.0.0.6 "
    "executor 3): ExecutorLostFailure (executor 3 exited caused by one of the running tasks) "
    "Reason: Remote RPC client disassociated. Likely due to containers exceeding thresholds, or "
    "network issues. Check driver logs for WARN messages.\n"
    "Driver stacktrace:\n\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages"
)
FETCH_FAILED = (
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 4.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 4.0 (TID 9) (10.0.0.7 executor "
    "2): FetchFailed(BlockManagerId(1, 10.0.0.6, 36449, None), shuffleId=0, mapIndex=1, "
    "mapId=5, reduceId=0, message=\n"
    "org.apache.spark.shuffle.FetchFailedException: Failed to connect to /10.0.0.6:36449\n"
    "\tat org.apache.spark.errors.SparkCoreErrors$.fetchFailedError(SparkCoreErrors.scala:437)\n)"
)
STAGE_ABORTED = (
    ": org.apache.spark.SparkException: Job aborted due to stage failure: ResultStage 5 "
    "(collect at spark.py:380) has failed the maximum allowable number of times: 1. Most "
    "recent failure reason:\n"
    "org.apache.spark.shuffle.FetchFailedException: Failed to connect to /10.0.0.6:36449\n"
    "\tat org.apache.spark.errors.SparkCoreErrors$.fetchFailedError(SparkCoreErrors.scala:437)"
)
PYTHON_ERROR = (
    "Job aborted due to stage failure: Task 0 in stage 2.0 failed 1 times, most recent failure: "
    "Lost task 0.0 in stage 2.0 (TID 4) (10.0.0.6 executor 1): "
    "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
    '  File "job.py", line 3, in f\n'
    "ZeroDivisionError: division by zero\n"
)

# A Python worker killed (SIGKILL) during an epoch, as the driver's Py4J error text carries it.
PYTHON_WORKER_CRASHED = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 225.0 "
    "failed 1 times, most recent failure: Lost task 1.0 in stage 225.0 (TID 451) (192.0.2.2 "
    "executor driver): org.apache.spark.SparkException: Python worker exited unexpectedly "
    "(crashed). Consider setting 'spark.sql.execution.pyspark.udf.faulthandler.enabled' "
    "or'spark.python.worker.faulthandler.enabled' configuration to 'true' for the better Python "
    "traceback.\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1.applyOrElse("
    "PythonRunner.scala:1136)\n"
    "Caused by: java.io.EOFException\n"
    "\tat java.base/java.io.DataInputStream.readInt(DataInputStream.java:386)\n"
)


def test_an_executor_lost_with_its_task_names_the_executor_its_host_and_sparks_reason() -> None:
    assert failure_cause(RuntimeError(EXECUTOR_LOST)) == (
        "executor 3 on 10.0.0.6 lost: Remote RPC client disassociated. Likely due to containers "
        "exceeding thresholds, or network issues. Check driver logs for WARN messages."
    )


def test_a_shuffle_fetch_from_a_lost_executor_names_the_executor_that_held_the_output() -> None:
    assert failure_cause(RuntimeError(FETCH_FAILED)) == (
        "executor 1 on 10.0.0.6 lost: shuffle fetch failed: Failed to connect to /10.0.0.6:36449"
    )


def test_a_stage_aborted_after_a_fetch_failure_names_the_host() -> None:
    assert failure_cause(RuntimeError(STAGE_ABORTED)) == (
        "an executor on 10.0.0.6 lost: shuffle fetch failed: Failed to connect to /10.0.0.6:36449"
    )


def test_a_tasks_own_error_stays_the_tasks_error() -> None:
    assert failure_cause(RuntimeError(PYTHON_ERROR)) == "ZeroDivisionError: division by zero"


def test_the_cause_is_one_line_and_bounded() -> None:
    cause = executor_lost_cause("7", "10.0.0.9", "worker lost:\n  " + "x" * 1000)
    assert "\n" not in cause and len(cause) == 500
    assert cause.startswith("executor 7 on 10.0.0.9 lost: worker lost: xxx")


def test_a_crashed_python_worker_is_named_with_its_task_not_the_py4j_call() -> None:
    """Spark's own error for the task (no exception of the job's code in the text) is the cause,
    where the Py4J call that reported it ("An error occurred while calling ...") was."""
    assert failure_cause(RuntimeError(PYTHON_WORKER_CRASHED)) == (
        "SparkException: Python worker exited unexpectedly (crashed) "
        "(task 1.0 of stage 225.0, executor driver on 192.0.2.2)"
    )


def test_a_crashed_python_worker_is_attributed_to_its_subtask_in_a_chain() -> None:
    """Task 1 of stage 225, the second stage of the epoch's job: subtask 1 of the second
    vertex. Any doubt (another shape, a stage that is not the job's, another error) names
    none."""
    assert crashed_subtask(PYTHON_WORKER_CRASHED, [224, 225], ["events", "pv"]) == ("pv", 1)
    assert crashed_subtask(PYTHON_WORKER_CRASHED, [225, 226], ["events", "pv"]) == ("events", 1)
    assert crashed_subtask(PYTHON_WORKER_CRASHED, [223, 224], ["events", "pv"]) is None
    assert crashed_subtask(PYTHON_WORKER_CRASHED, [224, 225], None) is None
    assert crashed_subtask(PYTHON_WORKER_CRASHED, [223, 224, 225], ["events", "pv"]) is None
    assert crashed_subtask(EXECUTOR_LOST, [6, 7], ["events", "pv"]) is None  # not a crash
