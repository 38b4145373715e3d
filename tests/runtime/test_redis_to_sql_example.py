"""The Redis -> SQL example (``jobs/examples/redis_to_sql.py``) on Spark and PostgreSQL.

Orders in a real Redis stream go through enrich -> per-user total -> re-key -> per-region
total into an upsert table and a two-phase-commit table. After failures at the second keyed
stage (mid-epoch and during its alignment) and after a pre-commit, what the database holds
equals what a plain-Python pass over the stream says: each user's total, and for each region
exactly one committed row per order (its last one the region's total), nothing twice.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from examples import redis_to_sql
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sql_sink import COMMITS_SUFFIX, STAGED_SUFFIX, dispose_engines
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.testing import FailureInjection

from ..support.redis_server import REDIS_URL
from .pv_harness import drive

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

PG_URL = os.environ.get(
    "SPARKPOINT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ORDERS = 2_400
USERS = 40


@pytest.fixture
def stream() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    key = f"orders-{uuid.uuid4().hex[:10]}"
    pipe = client.pipeline()
    for i in range(ORDERS):
        pipe.xadd(key, {"user": f"user-{(i * 7919) % USERS}", "amount": str(1 + i % 13)})
    pipe.execute()
    yield key
    client.delete(key, f"{key}:anchors")
    for k in client.scan_iter(f"{key}*"):
        client.delete(k)
    client.close()


def _oracle(key: str) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """Per user its total; per region (orders, total), from the stream itself."""
    client = redis.Redis.from_url(REDIS_URL)
    users: Counter[str] = Counter()
    regions: dict[str, tuple[int, int]] = {}
    for _, fields in client.xrange(key):
        user, amount = fields[b"user"].decode(), int(fields[b"amount"])
        users[user] += amount
        n, total = regions.get(redis_to_sql.region_of(user), (0, 0))
        regions[redis_to_sql.region_of(user)] = (n + 1, total + amount)
    client.close()
    return dict(users), regions


def _run(spark: Any, base: Path, key: str, prefix: str, failure: FailureInjection | None) -> Any:
    env = StreamExecutionEnvironment(
        JobOptions(
            job_id=f"{prefix}job",
            checkpoint=CheckpointConfig(interval_ms=1),  # one per epoch: the failures land
            checkpoint_dir=f"file://{base / 'chk'}",
            checkpoint_storage="filesystem",
            local_dir=str(base / "local"),
            max_epoch_records=200,  # per split: about six epochs
            min_epoch_records=100,
            restart_strategy={
                "restart-strategy.type": "fixed-delay",
                "restart-strategy.fixed-delay.delay": "0 ms",
            },
        )
    )
    args = [
        *("--redis", REDIS_URL, "--stream", key, "--until-id", "$"),
        *("--database", PG_URL, "--table-prefix", prefix, "--group", prefix),
    ]
    redis_to_sql.build(env, args)
    env.graph.name = "redis-to-sql"
    return drive(env.graph, env.options, spark, failure)


def _tables(prefix: str) -> tuple[dict[str, int], dict[str, list[int]]]:
    engine = sa.create_engine(PG_URL)
    with engine.connect() as conn:
        users = conn.exec_driver_sql(f'SELECT "user", user_total FROM {prefix}user_totals')
        user_totals = {u: int(t) for u, t in users}
        rows = conn.exec_driver_sql(f"SELECT region, region_total FROM {prefix}region_updates")
        regions: dict[str, list[int]] = {}
        for region, total in rows:
            regions.setdefault(region, []).append(int(total))
    engine.dispose()
    return user_totals, regions


def _drop(prefix: str) -> None:
    dispose_engines()
    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        for table in ("user_totals", "region_updates"):
            for suffix in ("", STAGED_SUFFIX, COMMITS_SUFFIX):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {prefix}{table}{suffix}")
    engine.dispose()


FAILURES = {
    "mid-epoch-second-stage": FailureInjection(
        "keyed", subtask=1, records=40, at_epoch=3, vertex="per-region"
    ),
    "during-alignment-second-stage": FailureInjection(
        "alignment", subtask=0, checkpoint_id=2, vertex="per-region"
    ),
    "after-pre-commit": FailureInjection("after_pre_commit", subtask=0, checkpoint_id=3),
}


def test_redis_to_sql_on_spark_commits_what_the_stream_implies(
    spark: Any, tmp_path: Path, stream: str
) -> None:
    check(spark, tmp_path, stream, None)


@pytest.mark.parametrize("name", list(FAILURES))
def test_redis_to_sql_commits_what_the_stream_implies_after_a_failure(
    engine: Any, tmp_path: Path, stream: str, name: str
) -> None:
    check(engine, tmp_path, stream, FAILURES[name])


def check(spark: Any, tmp_path: Path, stream: str, failure: FailureInjection | None) -> None:
    """Run the example on ``spark`` (or in process); its tables must be what the stream
    implies: every user's total, and one running total per order of each region."""
    prefix = f"sp_r2s_{uuid.uuid4().hex[:8]}_"
    try:
        result = _run(spark, tmp_path, stream, prefix, failure)
        assert len(result.restores) == (0 if failure is None else 1)
        users, regions = _oracle(stream)
        user_totals, region_rows = _tables(prefix)
        assert user_totals == users
        assert set(region_rows) == set(regions)
        for region, (orders, total) in regions.items():
            rows = region_rows[region]
            assert len(rows) == orders, f"{region}: {len(rows)} rows for {orders} orders"
            assert max(rows) == total and len(set(rows)) == orders  # running totals, no repeat
    finally:
        _drop(prefix)
