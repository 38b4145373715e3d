"""A job whose unbounded source has nothing new (a Redis stream at night) keeps checkpointing
and obeys a cancel or a signal, as a Flink job whose sources have no data does.

Before, the planner waited for a record for ever: no barrier was carried (the control plane's
checkpoints all expired, and with no tolerable failure the job failed over again and again),
a cancel stayed CANCELLING and SIGTERM did nothing. An epoch with no record now carries the
barrier of a checkpoint that is due, and between those the driver looks at its commands and
signals every ``WAIT_MS``.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from sparkpoint import protocol as p
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.events import InMemoryEventSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.testing import ListSource, line_counts
from sparkpoint.transport import Streams

from ..support.redis_server import REDIS_URL
from ..support.waiting import wait_for
from .scripted_control_plane import ScriptedControlPlane

APPS = 3
RECORDS = tuple({"app_id": f"app-{i % APPS}"} for i in range(600))
EXPECTED = Counter(
    f'{{"app_id": "app-{a}", "pv": {k}}}' for a in range(APPS) for k in range(1, 201)
)


def _driver(base: Path, name: str, events: InMemoryEventSink | None, **more: Any) -> JobDriver:
    options = JobOptions(
        job_id=f"idle-{name}",
        checkpoint=CheckpointConfig(interval_ms=50),
        checkpoint_dir=f"file://{base / 'chk'}",
        local_dir=str(base / "local"),
        max_epoch_records=100,
        min_epoch_records=100,
        **more,
    )
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(ListSource(RECORDS, splits=2, bounded=False), uid="events")
        .key_by("app_id")
        .count(uid="pv", output="pv")
        .sink_to(FileSink(str(base / "out")), uid="sink")
    )
    return JobDriver(env.graph, options, in_process=True, events=events)


def _completed_while_idle(events: list[p.CheckpointCompleted], base: Path) -> int:
    """Checkpoints completed after the whole output was committed."""
    if line_counts(str(base / "out")) != EXPECTED:
        return 0
    return len(events)


def test_a_standalone_job_on_an_idle_source_checkpoints_and_a_signal_cancels_it(
    tmp_path: Path,
) -> None:
    events = InMemoryEventSink()
    driver = _driver(tmp_path, "standalone", events)
    running = threading.Thread(target=driver.run, daemon=True)
    running.start()
    wait_for("the whole output", lambda: line_counts(str(tmp_path / "out")) == EXPECTED, 30)
    done = len(events.of_type(p.CheckpointCompleted))
    wait_for(
        "three checkpoints while the source is idle",
        lambda: len(events.of_type(p.CheckpointCompleted)) >= done + 3,
        30,
        every_s=0.05,
    )
    driver.authority.request_cancel()  # what the driver's SIGTERM handler calls
    running.join(timeout=30)
    assert not running.is_alive()
    assert driver.job.status is p.JobStatus.CANCELED
    assert line_counts(str(tmp_path / "out")) == EXPECTED


def test_a_connected_job_on_an_idle_source_checkpoints_and_obeys_a_cancel(
    tmp_path: Path, client: redis.Redis, streams: Streams
) -> None:
    idle_completions: list[int] = []

    def cancel_once_idle(cp: ScriptedControlPlane, env: p.Envelope, event: Any) -> None:
        if not isinstance(event, p.SnapshotCompleted) or event.checkpoint_id not in cp.completed:
            return
        if line_counts(str(tmp_path / "out")) == EXPECTED:
            idle_completions.append(event.checkpoint_id)
        if len(set(idle_completions)) >= 3 and not cp.sent_payloads(p.CancelJob):
            cp.cancel(cause="a user's request")

    with ScriptedControlPlane(client, streams, on_event=cancel_once_idle) as cp:
        # (the driver is built inside: the control plane's job key is in the environment)
        driver = _driver(
            tmp_path,
            "connected",
            None,
            standalone=False,
            redis_url=REDIS_URL,
            stream_prefix=streams.prefix,
            control_plane_timeout_ms=30_000,
            checkpoint_storage="filesystem",
        )
        result: list[Any] = []
        running = threading.Thread(target=lambda: result.append(driver.run()), daemon=True)
        running.start()
        running.join(timeout=60)
    assert cp.error is None
    assert not running.is_alive(), "the job did not end: it never read the cancel"
    assert result[0].status is p.JobStatus.CANCELED
    assert len(set(idle_completions)) >= 3
    assert line_counts(str(tmp_path / "out")) == EXPECTED
