"""Column pruning: a sending task ships through the exchange only the fields the next stage's
operator reads (:meth:`~sparkpoint.functions.KeyedOperator.fields_read`). A count reads its
key; a window count its key and timestamp; a function of the whole record gets every field.
The elements are observed where they cross the exchange (the in-process runner's source
tasks), and the jobs' committed output is checked against the records."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.functions import WEIGHT, KeyedProcessFunction
from sparkpoint.graph import DataStream, StreamExecutionEnvironment
from sparkpoint.records import Batch, DictColumn
from sparkpoint.runtime import local
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.testing import committed_lines, line_counts
from sparkpoint.windows import TumblingEventTimeWindows

from .pv_harness import job_options, latest_pv, true_counts

EVENTS = 6_000
APPS = 50


def _committed(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in committed_lines(out)]


def test_select_keeps_the_named_columns_in_the_batch_order() -> None:
    batch = Batch.of_columns(a=np.arange(3), b=np.arange(3), c=np.arange(3))
    assert list(batch.select(frozenset({"c", "a"})).columns) == ["a", "c"]
    assert batch.select(frozenset({"a", "b", "c"})) is batch  # nothing to drop
    # A field the records lack: shipped whole, so the reader's error lists every field.
    assert batch.select(frozenset({"a", "nope"})) is batch
    rows = Batch.of_rows([{"a": 1, "b": 2}])
    assert rows.select(frozenset({"a"})) is rows  # rows are not rewritten one by one


def _shipped_fields(monkeypatch: pytest.MonkeyPatch) -> list[frozenset[str]]:
    """The fields of every batch of records a source task sends through the exchange."""
    seen: list[frozenset[str]] = []
    run_source_task = local.run_source_task

    def observed(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for element in run_source_task(*args, **kwargs):
            payload = element[1][1] if isinstance(element, tuple) else None
            if isinstance(payload, Batch) and len(payload):
                seen.append(frozenset(payload.columns))
            yield element

    monkeypatch.setattr(local, "run_source_task", observed)
    return seen


def _run(tmp_path: Path, name: str, build: Callable[[DataStream], DataStream]) -> str:
    """A generator of EVENTS page views (app_id, event_id, event_time) through ``build`` to
    a file sink, in-process; returns the output directory."""
    options = job_options(f"prune-{name}", tmp_path, name, epoch_records=1_000)
    env = StreamExecutionEnvironment(options)
    source = GeneratorSource(events=EVENTS, apps=APPS, rate=0, splits=2)
    out = str(tmp_path / name / "out")
    build(env.from_source(source, uid="events")).sink_to(FileSink(out), uid="sink")
    result = JobDriver(env.graph, options, in_process=True).run()
    assert result.records == EVENTS
    return out


@pytest.mark.parametrize(
    ("emit", "shipped"),
    [
        pytest.param("every", {"app_id"}, id="records"),
        pytest.param("epoch", {"app_id", WEIGHT}, id="partial-counts"),
    ],
)
def test_a_count_ships_only_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emit: str, shipped: set[str]
) -> None:
    """Records ship their key alone; with ``emit="epoch"`` (50 apps repeat) partial counts
    ship the key and its weight."""
    seen = _shipped_fields(monkeypatch)
    out = _run(tmp_path, emit, lambda s: s.key_by("app_id").count(uid="pv", output="pv", emit=emit))
    assert seen and set(seen) == {frozenset(shipped)}
    assert latest_pv(line_counts(out)) == true_counts(EVENTS, APPS)


def test_a_window_count_ships_its_key_and_timestamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _shipped_fields(monkeypatch)
    out = _run(
        tmp_path,
        "window",
        lambda s: (
            s.assign_timestamps_and_watermarks("event_time", 0, uid="wm")
            .key_by("app_id")
            .window(TumblingEventTimeWindows(1_000))
            .count(uid="win", output="n")
        ),
    )
    assert seen and set(seen) == {frozenset({"app_id", "event_time"})}
    windows = _committed(out)
    assert sum(r["n"] for r in windows) == EVENTS


class _LastEventId(KeyedProcessFunction):
    """Reads a field that is not the key: it must arrive."""

    def process_element(self, value: Any, ctx: Any) -> Iterator[Any]:
        yield {"app_id": value["app_id"], "event_id": value["event_id"]}


@pytest.mark.parametrize(
    "selector",
    [pytest.param("app_id", id="field"), pytest.param(lambda r: r["app_id"], id="function")],
)
def test_a_function_of_the_whole_record_gets_every_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, selector: Any
) -> None:
    seen = _shipped_fields(monkeypatch)
    out = _run(tmp_path, "process", lambda s: s.key_by(selector).process(_LastEventId(), uid="p"))
    assert seen and set(seen) == {frozenset({"app_id", "event_id", "event_time"})}
    ids = Counter(r["event_id"] for r in _committed(out))
    assert sorted(ids) == list(range(EVENTS)) and set(ids.values()) == {1}


def test_a_count_by_a_function_of_the_record_gets_every_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _shipped_fields(monkeypatch)
    _run(tmp_path, "count-fn", lambda s: s.key_by(lambda r: r["app_id"]).count(uid="pv"))
    assert seen and set(seen) == {frozenset({"app_id", "event_id", "event_time"})}


def test_a_dictionary_key_column_stays_encoded_when_pruned() -> None:
    keys = DictColumn(np.array([0, 1, 0], dtype=np.int32), np.array(["a", "b"]))
    pruned = Batch.of_columns(k=keys, v=np.arange(3)).select(frozenset({"k"}))
    assert pruned.column("k") is keys
