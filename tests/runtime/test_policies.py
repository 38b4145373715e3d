"""Checkpoint timeout and the tolerable-failure policy on a real job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examples import pv_count
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointAborted, JobStatusChanged
from sparkpoint.runtime.driver import JobDriver, JobFailedError
from sparkpoint.testing import line_counts

pytestmark = pytest.mark.spark


def test_checkpoints_that_outlive_the_timeout_expire_and_fail_the_job(
    spark: Any, tmp_path: Path
) -> None:
    options = JobOptions(
        job_id="expiring",
        checkpoint=CheckpointConfig(interval_ms=1, timeout_ms=1, tolerable_failures=2),
        checkpoint_dir=f"file://{tmp_path / 'chk'}",
        checkpoint_storage="filesystem",
        local_dir=str(tmp_path / "local"),
        max_epoch_records=500,
        min_epoch_records=500,
        restart_strategy={"restart-strategy.type": "none"},
    )
    env = StreamExecutionEnvironment(options)
    out = str(tmp_path / "out")
    pv_count.build(env, ["--events", "4000", "--rate", "0", "--output", out])
    driver = JobDriver(env.graph, options, spark=spark)
    # Flink's message, and the last failure that exceeded the threshold, with its reason
    # and why it expired (the epoch before it ended, none since)
    cause = (
        r"Exceeded checkpoint tolerable failure threshold\..*last: checkpoint 3 .*"
        r"No epoch ended between the trigger and the expiry: the last to end, epoch 2, .*EXPIRED"
    )
    with pytest.raises(JobFailedError, match=cause):
        driver.run()
    aborted = driver.memory.of_type(CheckpointAborted)
    assert [a.checkpoint_id for a in aborted] == [1, 2, 3]
    assert all(a.reason.startswith("CHECKPOINT_EXPIRED: checkpoint") for a in aborted)
    # Each barrier rode the epoch planned at its trigger, which ran past the 1 ms timeout:
    # the message says so, from the epoch before it. The first epoch, which starts the Python
    # workers, carries none: checkpoint 1 rides epoch 1.
    for a, before in zip(aborted, (0, 1, 2), strict=True):
        assert (
            "missing: events[0], events[1], pv[0], pv[1]. No epoch ended between the trigger "
            f"and the expiry: the last to end, epoch {before}, ended "
        ) in a.reason
        assert "an epoch that runs longer than the checkpoint timeout expires it" in a.reason
    statuses = [s.status.value for s in driver.memory.of_type(JobStatusChanged)]
    assert statuses == ["RUNNING", "FAILING", "FAILED"]
    assert line_counts(out) == {}  # no checkpoint completed, so nothing was committed
    assert not list((tmp_path / "chk" / "expiring").glob("chk-*"))  # partial state deleted
