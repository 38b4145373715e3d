"""Operators run through Spark with an injected failure.

``map_batch`` had no such test, and ``flat_map``, ``filter`` and a keyed ``reduce`` ran only
inside larger jobs (an operator-state flat_map, the keyed stages' filter, the Redis-to-SQL
example's reduce, which needs Redis and PostgreSQL). They run here in one small job: source ->
map_batch -> flat_map -> filter -> key_by -> reduce -> file sink, failure-free, after a
mid-epoch failure at the reduce and after the sink pre-committed, against a plain-Python oracle.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparkpoint.connectors.sinks import FileSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.protocol import JobStatus
from sparkpoint.records import Batch
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection, ListSource, line_counts

from .keyed_stages_job import restored_before_failure
from .pv_harness import drive, hidden_files, job_options

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
