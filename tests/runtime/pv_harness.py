"""Builds and runs the example PV job in-process for the runtime tests."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from examples import pv_count
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.events import EventSink
from sparkpoint.graph import JobGraph, StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode
from sparkpoint.runtime.driver import JobDriver, JobResult
from sparkpoint.testing import FailureInjection

EVENTS = 12_000
APPS = 7
EPOCH_RECORDS = 1_000  # per split: 6 epochs, a checkpoint in each
# Pass as ``spark`` to run without Spark (:class:`~sparkpoint.runtime.local.LocalEpochRunner`).
IN_PROCESS = "in-process"

# Two restarts at once: one injected failure, and a margin.
RESTART_TWICE = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": "2",
    "restart-strategy.fixed-delay.delay": "0 ms",
}


def job_options(
    job_id: str,
    base: Path,
    name: str,
    *,
    epoch_records: int,
    parallelism: int = 2,
    retained: int = 1,
    **more: Any,
) -> JobOptions:
    """A test job's options: a checkpoint per epoch (exactly-once), storage and working
    state under ``<base>/<name>``, epochs of ``epoch_records`` per split, two restarts."""
    return JobOptions(
        job_id=job_id,
        checkpoint=CheckpointConfig(
            mode=CheckpointingMode.EXACTLY_ONCE, interval_ms=1, retained=retained
        ),
        checkpoint_dir=f"file://{base / name / 'chk'}",
        local_dir=str(base / name / "local"),
        parallelism=parallelism,
        max_epoch_records=epoch_records,
        min_epoch_records=epoch_records,
        restart_strategy=dict(RESTART_TWICE),
        **more,
    )


# Every state backend and snapshot kind the exactly-once suite runs with.
BACKENDS = [
    pytest.param(("hashmap", False), id="hashmap"),
    pytest.param(("rocksdb", False), id="rocksdb-full"),
    pytest.param(("rocksdb", True), id="rocksdb-incremental"),
]


def run_pv(
    spark: Any,
    base: Path,
    name: str,
    *,
    mode: str = "exactly_once",
    failure: FailureInjection | None = None,
    emit: str = "every",
    storage: str = "filesystem",
    events: int = EVENTS,
    parallelism: int = 2,
    max_parallelism: int = JobOptions.max_parallelism,
    interval_ms: int = 1,
    splits: int = 2,
    from_checkpoint: str | None = None,
    restart: str = "fixed-delay",
    max_inline: int = 1 << 20,
    out: str | None = None,
    isolate_workers: bool = False,
    backend: tuple[str, bool] = ("hashmap", False),
    allow_non_restored_state: bool = False,
    retained: int = 1,
    savepoint_on_finish: str | None = None,
    apps: int = APPS,
    epoch_records: int = EPOCH_RECORDS,
    alignment_buffer: int = JobOptions.alignment_buffer_bytes,
    checkpoint_dir: bool = True,
    tolerable_failures: int = 0,
    event_sink: EventSink | None = None,
) -> tuple[JobResult, str]:
    """Run the PV job; returns its result and output directory. ``backend`` is the state
    backend and whether its checkpoints are incremental; without ``checkpoint_dir``,
    jobmanager storage keeps the checkpoints in memory."""
    out = out or str(base / name / "out")
    restart_conf = {"restart-strategy.type": restart}
    if restart == "fixed-delay":
        restart_conf |= {
            "restart-strategy.fixed-delay.attempts": "2",
            "restart-strategy.fixed-delay.delay": "0 ms",
        }
    options = JobOptions(
        job_id=f"pv-{name}",
        checkpoint=CheckpointConfig(
            mode=CheckpointingMode(mode),
            interval_ms=interval_ms,
            retained=retained,
            tolerable_failures=tolerable_failures,
        ),
        checkpoint_dir=f"file://{base / name / 'chk'}" if checkpoint_dir else None,
        checkpoint_storage=storage,
        local_dir=str(base / name / "local"),
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        max_epoch_records=epoch_records,
        min_epoch_records=epoch_records,
        restart_strategy=restart_conf,
        from_checkpoint=from_checkpoint,
        max_inline_state_bytes=max_inline,
        isolate_workers=isolate_workers,
        durable_working_state=True if isolate_workers else None,
        state_backend=backend[0],
        incremental=backend[1],
        allow_non_restored_state=allow_non_restored_state,
        savepoint_on_finish=savepoint_on_finish,
        alignment_buffer_bytes=alignment_buffer,
    )
    env = StreamExecutionEnvironment(options)
    pv_count.build(
        env,
        [
            "--events",
            str(events),
            "--apps",
            str(apps),
            "--rate",
            "0",
            "--splits",
            str(splits),
            "--emit",
            emit,
            "--output",
            out,
        ],
    )
    env.graph.name = "pv-count"
    return drive(env.graph, options, spark, failure, event_sink), out


def drive(
    graph: JobGraph,
    options: JobOptions,
    spark: Any,
    failure: FailureInjection | None,
    events: EventSink | None = None,
) -> JobResult:
    """Run a job graph on ``spark`` (a SparkSession) or, given :data:`IN_PROCESS`, without;
    ``events`` also receives the job's events as the driver publishes them."""
    in_process = spark == IN_PROCESS
    session = None if in_process else spark
    driver = JobDriver(
        graph, options, spark=session, failure=failure, in_process=in_process, events=events
    )
    return driver.run()


def true_counts(events: int = EVENTS, apps: int = APPS) -> dict[str, int]:
    """How many events each app really has, read straight from the source."""
    src = GeneratorSource(events=events, apps=apps, rate=0)
    ids = np.concatenate([src.read(i, 0, src.total(i) or 0).column("app_id") for i in range(2)])
    uniq, counts = np.unique(ids, return_counts=True)
    return dict(zip(uniq.tolist(), counts.tolist(), strict=True))


def latest_pv(lines: Counter[str]) -> dict[str, int]:
    """Each app's highest committed count in the PV job's output lines (its final count)."""
    latest: dict[str, int] = {}
    for line in lines:
        record = json.loads(line)
        latest[record["app_id"]] = max(latest.get(record["app_id"], 0), record["pv"])
    return latest


def expected_every_lines(events: int = EVENTS) -> Counter[str]:
    """With ``--emit every``: one line per event, pv 1..n for an app with n events."""
    return Counter(
        f'{{"app_id": "{app}", "pv": {k}}}'
        for app, n in true_counts(events).items()
        for k in range(1, n + 1)
    )


def hidden_files(out: str) -> list[str]:
    return sorted(n for n in os.listdir(out) if n.startswith("."))


def completed_checkpoint_dirs(base: Path, job: str, prefix: str = "pv") -> list[Path]:
    """The ``chk-*`` directories with a ``_metadata`` of the job ``job`` run under ``base``
    (its id ``<prefix>-<job>``), oldest first."""
    root = base / job / "chk" / f"{prefix}-{job}"
    return sorted(
        (d for d in root.glob("chk-*") if (d / "_metadata").exists()),
        key=lambda d: int(d.name.split("-")[1]),
    )
