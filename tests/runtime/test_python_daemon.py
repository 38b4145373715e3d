"""The Python workers' daemon: a worker whose JVM closed the connection ends in one log line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NoReturn

import pytest

from sparkpoint.runtime.python_daemon import SPARK_LOG_ENV, quiet_worker


class _Ended(Exception):
    """What the fake ``os._exit`` raises, with the exit code."""


def _end(code: int) -> NoReturn:
    raise _Ended(code)


def _raising(err: BaseException) -> Any:
    def worker(sock: object, authenticated: bool) -> int:
        raise err

    return worker


def test_a_closed_connection_ends_the_worker_with_one_line_in_the_spark_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "job-spark.log"
    log.write_text("26/11/27 17:05:04 ERROR TaskSetManager: Task 0 in stage 3.0 failed\n")
    monkeypatch.setenv(SPARK_LOG_ENV, str(log))
    worker = quiet_worker(_raising(BrokenPipeError(32, "Broken pipe")), _end)
    with pytest.raises(_Ended) as ended:
        worker(object(), True)
    assert ended.value.args == (1,)
    first, added = log.read_text().splitlines()
    assert first.endswith("Task 0 in stage 3.0 failed")
    assert re.fullmatch(
        r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN PythonDaemon: Python worker \d+ ended: the JVM "
        r"closed its connection \(its task was killed or failed\): BrokenPipeError: "
        r"\[Errno 32\] Broken pipe",
        added,
    )


def test_without_a_spark_log_the_worker_still_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SPARK_LOG_ENV, raising=False)
    worker = quiet_worker(_raising(ConnectionResetError(104, "Connection reset by peer")), _end)
    with pytest.raises(_Ended):
        worker(object(), False)
    assert list(tmp_path.iterdir()) == []


def test_other_errors_and_results_are_pyspark_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "job-spark.log"
    monkeypatch.setenv(SPARK_LOG_ENV, str(log))
    with pytest.raises(ValueError, match=r"^not a closed connection$"):
        quiet_worker(_raising(ValueError("not a closed connection")), _end)(object(), True)
    assert quiet_worker(lambda sock, authenticated: 0, _end)(object(), True) == 0
    assert not log.exists()
