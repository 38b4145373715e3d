"""A job of two independent pipelines (two failover regions) for the failover-strategy
tests: pipeline ``a`` counts events per user, pipeline ``b`` counts clicks per user, each
into its own file sink, never joined; and the plain-Python oracle of each output."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path
from typing import Any

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection, ListSource, committed_files

from .pv_harness import drive

USERS = 11
RECORDS = 4_000  # per pipeline, 2,000 per split
EPOCH_RECORDS = 400  # per split: 5 epochs, a checkpoint in each


def records(n: int, step: int) -> tuple[dict[str, Any], ...]:
    return tuple({"user": f"u{(i * step + i // 7) % USERS}"} for i in range(n))


A_RECORDS = records(RECORDS, 3)
B_RECORDS = records(RECORDS, 5)


def oracle(rows: tuple[dict[str, Any], ...]) -> Counter[str]:
    """Every running count of every user: what a count per user commits, exactly once."""
    per_user = Counter(r["user"] for r in rows)
    return Counter(
        f'{{"user": "{u}", "n": {k}}}' for u, n in per_user.items() for k in range(1, n + 1)
    )


def run_two_pipelines(
    spark: Any,
    base: Path,
    name: str,
    failure: FailureInjection | None = None,
    failover_strategy: str = "region",
    **extra: Any,
) -> tuple[JobResult, str, str]:
    """Run the job (on Spark, or in this process given ``IN_PROCESS``; ``extra``: other job
    options); returns its result and the output directories of pipelines ``a`` and ``b``."""
    out_a, out_b = str(base / name / "a"), str(base / name / "b")
    options = JobOptions(
        job_id=f"two-{name}",
        checkpoint=CheckpointConfig(mode=CheckpointingMode.EXACTLY_ONCE, interval_ms=1),
        checkpoint_dir=f"file://{base / name / 'chk'}",
        local_dir=str(base / name / "local"),
        parallelism=2,
        max_epoch_records=EPOCH_RECORDS,
        min_epoch_records=EPOCH_RECORDS,
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": "2",
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
        failover_strategy=failover_strategy,
    )
    options = dataclasses.replace(options, **extra)
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(ListSource(A_RECORDS, splits=2), uid="a-events")
        .key_by("user")
        .count(uid="a-count", output="n")
        .sink_to(FileSink(out_a), uid="a-sink")
    )
    (
        env.from_source(ListSource(B_RECORDS, splits=2), uid="b-events")
        .key_by("user")
        .count(uid="b-count", output="n")
        .sink_to(FileSink(out_b), uid="b-sink")
    )
    env.graph.name = "two-pipelines"
    return drive(env.graph, options, spark, failure), out_a, out_b


def committed_attempts(out: str) -> set[int]:
    """The job attempts named by the transactions whose parts ``out`` committed."""
    found = set()
    for name in committed_files(out):
        core = os.path.basename(name).split(".e")[0]  # part-<sink>-<sub>-<tag>-a<n>-e<m>-<seq>
        found.add(int(core.rsplit("-a", 1)[1].split("-")[0]))
    return found
