"""The broadcast-rules example (``jobs/examples/broadcast_rules.py``) for the broadcast-state
tests: how to run it, and what it committed read back as the oracle gives it.

Sizes: 4,500 events in 3 splits and 600 rules in 2 splits, 100 records per split and epoch:
the rules come in epochs 1 to 3 (each subtask's broadcast state has 100, 300, 500, then 600
entries at checkpoints 1 to 4), the events in 15 epochs; events of a category whose rule has
not come yet wait in keyed state, so both kinds of state are in every early checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from examples import broadcast_rules
from sparkpoint import FileSink, StreamExecutionEnvironment
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection, committed_lines

from .pv_harness import drive, job_options

EVENTS, USERS, CATEGORIES = 4_500, 300, 600
EPOCH_RECORDS = 100
VERTEX = "apply-rules"

Output = list[tuple[int, int, float]]


def run_rules(
    spark: Any,
    base: Path,
    name: str,
    failure: FailureInjection | None = None,
    parallelism: int = 2,
    out: str | None = None,
    **more: Any,
) -> tuple[JobResult, str]:
    """Run the example (on ``spark``, or in process given ``IN_PROCESS``) under
    ``<base>/<name>``, job id ``bcast-<name>``, every checkpoint retained."""
    out = out or str(base / name / "out")
    options = job_options(
        f"bcast-{name}",
        base,
        name,
        epoch_records=EPOCH_RECORDS,
        parallelism=parallelism,
        retained=100,
        **more,
    )
    env = StreamExecutionEnvironment(options)
    broadcast_rules.build_job(env, EVENTS, USERS, CATEGORIES, out)
    env.graph.name = "broadcast-rules"
    return drive(env.graph, options, spark, failure), out


def oracle() -> Output:
    return broadcast_rules.oracle(EVENTS, USERS, CATEGORIES)


def committed(out: str) -> Output:
    """The committed records, sorted (duplicates kept: an event twice is an error)."""
    return sorted(tuple(json.loads(line)) for line in committed_lines(out))  # type: ignore[misc]


def _parts(checkpoint: Path) -> list[str]:
    meta = json.loads((checkpoint / "_metadata").read_text())
    return [
        part for ack in meta["acks"] for txn in ack["sink_transactions"] for part in txn["parts"]
    ]


def committed_by(out: str, checkpoints: list[Path]) -> Output:
    """The records of ``out`` that the sink transactions of ``checkpoints`` committed (the
    output up to the last of them), sorted."""
    parts = {part for chk in checkpoints for part in _parts(chk)}
    lines = []
    for part in parts:
        lines.extend((Path(out) / FileSink.committed_name(part)).read_text().splitlines())
    return sorted(tuple(json.loads(line)) for line in lines)  # type: ignore[misc]


def broadcast_entries(checkpoint: Path) -> dict[int, int]:
    """Each subtask's number of entries of broadcast state ``rules`` in ``checkpoint``."""
    meta = json.loads((checkpoint / "_metadata").read_text())
    return {
        s["subtask"]: s["values"]
        for ack in meta["acks"]
        for s in ack["operator_state"]
        if s["function"] == VERTEX and s["name"] == "rules" and s["mode"] == "broadcast"
    }
