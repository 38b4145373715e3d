"""Spark's side of the execution contract: its retries off, a dead worker at warm-up retried,
a worker that crashed in an epoch named by its subtask."""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import KeyedContext, KeyedProcessFunction
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import JobStatus, TaskFailed
from sparkpoint.runtime import spark as spark_module
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.runtime.failover import chain
from sparkpoint.runtime.spark import check_session, spark_lost
from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.state.key_groups import key_group_for, operator_index_for_key_group
from sparkpoint.testing import ListSource, line_counts

from .pv_harness import expected_every_lines, job_options, run_pv, true_counts


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


def test_only_a_chain_of_vertices_maps_stages_to_vertices(tmp_path: Path) -> None:
    def env() -> StreamExecutionEnvironment:
        return StreamExecutionEnvironment(JobOptions(job_id="shape", local_dir=str(tmp_path)))

    two_stages = env()
    (
        two_stages.from_source(ListSource(({"k": 1},)), uid="src")
        .key_by("k")
        .count(uid="per-k")
        .key_by("pv")
        .count(uid="per-pv")
        .sink_to(FileSink(str(tmp_path / "a")), uid="out")
    )
    assert chain(two_stages.graph) == ["src", "per-k", "per-pv"]
    union = env()
    a = union.from_source(ListSource(({"k": 1},)), uid="a")
    b = union.from_source(ListSource(({"k": 2},)), uid="b")
    a.union(b).key_by("k").count(uid="c").sink_to(FileSink(str(tmp_path / "b")), uid="out")
    assert chain(union.graph) is None  # one stage runs both sources' subtasks


class _DieOnce(KeyedProcessFunction):
    """Kills its Python worker (SIGKILL, as the OOM killer would) at the first record after
    the marker's epoch, once; writes the key it died on into the marker first."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def open(self, ctx: KeyedContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("n", 0))

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        self.count.update(self.count.value() + 1)
        if self.count.value() == 500 and not os.path.exists(self.marker):
            with open(self.marker, "x") as fh:
                fh.write(ctx.current_key)
            os.kill(os.getpid(), signal.SIGKILL)
        yield {"k": ctx.current_key, "n": self.count.value()}


@pytest.mark.spark
def test_a_crashed_python_worker_names_its_subtask_and_is_recovered(
    spark: Any, tmp_path: Path
) -> None:
    """Spark says only "Python worker exited unexpectedly" and the task's stage: the failure
    still names the keyed subtask (Flink names the failed task), and the job recovers."""
    marker = str(tmp_path / "died-on")
    out = str(tmp_path / "out")
    options = job_options("crash", tmp_path, "crash", epoch_records=2_000)
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(GeneratorSource(events=20_000, apps=10, rate=0, splits=2), uid="events")
        .key_by("app_id")
        .process(_DieOnce(marker), uid="counts")
        .sink_to(FileSink(out), uid="sink")
    )
    env.graph.name = "crash"
    result = JobDriver(env.graph, options, spark=spark).run()
    assert result.status is JobStatus.FINISHED and len(result.restores) == 1
    assert result.events is not None
    [failed] = list(result.events.of_type(TaskFailed))
    key = Path(marker).read_text()
    subtask = operator_index_for_key_group(key_group_for(key), 2)
    assert (failed.operator_id, failed.subtask) == ("counts", subtask)
    assert "Python worker exited unexpectedly" in failed.cause
    # Exactly once: the output of a run that never failed, each key's counts 1..n once, n its
    # number of events in the source.
    per_key: dict[str, list[int]] = {}
    for line in line_counts(out).elements():
        record = json.loads(line)
        per_key.setdefault(record["k"], []).append(record["n"])
    never_failed = {key: list(range(1, n + 1)) for key, n in true_counts(20_000, 10).items()}
    assert {key: sorted(ns) for key, ns in per_key.items()} == never_failed
