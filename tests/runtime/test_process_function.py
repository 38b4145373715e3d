"""A KeyedProcessFunction with Value/List/MapState over a file source, failed and restored."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import FileSource
from sparkpoint.functions import KeyedContext, KeyedProcessFunction
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from sparkpoint.testing import FailureInjection, line_counts

pytestmark = pytest.mark.spark
PAGES = ["home", "cart", "search", "x", "help"]


class Sessionize(KeyedProcessFunction):
    """Per user: visits so far, distinct pages, the last three pages."""

    def open(self, ctx: KeyedContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", 0))
        self.recent = ctx.get_state(ListStateDescriptor("recent"))
        self.pages = ctx.get_state(MapStateDescriptor("pages"))

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        self.count.update(self.count.value() + 1)
        self.recent.update([*self.recent.get(), value["page"]][-3:])
        self.pages.put(value["page"], (self.pages.get(value["page"]) or 0) + 1)
        yield {
            "user": ctx.current_key,
            "n": self.count.value(),
            "distinct": len(list(self.pages.keys())),
            "last": self.recent.get(),
        }


def _write_inputs(base: Path) -> list[str]:
    paths = []
    for f in range(3):  # user u<i> lives in file i % 3, so each key has one channel
        lines = [
            json.dumps({"user": f"u{u}", "page": PAGES[(u * 7 + k) % 5]})
            for k in range(40)
            for u in range(f, 15, 3)
        ]
        path = base / f"events-{f}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def _expected(paths: list[str]) -> Counter[str]:
    fn_state: dict[str, tuple[int, list[str], dict[str, int]]] = {}
    out: Counter[str] = Counter()
    for path in paths:
        for line in Path(path).read_text().splitlines():
            e = json.loads(line)
            if e["page"] == "x":
                continue
            n, recent, pages = fn_state.get(e["user"], (0, [], {}))
            recent = [*recent, e["page"]][-3:]
            pages = {**pages, e["page"]: pages.get(e["page"], 0) + 1}
            fn_state[e["user"]] = (n + 1, recent, pages)
            out[
                json.dumps({"user": e["user"], "n": n + 1, "distinct": len(pages), "last": recent})
            ] += 1
    return out


def _run(spark: Any, base: Path, paths: list[str], failure: FailureInjection | None) -> str:
    out = str(base / "out")
    options = JobOptions(
        job_id=base.name,
        checkpoint=CheckpointConfig(interval_ms=1),
        checkpoint_dir=f"file://{base / 'chk'}",
        checkpoint_storage="filesystem",
        local_dir=str(base / "local"),
        parallelism=2,
        max_epoch_records=60,
        min_epoch_records=60,
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
    )
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(FileSource(tuple(paths)), uid="events")
        .filter(lambda e: e["page"] != "x", uid="drop-x")
        .key_by("user")
        .process(Sessionize(), uid="sessions")
        .sink_to(FileSink(out), uid="sink")
    )
    env.graph.name = "sessions"
    result = JobDriver(env.graph, options, spark=spark, failure=failure).run()
    assert len(result.restores) == (0 if failure is None else 1)
    return out


def test_keyed_process_function_state_is_exactly_once(spark: Any, tmp_path: Path) -> None:
    paths = _write_inputs(tmp_path)
    expected = _expected(paths)
    clean = _run(spark, tmp_path / "clean", paths, None)
    assert line_counts(clean) == expected
    failed = _run(
        spark,
        tmp_path / "failed",
        paths,
        FailureInjection("keyed", subtask=1, records=20, at_epoch=2),
    )
    assert line_counts(failed) == expected
