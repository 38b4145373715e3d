"""LocalEpochRunner: the job's own tasks without Spark, exact as on Spark.

The same jobs the Spark suites run (two chained keyed stages, a union of two sources, three
sinks) commit what the plain-Python oracle computes, failure-free and after a failure at each
point the Spark tests inject; a job run this way never imports pyspark. What only Spark shows
(Python workers that die, executors, working state that moves between workers) keeps its Spark
tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from sparkpoint import FileSink, GeneratorSource, StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import JobStatus
from sparkpoint.runtime.driver import JobFailedError
from sparkpoint.testing import FailureInjection, line_counts

from .keyed_stages_job import (
    EVENTS,
    clicks,
    events,
    oracle,
    restored_before_failure,
    run_stages,
)
from .pv_harness import APPS, IN_PROCESS, hidden_files, true_counts

FAILURES = [
    pytest.param(None, id="failure-free"),
    pytest.param(
        FailureInjection("keyed", subtask=1, records=60, at_epoch=3, vertex="per-region"),
        id="mid-epoch-second-stage",
    ),
    pytest.param(
        FailureInjection("alignment", subtask=1, checkpoint_id=2, vertex="per-region"),
        id="during-alignment-second-stage",
    ),
    pytest.param(
        FailureInjection("after_pre_commit", subtask=0, checkpoint_id=3),
        id="after-pre-commit",
    ),
    pytest.param(FailureInjection("before_commit", checkpoint_id=3), id="before-commit"),
]


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("union", [False, True], ids=["one-source", "union"])
def test_keyed_stages_in_process_commit_what_the_oracle_computes(
    tmp_path: Path, failure: FailureInjection | None, union: bool
) -> None:
    more = clicks(1_500) if union else None
    result, out = run_stages(IN_PROCESS, tmp_path, "local", failure, clicks=more)
    assert result.status is JobStatus.FINISHED
    assert len(result.completed_checkpoints) >= 5
    assert result.attempt == (1 if failure is None else 2)
    if failure is not None:
        assert result.restores == [restored_before_failure(result)]
    expected = oracle(events(EVENTS) + (more or ()))
    assert line_counts(out) == expected
    assert hidden_files(out) == []


def test_several_sinks_in_process_each_commit_exactly_once(tmp_path: Path) -> None:
    failure = FailureInjection("keyed", subtask=1, records=60, at_epoch=3, vertex="per-region")
    clean, clean_out = run_stages(IN_PROCESS, tmp_path, "clean", more_sinks=True)
    failed, failed_out = run_stages(IN_PROCESS, tmp_path, "failed", failure, more_sinks=True)
    assert clean.restores == [] and len(failed.restores) == 1
    assert line_counts(failed_out) == line_counts(clean_out)
    for sink in sorted(p.name for p in (tmp_path / "clean" / "more").iterdir()):
        clean_lines = line_counts(str(tmp_path / "clean" / "more" / sink))
        assert clean_lines, sink
        assert line_counts(str(tmp_path / "failed" / "more" / sink)) == clean_lines, sink


def test_a_job_in_process_never_imports_pyspark(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        from tests.runtime.pv_harness import IN_PROCESS, expected_every_lines, run_pv
        from sparkpoint.testing import line_counts
        result, out = run_pv(IN_PROCESS, Path({str(tmp_path)!r}), "no-spark")
        print(json.dumps({{
            "status": result.status.value,
            "exact": line_counts(out) == expected_every_lines(),
            "pyspark": sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j")),
        }}))
        """
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"status": "FINISHED", "exact": True, "pyspark": []}


def test_execute_in_process_runs_a_job_authors_pipeline(tmp_path: Path) -> None:
    """``env.execute(..., in_process=True)``, as a job author's unit test would call it."""
    options = JobOptions(job_id="author-test", local_dir=str(tmp_path / "local"))
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(GeneratorSource(events=5_000, apps=APPS, rate=0), uid="events")
        .filter(lambda e: e["app_id"] != "app-0", uid="drop-app-0")
        .key_by("app_id")
        .count(uid="pv", output="pv")
        .sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    )
    result = env.execute("author-test", in_process=True)
    assert result.status is JobStatus.FINISHED
    latest: dict[str, int] = {}
    for line in line_counts(str(tmp_path / "out")):
        record = json.loads(line)
        latest[record["app_id"]] = max(latest.get(record["app_id"], 0), record["pv"])
    truth = true_counts(5_000)
    del truth["app-0"]
    assert latest == truth


def test_a_function_that_cannot_be_shipped_fails_the_job_as_on_spark(tmp_path: Path) -> None:
    """The runner ships the graph as Spark does: what Spark could not pickle fails here too."""
    lock = threading.Lock()

    def tag(event: dict[str, Any]) -> dict[str, Any]:
        with lock:  # a lock cannot be pickled: no task could receive this function
            return event

    options = JobOptions(
        job_id="unshippable",
        local_dir=str(tmp_path / "local"),
        restart_strategy={"restart-strategy.type": "none"},
    )
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(GeneratorSource(events=100, rate=0), uid="events")
        .map(tag, uid="tag")
        .key_by("app_id")
        .count(uid="pv", output="pv")
        .sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    )
    with pytest.raises(JobFailedError, match=r"cannot pickle '_thread\.lock' object"):
        env.execute("unshippable", in_process=True)
