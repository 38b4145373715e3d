"""Every public operator of the API runs through Spark with an injected failure.

The audit enumerates the public methods of every stream class of the API and requires, for
each operator, a test that runs it on Spark (the ``spark`` fixture, or ``engine``, whose spark
variant runs under ``make test-slow``) with a failure and compares the committed output with a
plain-Python expectation; a new operator without such a test fails it. Methods that are not
operators are listed apart, each with the reason.

``map_batch`` had no such test, and ``flat_map``, ``filter`` and a keyed ``reduce`` ran only
inside larger jobs (an operator-state flat_map, the keyed stages' filter, the Redis-to-SQL
example's reduce, which needs Redis and PostgreSQL). They run here in one small job: source ->
map_batch -> flat_map -> filter -> key_by -> reduce -> file sink, failure-free, after a
mid-epoch failure at the reduce and after the sink pre-committed, against a plain-Python oracle.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sparkpoint
from sparkpoint import graph as graph_module
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.protocol import JobStatus
from sparkpoint.records import Batch
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection, ListSource, line_counts

from .keyed_stages_job import restored_before_failure
from .pv_harness import drive, hidden_files, job_options

# ----------------------------------------------------------------------------- the audit

_R = "tests/runtime"
_STAGES = f"{_R}/test_keyed_stages_exactly_once.py::test_exactly_once_through_two_keyed_stages_after_a_failure"  # noqa: E501
_UNION = f"{_R}/test_union_exactly_once.py::test_exactly_once_for_a_union_after_a_failure"
_CONNECT = f"{_R}/test_connect.py::test_connect_is_exactly_once_after_a_failure"
_SIDE = f"{_R}/test_side_outputs.py::test_side_outputs_are_exactly_once_after_a_failure"
_BROADCAST = f"{_R}/test_broadcast_rules_example.py::test_on_spark_the_example_is_exactly_once_after_a_failure_during_alignment"  # noqa: E501
_WINDOW_FUNCTIONS = f"{_R}/test_window_functions_spark.py::test_window_functions_commit_the_oracle_with_and_without_a_failure"  # noqa: E501
_WINDOW_COUNT = f"{_R}/test_event_time_spark.py::test_tumbling_window_counts_are_exactly_once"
_PROCESS = f"{_R}/test_process_function.py::test_keyed_process_function_state_is_exactly_once"
_HERE = f"{_R}/test_operators_on_spark.py::test_stateless_operators_and_reduce_are_exactly_once_after_a_failure"  # noqa: E501

# "Class.method" -> a test that runs it on Spark with a failure against a plain-Python oracle.
SPARK_FAILURE_TESTS: dict[str, str] = {
    "StreamExecutionEnvironment.from_source": _STAGES,
    "DataStream.map": _STAGES,  # "to-region"
    "DataStream.filter": _HERE,  # also _STAGES ("every-third")
    "DataStream.flat_map": _HERE,
    "DataStream.map_batch": _HERE,
    "DataStream.assign_timestamps_and_watermarks": _WINDOW_FUNCTIONS,
    "DataStream.key_by": _STAGES,  # also behind a keyed vertex ("region")
    "DataStream.union": _UNION,
    "DataStream.broadcast": _BROADCAST,
    "DataStream.connect": _CONNECT,
    "DataStream.get_side_output": _SIDE,
    "DataStream.sink_to": _STAGES,
    "SideOutputStream.sink_to": _SIDE,
    "UnionStream.key_by": _UNION,
    "ConnectedStreams.key_by": _CONNECT,
    "ConnectedKeyedStreams.process": _CONNECT,
    "BroadcastConnectedStream.process": _BROADCAST,
    "KeyedStream.connect": _BROADCAST,
    "KeyedStream.count": _STAGES,  # "per-user" and "per-region"
    "KeyedStream.reduce": _HERE,
    "KeyedStream.process": _PROCESS,  # a plain KeyedProcessFunction; also _SIDE
    "KeyedStream.window": _WINDOW_FUNCTIONS,  # tumbling and sliding
    "WindowedStream.count": _WINDOW_COUNT,
    "WindowedStream.reduce": _WINDOW_FUNCTIONS,
    "WindowedStream.aggregate": _WINDOW_FUNCTIONS,
}

# Public methods that are not operators, and why no Spark failure test is asked of them.
NOT_OPERATORS: dict[str, str] = {
    "StreamExecutionEnvironment.from_args": "parses the command line; adds nothing to the graph",
    "StreamExecutionEnvironment.graph": "a property: the job graph built so far",
    "StreamExecutionEnvironment.execute": "runs the graph (the tests run it with JobDriver)",
}

# The stream classes of the API; the audit checks that none is missing from this list.
STREAM_CLASSES = (
    "StreamExecutionEnvironment",
    "DataStream",
    "KeyedStream",
    "WindowedStream",
    "UnionStream",
    "ConnectedStreams",
    "ConnectedKeyedStreams",
    "SideOutputStream",
    "BroadcastStream",
    "BroadcastConnectedStream",
)


def _public_methods() -> set[str]:
    found = set()
    for name in STREAM_CLASSES:
        cls = getattr(graph_module, name)
        for attr, value in vars(cls).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, property | classmethod | staticmethod) or inspect.isfunction(
                value
            ):
                found.add(f"{name}.{attr}")
    return found


def _test_function(node_id: str) -> Any:
    path, function = node_id.split("::")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return getattr(module, function)


def test_the_audit_lists_every_stream_class_of_the_api() -> None:
    api = set(graph_module.__all__) | set(sparkpoint.__all__)
    streams = {n for n in api if n.endswith(("Stream", "Streams"))}
    assert streams | {"StreamExecutionEnvironment"} == set(STREAM_CLASSES)
    broadcast = importlib.import_module("sparkpoint.broadcast")
    assert not [n for n in vars(broadcast) if n.endswith(("Stream", "Streams"))]


def test_every_public_operator_has_a_spark_failure_test() -> None:
    methods = _public_methods()
    assert set(SPARK_FAILURE_TESTS).isdisjoint(NOT_OPERATORS)
    assert methods - set(SPARK_FAILURE_TESTS) - set(NOT_OPERATORS) == set(), "no Spark test"
    assert set(SPARK_FAILURE_TESTS) | set(NOT_OPERATORS) == methods, "stale entries"


@pytest.mark.parametrize(
    "node_id",
    sorted(set(SPARK_FAILURE_TESTS.values())),
    ids=lambda node_id: Path(node_id.split("::")[0]).stem,
)
def test_each_listed_test_exists_and_runs_on_spark(node_id: str) -> None:
    fn = _test_function(node_id)
    assert callable(fn) and fn.__name__.startswith("test_")
    assert {"spark", "engine"} & set(inspect.signature(fn).parameters), node_id


# ----------------------------------------------------------------------------- the job

USERS = 10  # users u0, u2, ... come from split 0, u1, u3, ... from split 1
EVENTS = 3_000  # 1,500 per split
EPOCH_RECORDS = 250  # per split: 6 epochs, a checkpoint in each


def events(n: int) -> tuple[dict[str, Any], ...]:
    """``n`` events; each user's events are in one split (ListSource deals round-robin over
    two), so its records reach the reduce in source order and its running sums are fixed."""
    return tuple({"user": f"u{i % 2 + 2 * (i // 2 % (USERS // 2))}", "a": i % 17} for i in range(n))


def triple(batch: Batch) -> Batch:
    """map_batch: a vectorized function of the columns."""
    cols = batch.columns
    return Batch.of_columns(user=cols["user"], a=np.asarray(cols["a"]) * 3)


def split_even(record: dict[str, Any]) -> list[dict[str, Any]]:
    """flat_map: an even amount becomes two records (a and 1), an odd one stays."""
    if record["a"] % 2:
        return [record]
    return [record, {"user": record["user"], "a": 1}]


def not_fives(record: dict[str, Any]) -> bool:
    return record["a"] % 5 != 0


def add(acc: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """reduce: the user's running sum."""
    return {"user": acc["user"], "a": acc["a"] + record["a"]}


def oracle(records: tuple[dict[str, Any], ...]) -> Counter[str]:
    """The running value of every user after each of its records, in plain Python."""
    totals: dict[str, dict[str, Any]] = {}
    out: Counter[str] = Counter()
    for r in records:
        tripled = {"user": r["user"], "a": r["a"] * 3}
        for x in split_even(tripled):
            if not not_fives(x):
                continue
            acc = totals.get(x["user"])
            totals[x["user"]] = x if acc is None else add(acc, x)
            out[json.dumps(totals[x["user"]])] += 1
    return out


def run_chain(
    spark: Any, base: Path, name: str, failure: FailureInjection | None = None
) -> tuple[JobResult, str]:
    """Run the job on ``spark`` or in process; returns its result and output directory."""
    out = str(base / name / "out")
    options = job_options(f"chain-{name}", base, name, epoch_records=EPOCH_RECORDS)
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(ListSource(events(EVENTS), splits=2), uid="events")
        .map_batch(triple, uid="triple")
        .flat_map(split_even, uid="split-even")
        .filter(not_fives, uid="not-fives")
        .key_by("user")
        .reduce(add, uid="per-user")
        .sink_to(FileSink(out), uid="sink")
    )
    env.graph.name = "stateless-chain-reduce"
    return drive(env.graph, options, spark, failure), out


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    result, out = run_chain(spark, tmp_path_factory.mktemp("chain"), "baseline")
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    assert len(result.completed_checkpoints) >= 5
    assert hidden_files(out) == []
    return line_counts(out)


@pytest.mark.spark
def test_failure_free_chain_commits_what_the_oracle_computes(baseline: Counter[str]) -> None:
    expected = oracle(events(EVENTS))
    assert baseline == expected
    assert {json.loads(line)["user"] for line in baseline} == {f"u{i}" for i in range(USERS)}


@pytest.mark.spark
@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            FailureInjection("keyed", subtask=1, records=60, at_epoch=3, vertex="per-user"),
            id="mid-epoch-reduce",
        ),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=0, checkpoint_id=3),
            id="after-pre-commit",
        ),
    ],
)
def test_stateless_operators_and_reduce_are_exactly_once_after_a_failure(
    engine: Any, tmp_path: Path, baseline: Counter[str], failure: FailureInjection
) -> None:
    result, out = run_chain(engine, tmp_path, "failed", failure)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2
    restored = restored_before_failure(result)
    assert restored is not None
    if failure.checkpoint_id:
        assert restored == failure.checkpoint_id - 1
    assert result.restores == [restored]
    assert line_counts(out) == baseline == oracle(events(EVENTS))
    assert hidden_files(out) == []
