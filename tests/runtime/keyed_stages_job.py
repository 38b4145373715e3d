"""A two-stage keyed job for the chained-keyed-stage tests: count per user, keep every third
update, re-key by region, count per region; and its plain-Python oracle."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection, ListSource

from .pv_harness import drive

USERS = 13
REGIONS = 3
EVERY = 3  # stage 1 passes on every third update of a user
EVENTS = 6_000  # 3,000 per split
EPOCH_RECORDS = 500  # per split: 6 epochs, a checkpoint in each


def run_stages(
    spark: Any,
    base: Path,
    name: str,
    failure: FailureInjection | None = None,
    clicks: tuple[Any, ...] | None = None,
    more_sinks: bool = False,
    failover_strategy: str = "region",
) -> tuple[JobResult, str]:
    """Run the job on Spark, or in this process given ``IN_PROCESS`` (with ``clicks``: the
    union of two sources; ``more_sinks``: three sinks, under ``<base>/<name>/more``); returns
    its result and output directory."""
    out = str(base / name / "out")
    options = JobOptions(
        job_id=f"stages-{name}",
        checkpoint=CheckpointConfig(mode=CheckpointingMode.EXACTLY_ONCE, interval_ms=1),
        checkpoint_dir=f"file://{base / name / 'chk'}",
        local_dir=str(base / name / "local"),
        parallelism=2,
        max_epoch_records=EPOCH_RECORDS,
        min_epoch_records=EPOCH_RECORDS,
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": "2",
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
        failover_strategy=failover_strategy,
    )
    env = StreamExecutionEnvironment(options)
    more = str(base / name / "more") if more_sinks else None
    build(env, events(EVENTS), out, clicks, more)
    env.graph.name = "user-region-count"
    return drive(env.graph, options, spark, failure), out


def restored_before_failure(result: JobResult) -> int | None:
    """The id of the last checkpoint that completed before the first task failure."""
    assert result.events is not None
    latest = None
    for env in result.events.events:
        if env.type == "checkpoint_completed":
            latest = env.payload["checkpoint_id"]
        if env.type == "task_failed":
            return latest
    raise AssertionError("the job never failed")


def region_of(user: str) -> str:
    return f"r{int(user[1:]) % REGIONS}"


def events(n: int) -> tuple[dict[str, Any], ...]:
    """``n`` events over :data:`USERS` users, in a fixed, uneven order."""
    return tuple({"user": f"u{(i * 7 + i // 5) % USERS}"} for i in range(n))


def clicks(n: int) -> tuple[dict[str, Any], ...]:
    """``n`` clicks over the same users, in another order (the second source of a union)."""
    return tuple({"user": f"u{(i * 5 + 3) % USERS}"} for i in range(n))


def build(
    env: StreamExecutionEnvironment,
    records: tuple[Any, ...],
    out: str,
    clicks: tuple[Any, ...] | None = None,
    more_sinks: str | None = None,
) -> None:
    """source -> count per user (stage 1) -> every third update -> region -> count per
    region (stage 2) -> file sink. With ``clicks``: a second source of 3 splits, united with
    the first before stage 1. With ``more_sinks`` (a directory): stage 1's output also goes
    to ``<more_sinks>/users`` and stage 2's to ``<more_sinks>/copy`` (three sinks)."""
    stream: Any = env.from_source(ListSource(records, splits=2), uid="events")
    if clicks is not None:
        stream = stream.union(env.from_source(ListSource(clicks, splits=3), uid="clicks"))
    first = (
        stream.key_by("user")
        .count(uid="per-user", output="n")
        .filter(lambda r: r["n"] % EVERY == 0, uid="every-third")
        .map(lambda r: {"region": region_of(r["user"]), "n": r["n"]}, uid="to-region")
    )
    if more_sinks is not None:
        first.sink_to(FileSink(f"{more_sinks}/users"), uid="users-sink")
    second = first.key_by("region").count(uid="per-region", output="updates")
    second.sink_to(FileSink(out), uid="sink")
    if more_sinks is not None:
        second.sink_to(FileSink(f"{more_sinks}/copy"), uid="copy-sink")


def users_oracle(records: tuple[Any, ...]) -> Counter[str]:
    """What stage 1's sink must commit: every third update of every user, as its region."""
    per_user = Counter(r["user"] for r in records)
    return Counter(
        f'{{"region": "{region_of(user)}", "n": {k}}}'
        for user, n in per_user.items()
        for k in range(EVERY, n + 1, EVERY)
    )


def oracle(records: tuple[Any, ...]) -> Counter[str]:
    """What the job must commit, computed without Sparkpoint: per region, updates 1..m where m
    is the number of third updates of its users."""
    per_user = Counter(r["user"] for r in records)
    per_region: Counter[str] = Counter()
    for user, n in per_user.items():
        per_region[region_of(user)] += n // EVERY
    return Counter(
        f'{{"region": "{region}", "updates": {k}}}'
        for region, m in per_region.items()
        for k in range(1, m + 1)
    )
