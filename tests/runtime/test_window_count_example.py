"""The seed's window example (``jobs/examples/window_count.py``) on Spark, failed and restored:
its committed windows equal a plain-Python count of the source's events per sliding window."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from examples import window_count
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.testing import FailureInjection, committed_lines

pytestmark = pytest.mark.spark
EVENTS, APPS, RATE = 40_000, 4, 20_000.0  # 2 s of event time, paced at 20,000 events/s
ARGS = ["--events", str(EVENTS), "--apps", str(APPS), "--rate", str(RATE)]


def _expected() -> Counter[str]:
    """Each (app, sliding window) with its count, from the source's records."""
    source = GeneratorSource(events=EVENTS, apps=APPS, rate=RATE)
    counts: Counter[tuple[str, int]] = Counter()
    for split in range(source.splits):
        batch = source.read(split, 0, source.total(split) or 0)
        times = np.asarray(batch.column("event_time")).tolist()
        for app, t in zip(batch.column("app_id").tolist(), times, strict=True):
            last = t - t % window_count.SLIDE_MS
            for start in range(
                last - window_count.WINDOW_MS + window_count.SLIDE_MS,
                last + 1,
                window_count.SLIDE_MS,
            ):
                counts[(app, start)] += 1
    return Counter(
        json.dumps(
            {
                "app_id": app,
                "window_start": s,
                "window_end": s + window_count.WINDOW_MS,
                "count": n,
            },
            sort_keys=True,
        )
        for (app, s), n in counts.items()
    )


def _run(spark: Any, base: Path, failure: FailureInjection | None) -> Counter[str]:
    out = base / "out"
    env = StreamExecutionEnvironment(
        JobOptions(
            job_id=base.name,
            checkpoint=CheckpointConfig(interval_ms=300),
            checkpoint_dir=f"file://{base / 'chk'}",
            checkpoint_storage="filesystem",
            local_dir=str(base / "local"),
            max_epoch_records=2_000,  # at least 10 epochs, however fast the machine is
            min_epoch_records=1_000,
            restart_strategy={
                "restart-strategy.type": "fixed-delay",
                "restart-strategy.fixed-delay.delay": "0 ms",
            },
        )
    )
    window_count.build(env, [*ARGS, "--output", str(out)])
    env.graph.name = "window-count"
    result = JobDriver(env.graph, env.options, spark=spark, failure=failure).run()
    assert len(result.restores) == (0 if failure is None else 1)
    return Counter(
        json.dumps(json.loads(line), sort_keys=True) for line in committed_lines(str(out))
    )


def test_window_count_commits_every_window_once_with_and_without_a_failure(
    spark: Any, tmp_path: Path
) -> None:
    expected = _expected()
    assert len(expected) == APPS * (2_000 // window_count.SLIDE_MS + 3)  # every window has data
    assert _run(spark, tmp_path / "clean", None) == expected
    failure = FailureInjection("keyed", subtask=0, records=500, at_epoch=3)
    assert _run(spark, tmp_path / "failed", failure) == expected
