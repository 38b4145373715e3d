"""Orders from a Redis stream to PostgreSQL: enrich, per-user totals, re-key, per-region totals.

The pipeline of the seeds' end-to-end example: a Redis stream of orders (fields ``user`` and
``amount``) → enrich each with its user's region → a running total per user (keyed state) →
re-keyed by region → a running total per region (a second keyed stage, one more Spark
shuffle) → two sinks:

- ``user_totals``: an idempotent upsert table (one row per user, its latest total: a replay
  overwrites it with the same value);
- ``region_updates``: every per-region update, appended through the two-phase-commit SQL sink
  (exactly once: a region with n orders has exactly n rows, the last one its total).

    sparkpoint run jobs/examples/redis_to_sql.py --standalone --checkpoint-interval 1 \
        --checkpoint-dir file:///tmp/chk --redis redis://127.0.0.1:6379/0 --stream orders \
        --until-id '$' --database postgresql://127.0.0.1:5432/test

Redis is told what the job consumed (its consumer group moves) only once a checkpoint that
covers it completed. ``--until-id $`` reads what the stream holds when the job starts and ends;
without ``--until-id`` the job runs until stopped.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence
from typing import Any

import redis
from sqlalchemy import BigInteger, String

from sparkpoint import (
    ConfigurationError,
    RedisStreamSource,
    SqlSink,
    StreamExecutionEnvironment,
    UpsertSink,
)

REGIONS = ("emea", "amer", "apac")


def region_of(user: str) -> str:
    """The enrichment: a user's region (a stable lookup, as a dimension table would give)."""
    return REGIONS[zlib.crc32(user.encode()) % len(REGIONS)]


def enrich(order: dict[str, Any]) -> dict[str, Any]:
    """An order as the aggregates read it; both totals start at the order's amount."""
    amount = int(order["amount"])
    user = order["user"]
    return {
        "user": user,
        "region": region_of(user),
        "amount": amount,
        "user_total": amount,
        "region_total": amount,
    }


def add_to_user(total: dict[str, Any], order: dict[str, Any]) -> dict[str, Any]:
    """Per user: the newest order, with the user's running total."""
    return {**order, "user_total": total["user_total"] + order["amount"]}


def add_to_region(total: dict[str, Any], order: dict[str, Any]) -> dict[str, Any]:
    """Per region: the newest order, with the region's running total."""
    return {**order, "region_total": total["region_total"] + order["amount"]}


def newest_entry_id(url: str, stream: str) -> str:
    """The id of the newest entry of ``stream`` now (what ``--until-id $`` stands for)."""
    client = redis.Redis.from_url(url)
    try:
        newest = client.xrevrange(stream, count=1)
    finally:
        client.close()
    if not newest:
        raise ConfigurationError(f"--until-id $: the stream {stream} at {url} has no entry")
    entry_id = newest[0][0]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def build(env: StreamExecutionEnvironment, argv: Sequence[str]) -> argparse.Namespace:
    """Add the pipeline to ``env`` from the job's own arguments."""
    parser = argparse.ArgumentParser(prog="redis_to_sql")
    parser.add_argument("--redis", required=True, help="the orders' Redis URL")
    parser.add_argument("--stream", required=True, help="the orders' stream key")
    parser.add_argument("--group", default="redis-to-sql", help="the consumer group")
    parser.add_argument("--until-id", help="stop after this entry id ('$': the newest now)")
    parser.add_argument("--splits", type=int, default=2, help="source splits of the stream")
    parser.add_argument("--database", required=True, help="SQLAlchemy URL of the database")
    parser.add_argument("--table-prefix", default="", help="prefix of the two tables' names")
    args = parser.parse_args(list(argv))
    if args.until_id == "$":
        args.until_id = newest_entry_id(args.redis, args.stream)
    source = RedisStreamSource(
        args.redis,
        [args.stream],
        group=args.group,
        splits_per_stream=args.splits,
        until_id=args.until_id,
    )
    per_user = (
        env.from_source(source, uid="orders")
        .map(enrich, uid="enrich")
        .key_by("user")
        .reduce(add_to_user, uid="per-user")
    )
    per_user.sink_to(
        UpsertSink(
            args.database,
            f"{args.table_prefix}user_totals",
            {"user": String(64), "region": String(16), "user_total": BigInteger()},
            key_columns=["user"],
        ),
        uid="user-totals",
    )
    per_region = per_user.key_by("region").reduce(add_to_region, uid="per-region")
    per_region.sink_to(
        SqlSink(
            args.database,
            f"{args.table_prefix}region_updates",
            {"region": String(16), "amount": BigInteger(), "region_total": BigInteger()},
        ),
        uid="region-updates",
    )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    env = StreamExecutionEnvironment.from_args(argv)
    args = build(env, env.args)
    env.execute("redis-to-sql")  # the job's lines (and its summary) are on stderr
    prefix = args.table_prefix
    print(f"redis-to-sql: committed to {prefix}user_totals and {prefix}region_updates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
