"""Broadcast state, end to end: the broadcast-rules example (rules broadcast to events keyed
by user) is exactly-once after a failure at each point the other suites inject, restores its
broadcast state at another parallelism, and shows it in checkpoints and ``savepoint inspect``.

The runs are in process (the same tasks without Spark); one run with a failure goes through
Spark.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from examples import broadcast_rules
from sparkpoint import (
    FileSink,
    KeyedBroadcastContext,
    KeyedBroadcastProcessFunction,
    KeyedReadOnlyContext,
    StreamExecutionEnvironment,
    ValueStateDescriptor,
)
from sparkpoint.errors import ConfigurationError
from sparkpoint.options import JobOptions
from sparkpoint.protocol import JobStatus
from sparkpoint.runtime.driver import JobFailedError
from sparkpoint.savepoint_tool import inspect_savepoint, render_text
from sparkpoint.testing import FailureInjection, ListSource

from .broadcast_job import (
    CATEGORIES,
    VERTEX,
    Output,
    broadcast_entries,
    committed,
    committed_by,
    oracle,
    run_rules,
)
from .keyed_stages_job import restored_before_failure
from .pv_harness import IN_PROCESS, completed_checkpoint_dirs, hidden_files


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Output]:
    """A failure-free run (in process): its base directory and committed output."""
    base = tmp_path_factory.mktemp("bcast")
    result, out = run_rules(IN_PROCESS, base, "clean")
    assert result.status is JobStatus.FINISHED and result.restores == []
    assert len(result.completed_checkpoints) >= 10
    return base, committed(out)


def test_a_failure_free_run_commits_every_event_once_as_the_oracle_computes(
    clean: tuple[Path, Output],
) -> None:
    assert clean[1] == oracle()


def test_every_subtask_holds_every_rule_and_events_wait_in_keyed_state(
    clean: tuple[Path, Output],
) -> None:
    """Each rule reaches both subtasks (not one by key group); early checkpoints hold events
    that wait for their rule, so the run exercises both ways out of ``process_element``."""
    checkpoints = completed_checkpoint_dirs(clean[0], "clean", "bcast")
    held = [broadcast_entries(c) for c in checkpoints]
    assert all(h[0] == h[1] for h in held), held  # both subtasks hold every rule
    rules = [h[0] for h in held]
    # A checkpoint per epoch, with the rules read so far: 100 in the first epoch, 200 in each
    # after it. The first epoch carries no barrier when it was planned within the 1 ms
    # interval of the job's start (a fast start), so the counts begin at 100 or at 300.
    growing = [n for n in rules if n < CATEGORIES]
    assert growing in ([100, 300, 500], [300, 500]), rules
    assert rules[len(growing) :][:2] == [CATEGORIES, CATEGORIES], rules
    summary = inspect_savepoint(str(checkpoints[rules.index(300)]))
    waiting = [
        (h.operator_id, state.entries)
        for h in summary.handles
        for state in h.states
        if state.name == "waiting"
    ]
    assert [op for op, _ in waiting] == [VERTEX, VERTEX]
    assert all(entries > 0 for _, entries in waiting), waiting
    assert [s for s in summary.operator_state if s[0] == VERTEX] == [
        (VERTEX, 0, VERTEX, "rules", "broadcast", 300),
        (VERTEX, 1, VERTEX, "rules", "broadcast", 300),
    ]
    # The copies count in the subtasks' sizes, beside the keyed state's handle.
    meta = json.loads((checkpoints[1] / "_metadata").read_text())
    for ack in (a for a in meta["acks"] if a["operator_id"] == VERTEX):
        inline = sum(len(s["data"]) for s in ack["operator_state"])
        assert inline > 0
        assert ack["checkpointed_size"] == sum(h["size"] for h in ack["handles"]) + inline
    text = render_text(summary)
    assert (
        "operator apply-rules, subtask 1: operator state of apply-rules, "
        "broadcast state 'rules', 300 entries"
    ) in text


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            FailureInjection("keyed", subtask=1, records=100, at_epoch=6, vertex=VERTEX),
            id="mid-epoch",
        ),
        pytest.param(
            FailureInjection("alignment", subtask=0, checkpoint_id=3, vertex=VERTEX),
            id="during-alignment-at-the-broadcast-vertex",
        ),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=1, checkpoint_id=5, vertex=VERTEX),
            id="after-pre-commit",
        ),
    ],
)
def test_the_example_is_exactly_once_after_a_failure(
    tmp_path: Path, clean: tuple[Path, Output], failure: FailureInjection
) -> None:
    result, out = run_rules(IN_PROCESS, tmp_path, "failed", failure)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2
    restored = restored_before_failure(result)
    assert restored is not None and restored >= 2  # broadcast state was in it
    if failure.checkpoint_id:
        assert restored == failure.checkpoint_id - 1
    assert result.restores == [restored]
    assert committed(out) == clean[1] == oracle()
    assert hidden_files(out) == []


@pytest.mark.parametrize("parallelism", [3, 1])
def test_a_restore_at_another_parallelism_gives_every_subtask_a_copy_of_the_rules(
    tmp_path: Path, clean: tuple[Path, Output], parallelism: int
) -> None:
    """From a checkpoint taken at parallelism 2 after every rule came (no rule comes after
    it): at 3, subtask 2 gets subtask 0's copy; at 1, subtask 0's. The run commits exactly
    what the clean run had not committed by that checkpoint (the checkpoint's own
    transactions are committed in the clean run's output, where their parts are)."""
    base = clean[0]
    checkpoints = completed_checkpoint_dirs(base, "clean", "bcast")
    middle = len(checkpoints) // 2
    assert broadcast_entries(checkpoints[middle]) == {0: CATEGORIES, 1: CATEGORIES}
    clean_out = str(base / "clean" / "out")
    before = committed_by(clean_out, checkpoints[: middle + 1])
    assert 0 < len(before) < len(oracle())
    name = f"to-{parallelism}"
    result, out = run_rules(
        IN_PROCESS,
        tmp_path,
        name,
        parallelism=parallelism,
        out=str(tmp_path / "out"),
        from_checkpoint=f"file://{checkpoints[middle]}",
    )
    assert result.status is JobStatus.FINISHED
    assert sorted(before + committed(out)) == oracle()
    first = completed_checkpoint_dirs(tmp_path, name, "bcast")[0]
    assert broadcast_entries(first) == dict.fromkeys(range(parallelism), CATEGORIES)


def test_broadcast_state_of_a_function_the_job_lacks_is_refused_unless_allowed(
    tmp_path: Path, clean: tuple[Path, Output]
) -> None:
    base = clean[0]
    checkpoints = completed_checkpoint_dirs(base, "clean", "bcast")
    meta = json.loads((checkpoints[4] / "_metadata").read_text())
    for ack in meta["acks"]:
        for state in ack["operator_state"]:
            state["function"] = "old-rules"
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for f in checkpoints[4].iterdir():
        (renamed / f.name).write_bytes(f.read_bytes())
    (renamed / "_metadata").write_text(json.dumps(meta))
    with pytest.raises(ConfigurationError, match=r"operator state of functions \['old-rules'\]"):
        run_rules(IN_PROCESS, tmp_path, "refused", from_checkpoint=f"file://{renamed}")
    result, _ = run_rules(
        IN_PROCESS,
        tmp_path,
        "allowed",
        out=str(tmp_path / "out"),
        from_checkpoint=f"file://{renamed}",
        allow_non_restored_state=True,
    )
    assert result.status is JobStatus.FINISHED
    # The rules were dropped with the state and none comes after the checkpoint.
    first = completed_checkpoint_dirs(tmp_path, "allowed", "bcast")[0]
    assert broadcast_entries(first) == {0: 0, 1: 0}


class WritesInProcessElement(broadcast_rules.ApplyRules):
    """Puts into the broadcast state where it is read-only."""

    def process_element(self, value: Any, ctx: KeyedReadOnlyContext) -> Any:
        ctx.get_broadcast_state(broadcast_rules.RULES).put(value[2], 1.0)
        return ()


class ReadsKeyedStateForNoKey(broadcast_rules.ApplyRules):
    """Reads keyed state directly in process_broadcast_element, where there is no key."""

    def process_broadcast_element(self, value: Any, ctx: KeyedBroadcastContext) -> Any:
        return self.waiting.get()


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (WritesInProcessElement(), "broadcast state 'rules' is read-only in process_element"),
        (ReadsKeyedStateForNoKey(), "keyed state 'waiting' was accessed with no current key"),
    ],
    ids=["write-in-process-element", "keyed-state-without-key"],
)
def test_a_function_that_misuses_the_state_fails_the_job_naming_it(
    tmp_path: Path, fn: Any, message: str
) -> None:
    options = JobOptions(
        job_id="misuse",
        local_dir=str(tmp_path / "local"),
        restart_strategy={"restart-strategy.type": "none"},
    )
    env = StreamExecutionEnvironment(options)
    events = env.from_source(ListSource(broadcast_rules.events(50, 5, 4)), uid="events")
    rules = env.from_source(ListSource(broadcast_rules.rules(4)), uid="rules")
    (
        events.key_by(broadcast_rules.user_of)
        .connect(rules.broadcast(broadcast_rules.RULES))
        .process(fn, uid=VERTEX)
        .sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    )
    with pytest.raises(JobFailedError, match=message):
        env.execute("misuse", in_process=True)


def test_the_example_builds_from_its_own_arguments(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = StreamExecutionEnvironment(JobOptions(job_id="args", local_dir=str(tmp_path / "l")))
    argv = ["--events", "300", "--users", "7", "--categories", "5", "--output", str(out)]
    broadcast_rules.build(env, argv)
    assert env.execute("broadcast-rules", in_process=True).status is JobStatus.FINISHED
    assert committed(str(out)) == broadcast_rules.oracle(300, 7, 5)


@pytest.mark.spark
def test_on_spark_the_example_is_exactly_once_after_a_failure_during_alignment(
    spark: Any, tmp_path: Path
) -> None:
    failure = FailureInjection("alignment", subtask=1, checkpoint_id=3, vertex=VERTEX)
    result, out = run_rules(spark, tmp_path, "spark", failure)
    assert result.status is JobStatus.FINISHED
    assert result.restores == [2]
    assert committed(out) == oracle()
    assert hidden_files(out) == []


def _stamp(record: Any) -> int:
    return int(record[0]) * 10


class RemindPerCategory(KeyedBroadcastProcessFunction):
    """Per user: a timer 100 ms of event time after each event; when it fires, the user's
    event count so far with the broadcast rate of category 0."""

    def open(self, ctx: KeyedReadOnlyContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", 0))

    def process_element(self, value: Any, ctx: KeyedReadOnlyContext) -> Any:
        self.count.update(self.count.value() + 1)
        assert ctx.timestamp is not None
        ctx.timer_service().register_event_time_timer(ctx.timestamp + 100)
        return ()

    def process_broadcast_element(self, value: Any, ctx: KeyedBroadcastContext) -> Any:
        ctx.get_broadcast_state(broadcast_rules.RULES).put(*value)
        return ()

    def on_timer(self, timestamp: int, ctx: KeyedReadOnlyContext) -> Any:
        rate = ctx.get_broadcast_state(broadcast_rules.RULES).get(0)
        yield (ctx.current_key, timestamp, self.count.value(), rate)


def test_event_time_timers_fire_when_both_inputs_carry_watermarks(tmp_path: Path) -> None:
    """The keyed vertex's watermark is the minimum over the channels of both inputs (as in
    Flink, a broadcast input without watermarks would hold it back); the keyed input's
    records carry their timestamps."""
    options = JobOptions(job_id="timers", local_dir=str(tmp_path / "local"))
    env = StreamExecutionEnvironment(options)
    events = env.from_source(ListSource(broadcast_rules.events(40, 4, 2)), uid="events")
    rules = env.from_source(ListSource(broadcast_rules.rules(2)), uid="rules")
    (
        events.assign_timestamps_and_watermarks(_stamp, 0, uid="event-time")
        .key_by(broadcast_rules.user_of)
        .connect(
            rules.assign_timestamps_and_watermarks(lambda r: 0, 0, uid="rule-time").broadcast(
                broadcast_rules.RULES
            )
        )
        .process(RemindPerCategory(), uid=VERTEX)
        .sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    )
    assert env.execute("timers", in_process=True).status is JobStatus.FINISHED
    got = committed(str(tmp_path / "out"))
    users = [e[1] for e in broadcast_rules.events(40, 4, 2)]
    assert sorted(set(users)) == [0, 1, 2, 3]
    # One timer per distinct timestamp + 100 per user; the count is the user's events up to
    # the watermark that fired it (all of them: the bounded splits end event time at once).
    assert {(u, t) for u, t, _, _ in got} == {
        (e[1], _stamp(e) + 100) for e in broadcast_rules.events(40, 4, 2)
    }
    assert all(rate == 0.5 for *_, rate in got)
