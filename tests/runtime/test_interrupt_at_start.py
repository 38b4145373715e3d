"""Ctrl-C while Spark starts cancels the job: pyspark's SIGINT handler (in place from the
SparkContext's start until the driver puts the job's own back) raised KeyboardInterrupt out of
the driver, a traceback instead of a cancel, and a connected job stayed RUNNING in the control
plane until its heartbeat timeout."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.runtime import driver
from sparkpoint.runtime.authority import JobCanceledError
from sparkpoint.testing import line_counts

from .pv_harness import run_pv


def test_an_interrupt_while_the_spark_session_is_built_cancels_the_job(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []

    def interrupted_once(master: str, app_name: str, **_: Any) -> Any:
        built.append(app_name)
        if len(built) == 1:  # as pyspark's handler does once the SparkContext is up
            raise KeyboardInterrupt
        return spark

    monkeypatch.setattr(driver, "spark_session", interrupted_once)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(JobCanceledError) as err:
        run_pv(None, tmp_path, "interrupted")
    assert (err.value.signum, str(err.value)) == (
        signal.SIGINT,
        "job pv-interrupted canceled by SIGINT",
    )
    assert built == ["pv-count", "pv-count"]
    assert line_counts(str(tmp_path / "interrupted" / "out")) == {}  # no epoch ran
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are back
