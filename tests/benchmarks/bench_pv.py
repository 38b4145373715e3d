"""PV-count throughput with checkpoints every second vs without, measured in one run.

    make bench            # or: .venv/bin/python tests/benchmarks/bench_pv.py --events 4000000

Runs the example PV job (``--emit epoch``, unpaced source) on one shared local SparkSession,
alternating the two configurations so that warm-up and machine noise hit both alike, and
writes a Markdown table and JSON to ``tests/benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))

from examples import pv_count  # noqa: E402
from sparkpoint.checkpointing.config import CheckpointConfig  # noqa: E402
from sparkpoint.graph import StreamExecutionEnvironment  # noqa: E402
from sparkpoint.options import JobOptions  # noqa: E402
from sparkpoint.protocol import CheckpointCompleted  # noqa: E402
from sparkpoint.runtime.driver import JobDriver  # noqa: E402
from sparkpoint.runtime.spark import spark_session  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def run_once(
    spark: object, base: str, name: str, events: int, apps: int, interval_ms: int
) -> dict[str, float]:
    out = os.path.join(base, name, "out")
    options = JobOptions(
        job_id=name,
        checkpoint=CheckpointConfig(interval_ms=interval_ms),
        checkpoint_dir=f"file://{base}/{name}/chk",
        checkpoint_storage="filesystem",
        local_dir=os.path.join(base, name, "local"),
        restart_strategy={"restart-strategy.type": "none"},
    )
    env = StreamExecutionEnvironment(options)
    pv_count.build(
        env,
        [
            "--events",
            str(events),
            "--apps",
            str(apps),
            "--rate",
            "0",
            "--emit",
            "epoch",
            "--output",
            out,
        ],
    )
    env.graph.name = "pv-bench"
    started = time.perf_counter()
    result = JobDriver(env.graph, options, spark=spark).run()
    wall = time.perf_counter() - started
    assert result.records == events, (result.records, events)
    assert result.events is not None
    durations = sorted(c.end_to_end_duration_ms for c in result.events.of_type(CheckpointCompleted))
    return {
        "seconds": wall,
        "events_per_s": events / wall,
        "epochs": result.epochs,
        "checkpoints": len(result.completed_checkpoints),
        "checkpoint_p50_ms": statistics.median(durations) if durations else 0.0,
    }


def write_results(stem: str, table: str, data: dict[str, object]) -> None:
    """Print a result table and write it, with its raw numbers, to ``results/<stem>.md|json``."""
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.md").write_text(table + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000_000)
    parser.add_argument("--apps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("local[*]", "sparkpoint-bench")
    runs: dict[str, list[dict[str, float]]] = {"checkpoint every 1 s": [], "no checkpoints": []}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-") as base:
        run_once(spark, base, "warmup", min(args.events, 500_000), args.apps, 0)
        configs = [("checkpoint every 1 s", 1000), ("no checkpoints", 0)]
        for i in range(args.repeats):
            for label, interval in configs if i % 2 == 0 else configs[::-1]:  # ABBA order
                runs[label].append(
                    run_once(spark, base, f"r{i}-{interval}", args.events, args.apps, interval)
                )
    med = {k: statistics.median(r["events_per_s"] for r in v) for k, v in runs.items()}
    ratio = med["checkpoint every 1 s"] / med["no checkpoints"]
    rows = [
        "| configuration | median events/s | runs (events/s) | epochs | checkpoints "
        "| checkpoint end-to-end p50 |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for label, rs in runs.items():
        rows.append(
            f"| {label} | {med[label]:,.0f} | "
            + ", ".join(f"{r['events_per_s']:,.0f}" for r in rs)
            + f" | {rs[-1]['epochs']:.0f} | {rs[-1]['checkpoints']:.0f} "
            + f"| {statistics.median(r['checkpoint_p50_ms'] for r in rs):.0f} ms |"
        )
    rows.append(
        f"\nthroughput with checkpoints / without: **{ratio:.3f}** "
        f"(cost of checkpointing every 1 s: {100 * (1 - ratio):.1f}%)"
    )
    header = (
        f"PV count, {args.events:,} events, {args.apps} apps, --emit epoch, "
        f"{os.cpu_count()} cores, {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )
    table = header + "\n\n" + "\n".join(rows)
    write_results(
        "pv_throughput",
        table,
        {"events": args.events, "apps": args.apps, "runs": runs, "median": med, "ratio": ratio},
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
