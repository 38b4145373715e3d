"""The daemon that forks the Python workers of a local Spark (``spark.python.daemon.module``).

PySpark's own daemon (``pyspark.daemon``), except for a worker whose connection the JVM has
closed. When a task of an epoch fails, Spark kills the other tasks of its stage and closes
their workers' sockets; a worker still writing its output then fails its last flush with
``BrokenPipeError``, and PySpark's daemon prints that traceback on its stderr, which a local
Spark copies to the job's console. By then the task's outcome is the JVM's (killed, or failed
with its own error, which the driver reports with its cause), so such a worker ends here as
PySpark's daemon ends it, without the traceback, and says why in one line of the job's Spark
log (the file named by :data:`SPARK_LOG_ENV`, when the session has one).

Only a local master uses it (:func:`sparkpoint.runtime.spark.spark_session`): a cluster's
workers write to their executors' logs, not to the job's console. pyspark is imported only
when this module runs as the daemon, before any thread starts (the daemon forks).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NoReturn

#: The environment variable naming the job's Spark log (set through spark.executorEnv).
SPARK_LOG_ENV = "SPARKPOINT_SPARK_LOG"


def quiet_worker(
    pyspark_worker: Callable[..., Any], end_process: Callable[[int], NoReturn] = os._exit
) -> Callable[..., Any]:
    """PySpark's ``daemon.worker`` (one task in a forked worker process), except that when
    the JVM has closed the connection the process ends at once, as PySpark's daemon ends it
    after printing the traceback (``spark.python.daemon.killWorkerOnFlushFailure``). Ending
    at once also keeps the worker's buffered output from being flushed again at exit, which
    would print the error once more. Any other error goes on to PySpark's daemon."""

    def worker(*args: Any, **kwargs: Any) -> Any:
        try:
            return pyspark_worker(*args, **kwargs)
        except ConnectionError as err:  # BrokenPipeError, ConnectionResetError: the JVM closed
            _log_closed(err)
            end_process(1)

    return worker


def _log_closed(err: ConnectionError) -> None:
    """One line in the job's Spark log, in the layout of ``log4j2.properties``."""
    path = os.environ.get(SPARK_LOG_ENV)
    if not path:
        return
    stamp = time.strftime("%y/%m/%d %H:%M:%S")
    line = (
        f"{stamp} WARN PythonDaemon: Python worker {os.getpid()} ended: the JVM closed its "
        f"connection (its task was killed or failed): {type(err).__name__}: {err}\n"
    )
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(line)
    except OSError:
        pass  # the JVM's log has the task's end either way


def main() -> None:
    """Run PySpark's daemon, each forked worker through :func:`quiet_worker`."""
    from pyspark import daemon

    daemon.worker = quiet_worker(daemon.worker)  # the name manager() calls after each fork
    daemon.manager()


if __name__ == "__main__":
    main()
