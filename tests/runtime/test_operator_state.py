"""Operator state (``CheckpointedFunction``): list states that survive epochs, failures and
restores, redistributed when the parallelism changes.

Most runs are in process (the same tasks without Spark); one run per kind of function goes
through Spark with a failure.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.errors import ConfigurationError
from sparkpoint.operator_state import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    OperatorStateStore,
    redistribute,
)
from sparkpoint.protocol import JobStatus
from sparkpoint.runtime.driver import JobFailedError
from sparkpoint.savepoint_tool import inspect_savepoint, render_text
from sparkpoint.testing import FailureInjection, line_counts

from .operator_state_jobs import (
    EVENTS,
    expected_batches,
    last_counts,
    run_batcher,
    run_tally,
)
from .pv_harness import IN_PROCESS, completed_checkpoint_dirs, hidden_files


# ----------------------------------------------------------------------------- redistribution
def test_the_same_parallelism_gives_each_subtask_its_own_list() -> None:
    pieces = [(1, "split", [3, 4]), (0, "split", [1, 2])]
    assert redistribute(pieces, 0, 2, 2) == ("split", [1, 2])
    assert redistribute(pieces, 1, 2, 2) == ("split", [3, 4])


def test_split_lists_are_concatenated_and_cut_evenly_union_lists_go_to_everyone() -> None:
    pieces = [(0, "split", [1, 2, 3]), (1, "split", [4, 5])]
    assert [redistribute(pieces, i, 3, 2)[1] for i in range(3)] == [[1], [2, 3], [4, 5]]
    assert [redistribute(pieces, i, 1, 2)[1] for i in range(1)] == [[1, 2, 3, 4, 5]]
    union = [(0, "union", ["a"]), (1, "union", ["b"])]
    assert [redistribute(union, i, 3, 2) for i in range(3)] == [("union", ["a", "b"])] * 3


def test_a_state_asked_for_in_another_mode_is_refused_naming_it() -> None:
    store = OperatorStateStore({"offsets": ("union", [1])})
    with pytest.raises(ConfigurationError, match="'offsets' was checkpointed as a union"):
        store.get_list_state("offsets")
    assert store.get_union_list_state("offsets").get() == [1]
    store.get_list_state("buffer").add(7)
    with pytest.raises(ConfigurationError, match="'buffer' is a split list state"):
        store.get_union_list_state("buffer")
    assert store.lists() == {"offsets": ("union", [1]), "buffer": ("split", [7])}


# ----------------------------------------------------------------------------- in process
@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(None, id="failure-free"),
        pytest.param(FailureInjection("source", subtask=1, offset=3_500), id="mid-epoch"),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=0, checkpoint_id=3, vertex="events"),
            id="after-pre-commit",
        ),
        pytest.param(FailureInjection("before_commit", checkpoint_id=3), id="before-commit"),
    ],
)
def test_a_buffering_function_keeps_its_buffer_through_epochs_and_restores(
    tmp_path: Path, failure: FailureInjection | None
) -> None:
    result, out = run_batcher(IN_PROCESS, tmp_path, "batcher", failure)
    assert result.status is JobStatus.FINISHED
    assert len(result.restores) == (0 if failure is None else 1)
    assert line_counts(out) == expected_batches()
    assert hidden_files(out) == []


def test_a_checkpoint_holds_each_subtasks_list_in_its_metadata(tmp_path: Path) -> None:
    run_batcher(IN_PROCESS, tmp_path, "meta")
    second = completed_checkpoint_dirs(tmp_path, "meta", "opstate")[1]
    meta = json.loads((second / "_metadata").read_text())
    states = [s for a in meta["acks"] for s in a["operator_state"]]
    assert sorted((s["function"], s["name"], s["subtask"]) for s in states) == [
        ("batcher", "buffer", 0),
        ("batcher", "buffer", 1),
    ]
    assert all(s["mode"] == "split" and s["parallelism"] == 2 for s in states)
    assert all(0 <= s["values"] < 7 for s in states)
    # The lists count in the subtasks' sizes (the source vertex has no keyed state).
    for ack in meta["acks"]:
        inline = sum(len(s["data"]) for s in ack["operator_state"])
        assert ack["state_size"] == ack["checkpointed_size"] == inline > 0
    # sparkpoint savepoint inspect shows them.
    summary = inspect_savepoint(str(second))
    assert [(v, sub, f, n) for v, sub, f, n, _, _ in summary.operator_state] == [
        ("events", 0, "batcher", "buffer"),
        ("events", 1, "batcher", "buffer"),
    ]
    assert summary.stateless == []
    assert "operator events, subtask 1: operator state of batcher, list 'buffer' (split)" in (
        render_text(summary)
    )


def test_a_keyed_function_with_operator_state_restores_at_another_parallelism(
    tmp_path: Path,
) -> None:
    _, out = run_tally(IN_PROCESS, tmp_path, "two", parallelism=2)
    assert sum(last_counts(line_counts(out), 2).values()) == EVENTS
    middle = completed_checkpoint_dirs(tmp_path, "two", "opstate")[2]
    for parallelism in (3, 1):  # into the same output: its transactions are committed there
        result, _ = run_tally(
            IN_PROCESS,
            tmp_path,
            f"to-{parallelism}",
            parallelism,
            from_checkpoint=f"file://{middle}",
            out=out,
        )
        assert result.status is JobStatus.FINISHED
        last = last_counts(line_counts(out), parallelism)
        assert sorted(last) == list(range(parallelism))
        # The counts restored with the checkpoint plus what came after it: every event once.
        assert sum(last.values()) == EVENTS, last


def test_state_of_a_function_the_job_lacks_is_refused_unless_allowed(tmp_path: Path) -> None:
    run_batcher(IN_PROCESS, tmp_path, "src")
    latest = completed_checkpoint_dirs(tmp_path, "src", "opstate")[-1]
    meta = json.loads((latest / "_metadata").read_text())
    for ack in meta["acks"]:
        for state in ack["operator_state"]:
            state["function"] = "old-batcher"
    (latest / "_metadata").write_text(json.dumps(meta))
    with pytest.raises(ConfigurationError, match=r"operator state of functions \['old-batcher'\]"):
        run_tally(IN_PROCESS, tmp_path, "other", from_checkpoint=f"file://{latest}")


def test_a_list_over_the_inline_limit_declines_the_checkpoint_with_the_reason(
    tmp_path: Path,
) -> None:
    with pytest.raises(JobFailedError, match="tolerable failure threshold"):
        run_big(tmp_path)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    reasons = {e["payload"]["reason"] for e in events if e["type"] == "checkpoint_declined"}
    assert reasons, "no checkpoint was declined"
    assert all(
        "operator state of ['hoarder'] in subtask" in r and "more than the 65536 a checkpoint" in r
        for r in reasons
    ), reasons


class Hoarder(CheckpointedFunction):
    """Keeps every event, as text, in its operator state: far over the inline limit."""

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        self.state = ctx.operator_state_store.get_list_state("all")

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        pass  # the list is the state

    def __call__(self, event: dict[str, Any]) -> list[Any]:
        self.state.add(f"event {event['event_id']:>30}")
        return []


def run_big(tmp_path: Path) -> Any:
    from sparkpoint import FileSink, GeneratorSource, StreamExecutionEnvironment

    from .operator_state_jobs import _options

    options = replace(
        _options(tmp_path, "big", 2),
        restart_strategy={"restart-strategy.type": "none"},
        events_log=str(tmp_path / "events.jsonl"),
    )
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(GeneratorSource(events=EVENTS, apps=5, rate=0), uid="events")
        .flat_map(Hoarder(), uid="hoarder")
        .sink_to(FileSink(str(tmp_path / "big-out")), uid="sink")
    )
    return env.execute("big", in_process=True)


# ----------------------------------------------------------------------------- on Spark
@pytest.mark.spark
def test_on_spark_a_buffering_function_is_exactly_once_after_a_failure(
    spark: Any, tmp_path: Path
) -> None:
    failure = FailureInjection("source", subtask=1, offset=3_500)
    result, out = run_batcher(spark, tmp_path, "spark-batcher", failure)
    assert result.status is JobStatus.FINISHED and len(result.restores) == 1
    assert line_counts(out) == expected_batches()


@pytest.mark.spark
def test_on_spark_a_keyed_functions_operator_state_survives_a_failure(
    spark: Any, tmp_path: Path
) -> None:
    failure = FailureInjection("keyed", subtask=1, records=300, at_epoch=3)
    result, out = run_tally(spark, tmp_path, "spark-tally", failure=failure)
    assert result.status is JobStatus.FINISHED and len(result.restores) == 1
    assert sum(last_counts(line_counts(out), 2).values()) == EVENTS
