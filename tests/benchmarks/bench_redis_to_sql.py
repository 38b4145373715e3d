"""The Redis -> SQL pipeline with checkpoints every second vs without, measured in one run.

    make bench-redis-to-sql   # or: .venv/bin/python tests/benchmarks/bench_redis_to_sql.py

Fills a Redis stream with orders, then runs ``jobs/examples/redis_to_sql.py`` (enrich, per-user
total, re-key, per-region total, an upsert table and a two-phase-commit table on PostgreSQL)
over the whole stream on one shared local SparkSession, alternating the two configurations
(ABBA) so that warm-up and machine noise hit both alike. Reports records per second, the
checkpoints' end-to-end p50 and p99, and the ratio of the two throughputs; writes
``tests/benchmarks/results/redis_to_sql.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(Path(__file__).parent))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT / "jobs"), os.environ.get("PYTHONPATH")) if p
)

from bench_pv import write_results  # noqa: E402

from examples import redis_to_sql  # noqa: E402
from sparkpoint.checkpointing.config import CheckpointConfig  # noqa: E402
from sparkpoint.connectors.sql_sink import (  # noqa: E402
    COMMITS_SUFFIX,
    STAGED_SUFFIX,
    dispose_engines,
)
from sparkpoint.graph import StreamExecutionEnvironment  # noqa: E402
from sparkpoint.options import JobOptions  # noqa: E402
from sparkpoint.protocol import CheckpointCompleted  # noqa: E402
from sparkpoint.runtime.driver import JobDriver  # noqa: E402
from sparkpoint.runtime.spark import spark_session  # noqa: E402

WITH, WITHOUT = "checkpoint every 1 s", "no checkpoints"


def fill(client: redis.Redis, key: str, orders: int, users: int) -> None:
    for start in range(0, orders, 10_000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(orders, start + 10_000)):
            pipe.xadd(key, {"user": f"user-{(i * 7919) % users}", "amount": str(1 + i % 13)})
        pipe.execute()


def drop(url: str, prefix: str) -> None:
    dispose_engines()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in ("user_totals", "region_updates"):
            for suffix in ("", STAGED_SUFFIX, COMMITS_SUFFIX):
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {prefix}{table}{suffix}")
    engine.dispose()


def run_once(
    spark: object,
    base: str,
    name: str,
    redis_url: str,
    key: str,
    db: str,
    interval_ms: int,
    epoch_records: int,
) -> dict[str, float]:
    prefix = f"bench_{uuid.uuid4().hex[:8]}_"
    options = JobOptions(
        job_id=name,
        checkpoint=CheckpointConfig(interval_ms=interval_ms),
        checkpoint_dir=f"file://{base}/{name}/chk",
        checkpoint_storage="filesystem",
        local_dir=os.path.join(base, name, "local"),
        restart_strategy={"restart-strategy.type": "none"},
        max_epoch_records=epoch_records,  # the stream is all there: else one epoch reads it
        quiet=True,
    )
    env = StreamExecutionEnvironment(options)
    args = redis_to_sql.build(
        env,
        [
            *("--redis", redis_url, "--stream", key, "--until-id", "$", "--group", prefix),
            *("--database", db, "--table-prefix", prefix),
        ],
    )
    env.graph.name = "redis-to-sql-bench"
    try:
        started = time.perf_counter()
        result = JobDriver(env.graph, options, spark=spark).run()
        wall = time.perf_counter() - started
    finally:
        drop(db, prefix)
    assert result.events is not None and args is not None
    durations = sorted(c.end_to_end_duration_ms for c in result.events.of_type(CheckpointCompleted))
    p99 = durations[min(len(durations) - 1, int(0.99 * len(durations)))] if durations else 0.0
    return {
        "seconds": wall,
        "records": result.records,
        "records_per_s": result.records / wall,
        "epochs": result.epochs,
        "checkpoints": len(durations),
        "checkpoint_p50_ms": statistics.median(durations) if durations else 0.0,
        "checkpoint_p99_ms": p99,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orders", type=int, default=400_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--epoch-records", type=int, default=25_000, help="at most per split and epoch"
    )
    parser.add_argument(
        "--redis", default=os.environ.get("REDIS_TEST_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument(
        "--database",
        default=os.environ.get(
            "SPARKPOINT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    client = redis.Redis.from_url(args.redis)
    key = f"bench-orders-{uuid.uuid4().hex[:8]}"
    fill(client, key, args.orders, args.users)
    spark = spark_session("local[*]", "sparkpoint-bench-redis-to-sql")
    runs: dict[str, list[dict[str, float]]] = {WITH: [], WITHOUT: []}
    try:
        with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-") as base:
            configs = [(WITH, 1000), (WITHOUT, 0)]
            for i in range(args.repeats):
                for label, interval in configs if i % 2 == 0 else configs[::-1]:  # ABBA order
                    name = f"r{i}-{interval}"
                    runs[label].append(
                        run_once(
                            spark,
                            base,
                            name,
                            args.redis,
                            key,
                            args.database,
                            interval,
                            args.epoch_records,
                        )
                    )
    finally:
        for k in client.scan_iter(f"{key}*"):
            client.delete(k)
        spark.stop()
    med = {k: statistics.median(r["records_per_s"] for r in v) for k, v in runs.items()}
    ratio = med[WITH] / med[WITHOUT]
    rows = [
        "| configuration | median records/s | runs (records/s) | epochs | checkpoints "
        "| checkpoint end-to-end p50 / p99 |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for label, rs in runs.items():
        rows.append(
            f"| {label} | {med[label]:,.0f} | "
            + ", ".join(f"{r['records_per_s']:,.0f}" for r in rs)
            + f" | {rs[-1]['epochs']:.0f} | {rs[-1]['checkpoints']:.0f} "
            + f"| {statistics.median(r['checkpoint_p50_ms'] for r in rs):,.0f} ms / "
            + f"{max(r['checkpoint_p99_ms'] for r in rs):,.0f} ms |"
        )
    rows.append(
        f"\nthroughput with checkpoints / without: **{ratio:.3f}** "
        f"(cost of checkpointing every 1 s: {100 * (1 - ratio):.1f}%). Without checkpoints "
        "the job still takes its final checkpoint (the sinks commit then)."
    )
    header = (
        f"Redis -> SQL pipeline (`jobs/examples/redis_to_sql.py`), {args.orders:,} orders of "
        f"{args.users:,} users, epochs of at most {args.epoch_records:,} orders per split, "
        f"PostgreSQL, {os.cpu_count()} cores, "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    table = header + "\n\n" + "\n".join(rows)
    write_results("redis_to_sql", table, {"orders": args.orders, "runs": runs, "ratio": ratio})
    return 0


if __name__ == "__main__":
    sys.exit(main())
