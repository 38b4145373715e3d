"""Spark's side of the execution contract: its retries off, a dead worker at warm-up retried."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkpoint.errors import ConfigurationError
from sparkpoint.protocol import JobStatus
from sparkpoint.runtime import spark as spark_module
from sparkpoint.runtime.spark import check_session, spark_lost
from sparkpoint.testing import line_counts

from .pv_harness import expected_every_lines, run_pv


def _session(**conf: str) -> Any:
    """A stand-in SparkSession whose SparkContext has this configuration."""
    values = dict(conf)
    return SimpleNamespace(
        sparkContext=SimpleNamespace(
            getConf=lambda: SimpleNamespace(get=lambda k, d=None: values.get(k, d))
        )
    )


@pytest.mark.parametrize("value", [None, "4"])
def test_a_cluster_session_with_stage_retries_is_refused(value: str | None) -> None:
    """Fetch failures do not count against spark.task.maxFailures: Spark would re-run the
    stage by itself unless spark.stage.maxConsecutiveAttempts is 1 (its default is 4)."""
    conf = {"spark.master": "spark://host:7077", "spark.task.maxFailures": "1"}
    if value is not None:
        conf["spark.stage.maxConsecutiveAttempts"] = value
    with pytest.raises(ConfigurationError, match=r"spark.stage.maxConsecutiveAttempts must be 1"):
        check_session(_session(**conf))


def test_a_cluster_session_without_retries_is_accepted() -> None:
    check_session(
        _session(
            **{
                "spark.master": "local-cluster[2,1,1024]",
                "spark.task.maxFailures": "1",
                "spark.stage.maxConsecutiveAttempts": "1",
            }
        )
    )


@pytest.mark.spark
def test_the_runtimes_session_turns_spark_retries_off(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.stage.maxConsecutiveAttempts") == "1"
    assert conf.get("spark.task.maxFailures") == "1"
    assert spark_lost() is None


@pytest.mark.spark
def test_a_worker_killed_during_warm_up_is_retried_under_the_restart_strategy(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first Python worker to start the runtime dies (SIGKILL, as the OOM killer would):
    the warm-up's Spark job fails, and the driver retries it as it would a failed epoch."""
    marker = str(tmp_path / "killed")

    def die_once(_: int) -> int:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return 0
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    monkeypatch.setattr(spark_module, "_import_runtime", die_once)
    with caplog.at_level(logging.WARNING, logger="sparkpoint.runtime.driver"):
        result, out = run_pv(spark, tmp_path, "warm-up")
    assert result.status is JobStatus.FINISHED
    assert line_counts(out) == expected_every_lines()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["job pv-warm-up"]
    assert "warm-up failed: " in caplog.records[0].getMessage()
    assert "fixed-delay: restart 1 of 2" in caplog.records[0].getMessage()
