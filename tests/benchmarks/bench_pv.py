"""PV-count throughput with checkpoints every second vs without, measured in one run, and
where a checkpoint's end-to-end time goes, at full throughput and paced.

    make bench            # or: .venv/bin/python tests/benchmarks/bench_pv.py --events 4000000

Runs the example PV job (``--emit epoch``) on one shared local SparkSession, alternating the
configurations so that warm-up and machine noise hit all alike: unpaced with checkpoints every
second and without, and paced (``--paced-rate``) with checkpoints every second. For every
completed checkpoint: its end-to-end duration (trigger to completion) and, from its
acknowledgements, the largest start delay, alignment, synchronous and asynchronous duration of
its subtasks and the wait from the last acknowledgement to the completion (the rest of the
epoch that carried it: acknowledgements return with their Spark tasks). Writes a Markdown table
and JSON to ``tests/benchmarks/results/pv_throughput.*``.
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))

from examples import pv_count  # noqa: E402
from sparkpoint.checkpointing.config import CheckpointConfig  # noqa: E402
from sparkpoint.graph import StreamExecutionEnvironment  # noqa: E402
from sparkpoint.options import JobOptions  # noqa: E402
from sparkpoint.protocol import CheckpointCompleted, SnapshotCompleted  # noqa: E402
from sparkpoint.runtime.driver import JobDriver  # noqa: E402
from sparkpoint.runtime.spark import spark_session  # noqa: E402

RESULTS = Path(__file__).parent / "results"


#: The parts of a checkpoint's end-to-end time, in the order they happen.
PARTS = ("start_delay", "alignment", "sync", "async", "ack_to_completion")


def run_once(
    spark: object,
    base: str,
    name: str,
    events: int,
    apps: int,
    interval_ms: int,
    rate: float = 0,
) -> dict[str, Any]:
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
            str(rate),
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
    completed = list(result.events.of_type(CheckpointCompleted))
    durations = sorted(c.end_to_end_duration_ms for c in completed)
    return {
        "seconds": wall,
        "events_per_s": events / wall,
        "epochs": result.epochs,
        "checkpoints": len(result.completed_checkpoints),
        "checkpoint_p50_ms": statistics.median(durations) if durations else 0.0,
        "checkpoints_ms": [
            _parts(c, list(result.events.of_type(SnapshotCompleted))) for c in completed
        ],
    }


def _parts(done: CheckpointCompleted, acks: list[SnapshotCompleted]) -> dict[str, float]:
    """A checkpoint's end-to-end duration and :data:`PARTS` (the largest of its subtasks')."""
    mine = [a for a in acks if a.checkpoint_id == done.checkpoint_id]
    last_ack = max(a.ack_timestamp for a in mine)
    return {
        "end_to_end": done.end_to_end_duration_ms,
        "start_delay": max(a.start_delay_ms for a in mine),
        "alignment": max(a.alignment_duration_ms for a in mine),
        "sync": max(a.sync_duration_ms for a in mine),
        "async": max(a.async_duration_ms for a in mine),
        "ack_to_completion": float(max(0, done.completion_timestamp - last_ack)),
    }


def _percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def latency_rows(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """A table of checkpoint end-to-end p50 and p99 per configuration with checkpoints, and
    the median of each part (over every checkpoint of every run)."""
    rows = [
        "| configuration | checkpoints | end-to-end p50 | p99 | "
        + " | ".join(f"{part.replace('_', ' ')} (median)" for part in PARTS)
        + " |",
        "|---|---:|---:|---:|" + "---:|" * len(PARTS),
    ]
    for label, rs in runs.items():
        cps = [cp for r in rs for cp in r["checkpoints_ms"]]
        if not cps or label == "no checkpoints":
            continue
        e2e = [cp["end_to_end"] for cp in cps]
        parts = " | ".join(f"{statistics.median(cp[part] for cp in cps):.0f} ms" for part in PARTS)
        rows.append(
            f"| {label} | {len(cps)} | {_percentile(e2e, 0.5):.0f} ms "
            f"| {_percentile(e2e, 0.99):.0f} ms | {parts} |"
        )
    return rows


def write_results(stem: str, table: str, data: Mapping[str, object]) -> None:
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
    parser.add_argument(
        "--paced-rate", type=float, default=1_000_000, help="events/s of the paced runs (0: none)"
    )
    parser.add_argument("--paced-seconds", type=float, default=15, help="length of a paced run")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("local[*]", "sparkpoint-bench")
    paced = f"checkpoint every 1 s, paced at {args.paced_rate:,.0f} events/s"
    configs = [("checkpoint every 1 s", 1000, 0.0), ("no checkpoints", 0, 0.0)]
    if args.paced_rate:
        configs.append((paced, 1000, args.paced_rate))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in configs}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-") as base:
        run_once(spark, base, "warmup", min(args.events, 500_000), args.apps, 0)
        for i in range(args.repeats):
            for label, interval, rate in configs if i % 2 == 0 else configs[::-1]:  # ABBA
                events = int(rate * args.paced_seconds) if rate else args.events
                runs[label].append(
                    run_once(
                        spark,
                        base,
                        f"r{i}-{len(runs[label])}-{interval}-{rate:.0f}",
                        events,
                        args.apps,
                        interval,
                        rate,
                    )
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
        f"\nthroughput with checkpoints / without (unpaced): **{ratio:.3f}** "
        f"(cost of checkpointing every 1 s: {100 * (1 - ratio):.1f}%)\n"
    )
    rows += latency_rows(runs)
    header = (
        f"PV count, {args.events:,} events unpaced (paced: {args.paced_seconds:.0f} s), "
        f"{args.apps} apps, --emit epoch, {os.cpu_count()} cores, "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}\n\n"
        f"`.venv/bin/python tests/benchmarks/bench_pv.py --events {args.events} "
        f"--repeats {args.repeats} --paced-rate {args.paced_rate:.0f}`"
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
