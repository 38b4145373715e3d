"""PV-count throughput with few keys and with a million, on each state backend, in one run.

    make bench-pv-keys   # or: .venv/bin/python tests/benchmarks/bench_pv_keys.py --events 4000000

Runs the example PV job (``--emit epoch``, unpaced, checkpoints every second) on one shared
local SparkSession with 40 apps and with 1,000,000 apps, for the ``hashmap`` backend and the
``rocksdb`` backend (incremental checkpoints), alternating the configurations (ABBA) so that
warm-up and machine noise hit all alike, for 4 M and for 20 M events: the planner grows each
unpaced epoch fourfold, so a longer run has larger epochs, which the 40-key job turns into
speed (its cost per epoch is fixed) and the million-key job does not (it emits and stores
every key in every epoch). The aim: 1 M keys within 2x of 40 keys on both
backends (state that grows must not make every epoch cost what the whole state costs).
Writes ``tests/benchmarks/results/pv_keys.md`` and ``.json``. With ``--emit every`` the count
emits every record's running count: no partial count crosses the exchange, so both jobs look
up their state per batch of records (``pv_keys_every.md``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_pv import write_results  # noqa: E402

from examples import pv_count  # noqa: E402
from sparkpoint.checkpointing.config import CheckpointConfig  # noqa: E402
from sparkpoint.graph import StreamExecutionEnvironment  # noqa: E402
from sparkpoint.options import JobOptions  # noqa: E402
from sparkpoint.protocol import CheckpointCompleted  # noqa: E402
from sparkpoint.runtime.driver import JobDriver  # noqa: E402
from sparkpoint.runtime.spark import spark_session  # noqa: E402

BACKENDS = {"hashmap": ("hashmap", False), "rocksdb": ("rocksdb", True)}


def run_once(
    spark: object, base: str, name: str, events: int, apps: int, backend: str, emit: str
) -> dict[str, float]:
    state_backend, incremental = BACKENDS[backend]
    options = JobOptions(
        job_id=name,
        checkpoint=CheckpointConfig(interval_ms=1000),
        checkpoint_dir=f"file://{base}/{name}/chk",
        checkpoint_storage="filesystem",
        local_dir=os.path.join(base, name, "local"),
        restart_strategy={"restart-strategy.type": "none"},
        state_backend=state_backend,
        incremental=incremental,
    )
    env = StreamExecutionEnvironment(options)
    out = os.path.join(base, name, "out")
    argv = ["--events", str(events), "--apps", str(apps), "--rate", "0", "--emit", emit]
    pv_count.build(env, [*argv, "--output", out])
    env.graph.name = "pv-keys-bench"
    started = time.perf_counter()
    result = JobDriver(env.graph, options, spark=spark).run()
    wall = time.perf_counter() - started
    assert result.records == events, (result.records, events)
    assert result.events is not None
    done = list(result.events.of_type(CheckpointCompleted))
    return {
        "seconds": wall,
        "events_per_s": events / wall,
        "epochs": result.epochs,
        "checkpoints": len(done),
        "checkpoint_p50_ms": statistics.median(c.end_to_end_duration_ms for c in done)
        if done
        else 0.0,
        "state_size": max((c.state_size for c in done), default=0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--events",
        type=int,
        nargs="+",
        default=[4_000_000, 20_000_000],
        help="run lengths (the ratio depends on it: the 40-key runs speed up as epochs grow)",
    )
    parser.add_argument("--few", type=int, default=40)
    parser.add_argument("--many", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--emit",
        choices=["epoch", "every"],
        default="epoch",
        help="the count's output: each key once per epoch (the aim's runs), or every record's "
        "running count (no map-side partial count: both jobs touch their state per record; "
        "results in pv_keys_every.md)",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("local[*]", "sparkpoint-bench-keys")
    configs = [(n, b, k) for n in args.events for b in BACKENDS for k in (args.few, args.many)]
    runs: dict[tuple[int, str, int], list[dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-keys-") as base:
        for backend in BACKENDS:
            run_once(spark, base, f"warmup-{backend}", 200_000, args.few, backend, args.emit)
        for i in range(args.repeats):
            for events, backend, apps in configs if i % 2 == 0 else configs[::-1]:
                name = f"r{i}-{events}-{backend}-{apps}"
                runs[(events, backend, apps)].append(
                    run_once(spark, base, name, events, apps, backend, args.emit)
                )
    med = {c: statistics.median(r["events_per_s"] for r in rs) for c, rs in runs.items()}
    rows = [
        "| events | backend | keys | median events/s | runs (events/s) | epochs | checkpoints "
        "| checkpoint p50 | state size |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for (events, backend, apps), rs in runs.items():
        rows.append(
            f"| {events:,} | {backend} | {apps:,} | {med[(events, backend, apps)]:,.0f} | "
            + ", ".join(f"{r['events_per_s']:,.0f}" for r in rs)
            + f" | {rs[-1]['epochs']:.0f} | {rs[-1]['checkpoints']:.0f} "
            f"| {statistics.median(r['checkpoint_p50_ms'] for r in rs):.0f} ms "
            f"| {rs[-1]['state_size'] / 1e6:.1f} MB |"
        )
    rows.append("")
    for events in args.events:
        for backend in BACKENDS:
            ratio = med[(events, backend, args.many)] / med[(events, backend, args.few)]
            rows.append(
                f"- {events:,} events, {backend}: {args.many:,} keys / {args.few} keys "
                f"throughput = **{ratio:.2f}** (aim: >= 0.5)"
            )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    header = (
        f"PV count, {' and '.join(f'{n:,}' for n in args.events)} events, --emit {args.emit}, "
        "checkpoints every 1 s (rocksdb: "
        f"incremental), {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}, commit {commit}\n\n"
        "`.venv/bin/python tests/benchmarks/bench_pv_keys.py --events "
        f"{' '.join(map(str, args.events))} "
        f"--repeats {args.repeats}" + ("" if args.emit == "epoch" else f" --emit {args.emit}") + "`"
    )
    table = header + "\n\n" + "\n".join(rows)
    data = {
        "events": args.events,
        "emit": args.emit,
        "runs": {f"{n}/{b}/{k}": rs for (n, b, k), rs in runs.items()},
        "median": {f"{n}/{b}/{k}": v for (n, b, k), v in med.items()},
    }
    write_results("pv_keys" if args.emit == "epoch" else f"pv_keys_{args.emit}", table, data)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
