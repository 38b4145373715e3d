"""What ``map_batch`` buys: one stateless stage per record, with numpy, and through Arrow.

    make bench-map-batch   # or: .venv/bin/python tests/benchmarks/bench_map_batch.py

The stage drops one app's events (``app-0``) and adds ``score = 2 * event_id + (event_time &
1023)``, computed from two columns, three ways:

- per record: ``.filter(lambda e: e["app_id"] != "app-0")`` then ``.map(lambda e: {**e,
  "score": ...})`` (the runtime's ``FilterOperator`` and ``MapOperator``);
- ``map_batch`` with numpy: the ``app_id`` column compared once per distinct value (a
  ``DictColumn``), ``Batch.take``, the new column in numpy;
- ``map_batch`` through Arrow: ``batch.to_arrow()``, ``Table.filter`` and ``pyarrow.compute``,
  the Table returned and converted back by ``Batch.from_arrow``.

Stage: the chain applied as a task applies it (``run_chain``) to the ``GeneratorSource``'s
batches, read before the clock starts, in this process, without Spark; once with batches as
large as a source task reads at a time unpaced (``--batch``, the runtime's chunk) and once
with small ones, as a paced job's short epochs give (``--small-batch``). records/s is input
records / seconds. The three alternate within each repeat, so the machine's load hits all
alike; best and median of ``--repeats``; the ratios are of the medians (and of the bests)
within this one run.

Job: the whole job in process (``env.execute(in_process=True)``: every subtask in this process,
one after the other, elements between stages pickled as on Spark): a ``GeneratorSource`` of 2
splits -> the stage -> ``key_by("app_id").count(emit="epoch")`` -> file sink, a checkpoint every
second; records/s is events / wall time of the run. It shows what the stage's output form costs
downstream: a per-record stage hands on a batch of dicts (pickled record by record, keyed from
Python objects), a ``map_batch`` stage columns.

Every variant's output is checked to be the same (the stage's records, the job's committed
lines). Writes ``tests/benchmarks/results/map_batch.md`` and ``.json``.
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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT))

from sparkpoint import FileSink, GeneratorSource, StreamExecutionEnvironment  # noqa: E402
from sparkpoint.checkpointing.config import CheckpointConfig  # noqa: E402
from sparkpoint.functions import (  # noqa: E402
    FilterOperator,
    MapBatchOperator,
    MapOperator,
    StatelessOperator,
)
from sparkpoint.graph import DataStream  # noqa: E402
from sparkpoint.options import JobOptions  # noqa: E402
from sparkpoint.protocol import JobStatus  # noqa: E402
from sparkpoint.records import Batch  # noqa: E402
from sparkpoint.runtime.plan import EpochPlan  # noqa: E402
from sparkpoint.runtime.subtask import run_chain  # noqa: E402
from sparkpoint.testing import line_counts  # noqa: E402

DROPPED = "app-0"
SPLITS = 2
VARIANTS = ("per record (map + filter)", "map_batch, numpy", "map_batch, Arrow")


# --------------------------------------------------------------------------- the three stages
def keep(event: dict[str, Any]) -> bool:
    return bool(event["app_id"] != DROPPED)


def scored(event: dict[str, Any]) -> dict[str, Any]:
    return {**event, "score": 2 * event["event_id"] + (event["event_time"] & 1023)}


def numpy_stage(batch: Batch) -> Batch:
    kept = batch.take(np.flatnonzero(batch.column("app_id") != DROPPED))
    columns = dict(kept.columns)
    event_id, event_time = np.asarray(columns["event_id"]), np.asarray(columns["event_time"])
    columns["score"] = 2 * event_id + (event_time & 1023)
    return Batch(columns=columns)


def arrow_stage(batch: Batch) -> pa.Table:
    table = batch.to_arrow()
    table = table.filter(pc.not_equal(table["app_id"], DROPPED))
    score = pc.add(pc.multiply(table["event_id"], 2), pc.bit_wise_and(table["event_time"], 1023))
    return table.append_column("score", score)


def chains() -> dict[str, list[StatelessOperator]]:
    """Each variant's chain of operators, as ``DataStream`` would chain them."""
    return {
        VARIANTS[0]: [FilterOperator("keep", keep), MapOperator("score", scored)],
        VARIANTS[1]: [MapBatchOperator("stage", numpy_stage)],
        VARIANTS[2]: [MapBatchOperator("stage", arrow_stage)],
    }


def add_stage(stream: DataStream, variant: str) -> DataStream:
    if variant == VARIANTS[0]:
        return stream.filter(keep, uid="keep").map(scored, uid="score")
    return stream.map_batch(numpy_stage if variant == VARIANTS[1] else arrow_stage, uid="stage")


# --------------------------------------------------------------------------------- the stage
def source_batches(events: int, apps: int, batch: int) -> list[Batch]:
    """The generator's batches of ``batch`` records, both splits, as source tasks read them."""
    src = GeneratorSource(events=events, apps=apps, rate=0, splits=SPLITS)
    out = []
    for split in range(SPLITS):
        total = src.total(split) or 0
        out += [src.read(split, lo, min(total, lo + batch)) for lo in range(0, total, batch)]
    return out


def check_same_output(batches: list[Batch], stages: dict[str, list[StatelessOperator]]) -> None:
    """Every variant gives the same records (the first and the last batch compared)."""
    for sample in (batches[0], batches[-1]):
        outputs = {name: run_chain(chain, sample).rows for name, chain in stages.items()}
        expected = [scored(e) for e in sample.rows if keep(e)]
        for name, rows in outputs.items():
            if rows != expected:
                raise AssertionError(f"{name} gave other records than the per-record stage")


def time_stage(chain: list[StatelessOperator], batches: list[Batch]) -> float:
    started = time.perf_counter()
    for batch in batches:
        run_chain(chain, batch)
    return time.perf_counter() - started


def measure_stage(events: int, apps: int, batch: int, repeats: int) -> dict[str, list[float]]:
    """records/s of each variant over ``repeats`` alternating rounds."""
    batches = source_batches(events, apps, batch)
    records = sum(len(b) for b in batches)
    stages = chains()
    check_same_output(batches, stages)
    for chain in stages.values():  # warm-up: imports, caches
        run_chain(chain, batches[0])
    rates: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(repeats):
        for name, chain in stages.items():
            rates[name].append(records / time_stage(chain, batches))
    return rates


# ----------------------------------------------------------------------------------- the job
def run_job(base: str, name: str, variant: str, events: int, apps: int) -> tuple[float, Any]:
    """The whole job in process; its records/s and its committed lines."""
    out = f"{base}/{name}/out"
    options = JobOptions(
        job_id=name,
        checkpoint=CheckpointConfig(interval_ms=1000),
        checkpoint_dir=f"file://{base}/{name}/chk",
        local_dir=f"{base}/{name}/local",
        parallelism=SPLITS,
    )
    env = StreamExecutionEnvironment(options)
    source = env.from_source(
        GeneratorSource(events=events, apps=apps, rate=0, splits=SPLITS), uid="events"
    )
    add_stage(source, variant).key_by("app_id").count(uid="pv", output="pv", emit="epoch").sink_to(
        FileSink(out), uid="sink"
    )
    started = time.perf_counter()
    result = env.execute(name, in_process=True)
    seconds = time.perf_counter() - started
    if result.status is not JobStatus.FINISHED:
        raise AssertionError(f"{name}: {result.status}")
    return events / seconds, line_counts(out)


def measure_job(events: int, apps: int, repeats: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    expected = None
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-map-batch-") as base:
        for round_ in range(repeats):
            for i, variant in enumerate(VARIANTS):
                rate, lines = run_job(base, f"job-{round_}-{i}", variant, events, apps)
                expected = expected if expected is not None else lines
                if lines != expected:
                    raise AssertionError(f"{variant}: committed other lines than the first run")
                rates[variant].append(rate)
    return rates


# ---------------------------------------------------------------------------------- results
def summary(rates: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    base = rates[VARIANTS[0]]
    return {
        name: {
            "best": max(runs),
            "median": statistics.median(runs),
            "ratio_median": statistics.median(runs) / statistics.median(base),
            "ratio_best": max(runs) / max(base),
        }
        for name, runs in rates.items()
    }


def table(title: str, rates: dict[str, list[float]]) -> list[str]:
    stats = summary(rates)
    rows = [
        f"{title}\n",
        "| stage | best records/s | median records/s | vs per record (median / best) | runs |",
        "|---|---:|---:|---:|---|",
    ]
    for name, runs in rates.items():
        s = stats[name]
        rows.append(
            f"| {name} | {s['best']:,.0f} | {s['median']:,.0f} | "
            f"{s['ratio_median']:.1f}x / {s['ratio_best']:.1f}x | "
            f"{', '.join(f'{r:,.0f}' for r in runs)} |"
        )
    return [*rows, ""]


def main() -> int:
    from tests.benchmarks.bench_pv import write_results

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=2_000_000, help="records through the stage")
    parser.add_argument("--apps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=EpochPlan.chunk_records)
    parser.add_argument("--small-batch", type=int, default=4_096)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--job-events", type=int, default=2_000_000, help="0: no job runs")
    parser.add_argument("--job-repeats", type=int, default=3)
    args = parser.parse_args()
    commit = subprocess.run(  # before the runs: others may commit meanwhile
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    load_before = os.getloadavg()
    stage = {
        size: measure_stage(args.events, args.apps, size, args.repeats)
        for size in (args.batch, args.small_batch)
    }
    job = measure_job(args.job_events, args.apps, args.job_repeats) if args.job_events else {}
    load_after = os.getloadavg()
    lines = [
        f"map_batch vs map + filter: drop one of {args.apps} apps, add a field from two columns; "
        f"{os.cpu_count()} cores, load {load_before[0]:.2f} before and {load_after[0]:.2f} after "
        f"(1-min average), Python {platform.python_version()}, numpy {np.__version__}, pyarrow "
        f"{pa.__version__}, {time.strftime('%Y-%m-%d')}, commit {commit}\n",
        f"`.venv/bin/python tests/benchmarks/bench_map_batch.py --events {args.events} --apps "
        f"{args.apps} --batch {args.batch} --small-batch {args.small_batch} --repeats "
        f"{args.repeats} --job-events {args.job_events} --job-repeats {args.job_repeats}`\n",
        "The stage alone (`run_chain` over the generator's batches, read beforehand; records in "
        "/ seconds; the variants alternate in each repeat):\n",
    ]
    for size, rates in stage.items():
        lines += table(
            f"{args.events:,} records in batches of {size:,}, {args.repeats} repeats:", rates
        )
    if job:
        lines += table(
            f"The whole job in process ({args.job_events:,} events, 2 splits, stage -> "
            "key_by(app_id).count(emit epoch) -> file sink, checkpoint every second; events / "
            f"wall time; {args.job_repeats} repeats, alternating; the same committed output):",
            job,
        )
    data = {
        "events": args.events,
        "apps": args.apps,
        "job_events": args.job_events,
        "load_before": load_before,
        "load_after": load_after,
        "commit": commit,
        "stage": {
            str(size): {"runs": rates, "summary": summary(rates)} for size, rates in stage.items()
        },
        "job": {"runs": job, "summary": summary(job)} if job else None,
    }
    write_results("map_batch", "\n".join(lines).rstrip(), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
