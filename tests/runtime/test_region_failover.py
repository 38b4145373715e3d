"""Failover strategies: in a job of two independent pipelines, ``region`` restarts only the
pipeline that failed (the other's attempt, working state and committed output untouched),
``full`` restarts both; either way each pipeline commits exactly what its oracle computes. A
job of one region takes the same path under either strategy."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from sparkpoint import FileSink, StreamExecutionEnvironment
from sparkpoint import protocol as p
from sparkpoint.errors import ConfigurationError
from sparkpoint.job_graph import Region
from sparkpoint.options import JobOptions
from sparkpoint.protocol import JobStatus
from sparkpoint.runtime.failover import failover_region
from sparkpoint.testing import FailureInjection, ListSource, line_counts
from sparkpoint.transport import Streams

from ..support.redis_server import REDIS_URL
from .keyed_stages_job import restored_before_failure, run_stages
from .pv_harness import IN_PROCESS, hidden_files
from .scripted_control_plane import ScriptedControlPlane
from .two_pipelines_job import (
    A_RECORDS,
    B_RECORDS,
    committed_attempts,
    oracle,
    run_two_pipelines,
)

A = Region("a-events", ("a-events", "a-count"))
B = Region("b-events", ("b-events", "b-count"))

FAILURES_IN_A = [
    pytest.param(
        FailureInjection("keyed", subtask=1, records=60, at_epoch=2, vertex="a-count"),
        id="mid-epoch",
    ),
    pytest.param(
        FailureInjection("source", subtask=0, offset=1_000, vertex="a-events"), id="in-source"
    ),
    pytest.param(
        FailureInjection("alignment", subtask=1, checkpoint_id=2, vertex="a-count"),
        id="during-alignment",
    ),
    pytest.param(
        FailureInjection("after_pre_commit", subtask=0, checkpoint_id=3, vertex="a-count"),
        id="after-pre-commit",
    ),
]


def _payloads(result: Any, kind: str) -> list[dict[str, Any]]:
    assert result.events is not None
    return [e.payload for e in result.events.events if e.type == kind]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Counter[str], Counter[str]]:
    result, out_a, out_b = run_two_pipelines(IN_PROCESS, tmp_path_factory.mktemp("two"), "clean")
    assert result.status is JobStatus.FINISHED and result.restores == []
    assert len(result.completed_checkpoints) >= 4
    return line_counts(out_a), line_counts(out_b)


def test_regions_are_the_independent_pipelines(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment(JobOptions(local_dir=str(tmp_path)))
    for name in ("a", "b"):
        (
            env.from_source(ListSource(A_RECORDS, splits=2), uid=f"{name}-events")
            .key_by("user")
            .count(uid=f"{name}-count", output="n")
            .sink_to(FileSink(str(tmp_path / name)), uid=f"{name}-sink")
        )
    graph = env.graph
    assert graph.regions() == [A, B]
    assert failover_region(graph, "region", "b-count") == B
    assert failover_region(graph, "region", None) is None  # not attributed: the whole job
    assert failover_region(graph, "full", "b-count") is None
    with pytest.raises(ConfigurationError, match="unknown failover strategy 'partial'"):
        failover_region(graph, "partial", "b-count")


def test_failure_free_pipelines_commit_what_their_oracles_compute(
    clean: tuple[Counter[str], Counter[str]],
) -> None:
    assert clean == (oracle(A_RECORDS), oracle(B_RECORDS))


@pytest.mark.parametrize("failure", FAILURES_IN_A)
def test_region_failover_restarts_only_the_failed_pipeline(
    tmp_path: Path, clean: tuple[Counter[str], Counter[str]], failure: FailureInjection
) -> None:
    result, out_a, out_b = run_two_pipelines(IN_PROCESS, tmp_path, "region", failure)
    assert result.status is JobStatus.FINISHED
    restored = restored_before_failure(result)
    assert result.restores == []  # no full restore
    assert result.region_restores == [("a-events", restored)]
    [failed] = _payloads(result, "task_failed")
    assert failed["region"] == "a-events"
    assert failed["region_vertices"] == ["a-events", "a-count"]
    assert failed["operator_id"] == failure.vertex
    assert len(_payloads(result, "job_restored")) == 1
    # Exactly once in both pipelines.
    assert (line_counts(out_a), line_counts(out_b)) == clean
    assert hidden_files(out_a) == [] and hidden_files(out_b) == []
    # B was never restarted: every transaction it committed is of attempt 1; A's restarted.
    assert committed_attempts(out_b) == {1}
    assert committed_attempts(out_a) == ({1, 2} if restored else {2})
    assert result.attempt == 2


@pytest.mark.parametrize("failure", FAILURES_IN_A)
def test_full_failover_restarts_both_pipelines(
    tmp_path: Path, clean: tuple[Counter[str], Counter[str]], failure: FailureInjection
) -> None:
    result, out_a, out_b = run_two_pipelines(IN_PROCESS, tmp_path, "full", failure, "full")
    assert result.status is JobStatus.FINISHED
    assert result.restores == [restored_before_failure(result)]
    assert result.region_restores == []
    [failed] = _payloads(result, "task_failed")
    assert failed["region"] is None
    assert (line_counts(out_a), line_counts(out_b)) == clean
    assert committed_attempts(out_b) == {1, 2}
    assert committed_attempts(out_a) == {1, 2}


def test_a_failure_in_the_second_pipeline_restarts_only_it(
    tmp_path: Path, clean: tuple[Counter[str], Counter[str]]
) -> None:
    """The mirror case: the in-process runner runs ``b-count`` after ``a-count``, so A's sink
    wrote its parts of the failed epoch before B failed; A keeps its working state, runs the
    epoch again, and commits neither those parts nor a record twice."""
    failure = FailureInjection("keyed", subtask=0, records=50, at_epoch=2, vertex="b-count")
    result, out_a, out_b = run_two_pipelines(IN_PROCESS, tmp_path, "region-b", failure)
    assert result.region_restores == [("b-events", restored_before_failure(result))]
    assert (line_counts(out_a), line_counts(out_b)) == clean
    assert committed_attempts(out_a) == {1}
    assert hidden_files(out_a) == [] and hidden_files(out_b) == []


def test_a_job_of_one_region_restarts_whole_under_either_strategy(tmp_path: Path) -> None:
    """Same events under ``region`` and ``full`` (but for the paths that name the job)."""
    failure = FailureInjection("keyed", subtask=1, records=60, at_epoch=3, vertex="per-region")
    seen = {}
    for strategy in ("region", "full"):
        result, out = run_stages(
            IN_PROCESS, tmp_path, strategy, failure, failover_strategy=strategy
        )
        assert result.region_restores == []
        assert result.restores == [restored_before_failure(result)]
        [failed] = _payloads(result, "task_failed")
        assert failed["region"] is None and failed["region_vertices"] is None
        assert result.events is not None
        seen[strategy] = (
            # Which events each attempt emits and which fields a restore reports: how many
            # checkpoints complete before the failure, and so their order and count and the
            # checkpoint restored, follow the machine's timing (asserted above per run).
            {(e.attempt, e.type) for e in result.events.events},
            # (the cause says when the task raised it: not the same in two runs)
            [
                {**f, "cause": re.sub(r" at unix time [0-9.]+$", "", f["cause"])}
                for f in _payloads(result, "task_failed")
            ],
            [sorted(r) for r in _payloads(result, "job_restored")],
            line_counts(out),
        )
    assert seen["region"] == seen["full"]


def test_a_connected_job_restores_the_region_the_control_plane_restarts(
    tmp_path: Path,
    clean: tuple[Counter[str], Counter[str]],
    client: redis.Redis,
    streams: Streams,
) -> None:
    """Connected: the job names the region in ``task_failed``; the control plane decides
    whether and from which checkpoint, and the job restores that region only."""
    failure = FailureInjection("keyed", subtask=1, records=60, at_epoch=2, vertex="a-count")
    connected = {
        "standalone": False,
        "redis_url": REDIS_URL,
        "stream_prefix": streams.prefix,
        "checkpoint_storage": "filesystem",
        "control_plane_timeout_ms": 60_000,
    }
    with ScriptedControlPlane(client, streams) as cp:
        result, out_a, out_b = run_two_pipelines(
            IN_PROCESS, tmp_path, "connected", failure, **connected
        )
    assert cp.error is None
    assert result.status is JobStatus.FINISHED
    ((_, registered),) = cp.of_type(p.JobRegistered)
    assert registered.config["failover_strategy"] == "region"
    assert registered.config["failover_regions"] == {
        "a-events": ["a-events", "a-count"],
        "b-events": ["b-events", "b-count"],
    }
    ((_, failed),) = cp.of_type(p.TaskFailed)
    assert (failed.region, failed.operator_id, failed.subtask) == ("a-events", "a-count", 1)
    restore = next(c for c in cp.sent_payloads(p.RestoreJob) if c.new_attempt == 2)
    assert result.region_restores == [("a-events", restore.checkpoint_id)]
    assert result.restores == []  # the first restore (attempt 1, the beginning) is not one
    assert (line_counts(out_a), line_counts(out_b)) == clean
    assert committed_attempts(out_b) == {1}
    assert hidden_files(out_a) == [] and hidden_files(out_b) == []
