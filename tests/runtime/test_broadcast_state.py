"""Broadcast state and the broadcast pattern's graph: redistribution (Flink's ``i mod old``),
the read-only view, the operator state store's broadcast mode, and the configuration errors of
``broadcast`` / ``connect`` / ``process``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from examples.broadcast_rules import RULES, ApplyRules, rules, user_of
from sparkpoint import (
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    OutputTag,
    ReadOnlyBroadcastStateError,
    StreamExecutionEnvironment,
    ValueStateDescriptor,
)
from sparkpoint.broadcast import BroadcastProcessOperator
from sparkpoint.broadcast_state import BroadcastState
from sparkpoint.errors import ConfigurationError
from sparkpoint.graph import DataStream
from sparkpoint.job_graph import checkpointed_functions
from sparkpoint.operator_state import OperatorStateStore, redistribute
from sparkpoint.options import JobOptions
from sparkpoint.records import Batch
from sparkpoint.state.backend import KeyedStateBackend
from sparkpoint.state.backends import create_backend
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.testing import ListSource
from sparkpoint.watermarks import MIN_WATERMARK


# ----------------------------------------------------------------------------- the state
def test_a_new_subtask_gets_the_copy_of_old_subtask_i_mod_the_old_parallelism() -> None:
    copies = [(1, "broadcast", [("b", 2)]), (0, "broadcast", [("a", 1)])]  # copies differ here
    assert [redistribute(copies, i, 2, 2)[1] for i in range(2)] == [[("a", 1)], [("b", 2)]]
    assert [redistribute(copies, i, 3, 2)[1] for i in range(3)] == [
        [("a", 1)],
        [("b", 2)],
        [("a", 1)],
    ]
    assert [redistribute(copies, i, 1, 2) for i in range(1)] == [("broadcast", [("a", 1)])]


def test_the_store_keeps_a_broadcast_state_as_its_entries_and_restores_it() -> None:
    store = OperatorStateStore({"rules": ("broadcast", [(1, 0.5), (2, 0.75)])})
    state = store.get_broadcast_state(MapStateDescriptor("rules"))
    assert state.items() == [(1, 0.5), (2, 0.75)]
    assert store.get_broadcast_state("rules") is state
    state.put(3, 1.0)
    state.remove(1)
    state.remove(42)  # absent: nothing happens
    assert store.lists() == {"rules": ("broadcast", [(2, 0.75), (3, 1.0)])}
    with pytest.raises(ConfigurationError, match="'rules' is a broadcast state, asked for as"):
        store.get_list_state("rules")
    with pytest.raises(ConfigurationError, match="'rules' was checkpointed as a broadcast state"):
        OperatorStateStore({"rules": ("broadcast", [])}).get_union_list_state("rules")


def test_the_read_only_view_reads_the_same_entries_and_refuses_every_write() -> None:
    state = BroadcastState("rules", {})
    view = state.read_only()
    state.put("a", 1)
    assert (view.get("a"), view.get("b"), view.contains("a"), view.keys()) == (1, None, True, ["a"])
    assert view.items() == [("a", 1)] and len(view) == 1 and not view.is_empty()
    for write in (
        lambda: view.put("b", 2),
        lambda: view.put_all({"b": 2}),
        lambda: view.remove("a"),
        lambda: view.clear(),
    ):
        with pytest.raises(ReadOnlyBroadcastStateError, match="'rules' is read-only"):
            write()
    assert state.items() == [("a", 1)]
    state.clear()
    assert view.is_empty()


# ----------------------------------------------------------------------------- the graph
def _env(tmp_path: Path) -> tuple[StreamExecutionEnvironment, DataStream, DataStream]:
    env = StreamExecutionEnvironment(JobOptions(job_id="g", parallelism=3))
    events = env.from_source(ListSource(((0, 1, 0, 5),), splits=3), uid="events")
    rule_stream = env.from_source(ListSource(rules(4), splits=2), uid="rules")
    return env, events, rule_stream


def test_connect_makes_one_keyed_vertex_whose_last_input_is_broadcast(tmp_path: Path) -> None:
    env, events, rule_stream = _env(tmp_path)
    events.key_by(user_of).connect(rule_stream.broadcast(RULES)).process(
        ApplyRules(), uid="apply-rules"
    )
    graph = env.graph
    vertex = graph.keyed_vertices[0]
    assert vertex.inputs == ("events", "rules")
    assert vertex.broadcast_inputs == ("rules",)
    assert graph.channels(vertex) == 5  # barriers align over 3 keyed + 2 broadcast channels
    assert graph.edges() == [("events", "apply-rules"), ("rules", "apply-rules")]
    # The operator is the checkpointed function of its broadcast state.
    assert list(checkpointed_functions(vertex)) == ["apply-rules"]
    assert graph.function_uids() == {"apply-rules"}


def test_broadcast_and_connect_refuse_what_they_cannot_run(tmp_path: Path) -> None:
    _, events, rule_stream = _env(tmp_path)
    with pytest.raises(ConfigurationError, match="needs at least one MapStateDescriptor"):
        rule_stream.broadcast()
    with pytest.raises(ConfigurationError, match="described by a MapStateDescriptor, got List"):
        rule_stream.broadcast(ListStateDescriptor("rules"))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="'rules' is described twice"):
        rule_stream.broadcast(RULES, MapStateDescriptor("rules"))
    broadcast = rule_stream.broadcast(RULES, MapStateDescriptor("limits"))
    with pytest.raises(ConfigurationError, match="non-keyed broadcast function is not supported"):
        events.connect(broadcast)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="a keyed stream connects a broadcast stream"):
        events.key_by(user_of).connect(rule_stream)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="both keyed and broadcast into one operator"):
        rule_stream.key_by(user_of).connect(broadcast)
    connected = events.key_by(user_of).connect(broadcast)
    plain: Any = KeyedProcessFunction()
    with pytest.raises(ConfigurationError, match="processed by a KeyedBroadcastProcessFunction"):
        connected.process(plain, uid="wrong")
    connected.process(ApplyRules(), uid="apply-rules")
    with pytest.raises(ConfigurationError, match="'rules' is keyed twice"):
        rule_stream.broadcast(RULES)


def _opened(
    fn: KeyedBroadcastProcessFunction, tmp_path: Path, backend_name: str = "hashmap"
) -> tuple[BroadcastProcessOperator, KeyedStateBackend]:
    """The operator of ``fn`` opened on an empty backend of all key groups (no Spark)."""
    op = BroadcastProcessOperator("op", user_of, fn, (RULES,), keyed_inputs=1)
    backend = create_backend(backend_name, 128, KeyGroupRange(0, 127), local_dir=str(tmp_path))
    op.open(backend)
    return op, backend


class Unknown(KeyedBroadcastProcessFunction):
    def process_element(self, value: Any, ctx: Any) -> Any:
        return [ctx.get_broadcast_state(MapStateDescriptor("limits")).get(1)]


def test_a_broadcast_state_the_stream_does_not_declare_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    op, backend = _opened(Unknown(), tmp_path)
    with pytest.raises(ConfigurationError, match=r"no broadcast state named 'limits'.*\['rules'\]"):
        op.process_input(0, Batch.of_rows([(0, 1, 0, 5)]), backend)


@pytest.mark.parametrize("backend_name", ["hashmap", "rocksdb"])
def test_apply_to_keyed_state_visits_every_key_with_that_state_in_key_order(
    tmp_path: Path, backend_name: str
) -> None:
    seen = ValueStateDescriptor("seen", 0)

    class Count(KeyedBroadcastProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            state = ctx.get_state(seen)
            state.update(state.value() + 1)
            return ()

        def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
            def visit(key: Any, state: Any) -> list[Any]:
                state.update(state.value() * 10)
                return [(value, key, state.value())]

            return ctx.apply_to_keyed_state(seen, visit)

    op, backend = _opened(Count(), tmp_path, backend_name)
    op.process_input(0, Batch.of_rows([(0, 7, 0, 1), (1, 3, 0, 1), (2, 7, 0, 1)]), backend)
    out = op.process_input(1, Batch.of_rows(["x", "y"]), backend)
    assert out.rows == [("x", 3, 10), ("x", 7, 20), ("y", 3, 100), ("y", 7, 200)]


def test_both_contexts_emit_side_outputs_beside_the_records(tmp_path: Path) -> None:
    tag = OutputTag("audit")

    class Audit(KeyedBroadcastProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            ctx.output(tag, ("event", value[0]))
            return [value[0]]

        def process_broadcast_element(self, value: Any, ctx: Any) -> Any:
            ctx.output(tag, ("rule", value[0], ctx.timestamp, ctx.current_watermark))
            ctx.get_broadcast_state(RULES).put(*value)
            return None  # nothing to emit

    op, backend = _opened(Audit(), tmp_path)
    assert op.process_input(1, Batch.of_rows([(3, 0.5)]), backend).rows == []
    assert op.process_input(0, Batch.of_rows([(9, 1, 3, 5)]), backend).rows == [9]
    assert {k: b.rows for k, b in op.take_side_outputs().items()} == {
        "audit": [("rule", 3, None, MIN_WATERMARK), ("event", 9)]
    }
    assert op.take_side_outputs() == {}
