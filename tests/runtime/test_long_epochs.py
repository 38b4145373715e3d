"""An epoch that hangs says so while it hangs: which epoch, how long, how far its stages got."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.functions import KeyedContext, KeyedProcessFunction
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.protocol import JobStatus
from sparkpoint.runtime import long_epochs
from sparkpoint.runtime.driver import JobDriver, JobResult
from sparkpoint.state.descriptors import ValueStateDescriptor

from ..support.waiting import wait_for
from .pv_harness import job_options

pytestmark = pytest.mark.spark

# Where the epoch hangs: the source's tasks done, a keyed task running and not ending.
HANGING = re.compile(
    r"has not ended .*: events: 2 of 2 tasks done, 0 running; counts: [01] of 2 tasks done, "
    r"[12] running$"
)


class _HangOnce(KeyedProcessFunction):
    """At the 500th record of a key, says so in the file ``hanging`` and waits until the file
    ``release`` exists (as a task whose storage or sink stopped answering would), once."""

    def __init__(self, hanging: str, release: str) -> None:
        self.hanging = hanging
        self.release = release

    def open(self, ctx: KeyedContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("n", 0))

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        self.count.update(self.count.value() + 1)
        if self.count.value() == 500:
            Path(self.hanging).touch()
            deadline = time.monotonic() + 120  # a test that went wrong ends all the same
            while not os.path.exists(self.release) and time.monotonic() < deadline:
                time.sleep(0.05)
        yield {"k": ctx.current_key, "n": self.count.value()}


def test_a_hanging_epoch_says_which_it_is_and_how_far_spark_got_then_when_it_ends(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(long_epochs, "WARN_AFTER_S", 0.5)
    hanging, release = str(tmp_path / "hanging"), str(tmp_path / "release")
    options = job_options("hang", tmp_path, "hang", epoch_records=2_000)
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(GeneratorSource(events=8_000, apps=4, rate=0, splits=2), uid="events")
        .key_by("app_id")
        .process(_HangOnce(hanging, release), uid="counts")
        .sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    )
    env.graph.name = "hang"
    results: list[JobResult] = []
    runner = threading.Thread(
        target=lambda: results.append(JobDriver(env.graph, options, spark=spark).run())
    )
    with caplog.at_level(logging.WARNING, logger=long_epochs.__name__):
        runner.start()
        try:
            wait_for("a task to hang", lambda: os.path.exists(hanging), 120)
            seen = len(caplog.records)
            # Said again every interval: once Spark's status tracker (fed asynchronously by
            # its listener bus) has the hanging task, a warning shows where the epoch hangs.
            said = wait_for(
                "a warning that shows the hanging task",
                lambda: [m for r in caplog.records[seen:] if HANGING.search(m := r.getMessage())],
                120,
            )
        finally:
            open(release, "x").close()
            runner.join(180)
    assert not runner.is_alive()
    [result] = results
    assert result.status is JobStatus.FINISHED
    # Which epoch of which job, and what Spark says of each operator's stage: the source's
    # tasks are done, the keyed operator's hang.
    assert "hang (hang) attempt 1 epoch " in said[0], said
    assert re.search(r"has run for \d+ s and has not ended", said[0]), said
    epoch = said[0].split(" has run for ")[0]
    ended = [r.getMessage() for r in caplog.records if " ended after " in r.getMessage()]
    assert [e for e in ended if e.startswith(f"{epoch} ended after ")], (said, ended)
