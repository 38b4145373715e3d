"""Exactly-once on S3: the PV job with its output and its checkpoints on moto's S3 server.

``--output s3://...`` makes the file sink commit by manifest; ``--checkpoint-dir s3://...``
puts state, ``_metadata`` (and the shared files of incremental snapshots, the durable working
state) on the same store. A run failed after a pre-commit, and one failed mid-epoch, commit
the same output as the failure-free run, which is what the source implies.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples import pv_count
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.object_store import ObjectStoreFileSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode, JobStatus
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection

from ...support.s3 import S3Bucket, s3, s3_endpoint  # noqa: F401 - fixtures
from ..pv_harness import APPS, EPOCH_RECORDS, EVENTS, drive, expected_every_lines

pytestmark = pytest.mark.spark


def run_pv_on_s3(
    spark: Any,
    s3: S3Bucket,  # noqa: F811
    local: Path,
    *,
    failure: FailureInjection | None = None,
    backend: tuple[str, bool] = ("hashmap", False),
    isolate_workers: bool = False,
) -> tuple[JobResult, ObjectStoreFileSink]:
    """The PV job of ``pv_harness.run_pv`` with ``--output`` and ``--checkpoint-dir`` on S3."""
    options = JobOptions(
        job_id="pv-s3",
        checkpoint=CheckpointConfig(mode=CheckpointingMode.EXACTLY_ONCE, interval_ms=1),
        checkpoint_dir=s3.url("chk"),
        checkpoint_storage="filesystem",
        local_dir=str(local),
        parallelism=2,
        max_epoch_records=EPOCH_RECORDS,
        min_epoch_records=EPOCH_RECORDS,
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": "2",
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
        state_backend=backend[0],
        incremental=backend[1],
        isolate_workers=isolate_workers,
        durable_working_state=True if isolate_workers else None,
    )
    env = StreamExecutionEnvironment(options)
    argv = ["--events", str(EVENTS), "--apps", str(APPS), "--rate", "0", "--splits", "2"]
    pv_count.build(env, [*argv, "--output", s3.url("out")])
    env.graph.name = "pv-count"
    sink = env.graph.sink
    assert isinstance(sink, ObjectStoreFileSink)
    result = drive(env.graph, options, spark, failure)
    return result, sink


def test_failure_free_run_on_s3_commits_exactly_the_source(
    spark: Any,
    s3: S3Bucket,  # noqa: F811
    tmp_path: Path,
) -> None:
    result, sink = run_pv_on_s3(spark, s3, tmp_path)
    assert result.status is JobStatus.FINISHED and result.restores == []
    assert len(result.completed_checkpoints) >= 5
    assert Counter(sink.committed_lines()) == expected_every_lines()
    assert sink.uncommitted_parts() == []
    assert s3.fs().exists(f"{s3.name}/chk/pv-s3/chk-{result.completed_checkpoints[-1]}/_metadata")


@pytest.mark.parametrize(
    ("failure", "backend", "isolate_workers"),
    [
        pytest.param(
            FailureInjection("after_pre_commit", subtask=0, checkpoint_id=3),
            ("rocksdb", True),
            False,
            id="after-pre-commit-rocksdb-incremental",
        ),
        pytest.param(
            FailureInjection("keyed", subtask=1, records=200, at_epoch=3),
            ("hashmap", False),
            True,
            id="mid-epoch-durable-working-state",
        ),
    ],
)
def test_exactly_once_on_s3_after_a_failure(
    engine: Any,
    s3: S3Bucket,  # noqa: F811
    tmp_path: Path,
    failure: FailureInjection,
    backend: tuple[str, bool],
    isolate_workers: bool,
) -> None:
    result, sink = run_pv_on_s3(
        engine, s3, tmp_path, failure=failure, backend=backend, isolate_workers=isolate_workers
    )
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2 and len(result.restores) == 1
    assert result.restores[0] is not None  # restored from a checkpoint on S3
    assert Counter(sink.committed_lines()) == expected_every_lines()
    assert sink.uncommitted_parts() == []  # the failed attempt's parts were aborted
