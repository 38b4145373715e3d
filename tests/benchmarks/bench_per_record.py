"""Per-record keyed state: a ValueState count per key in a KeyedProcessFunction, vs PyFlink.

    make bench-per-record   # or: .venv/bin/python tests/benchmarks/bench_per_record.py

The same job in both systems: a bounded source of events whose ``app_id`` is ``app-<i>`` of
``--apps`` apps, keyed by ``app_id``, a ``KeyedProcessFunction`` that reads its ``ValueState``
count, adds one and updates it, emitting nothing; a checkpoint every second to the local
filesystem, the hashmap state backend, parallelism 2 (Sparkpoint: 2 source splits on
``local[*]`` of this machine).

- Sparkpoint: ``JobDriver.run`` on one shared local SparkSession (warmed up by a small run);
  records/s is events / wall time of ``run``, the job's start-up included, the SparkSession's
  not. The steady rate is the records of the epochs after the first over the time between
  the first epoch's heartbeat and the last's.
- PyFlink (apache-flink 2.x, local mini-cluster, ``python.execution-mode: thread``): its
  pins (numpy, pandas, pyarrow, cloudpickle, py4j, redis) would downgrade the project's
  environment, so it runs in a subprocess with its own venv, ``.venv-pyflink`` (the make
  target creates it). records/s is events / wall time of ``execute()``, the mini-cluster's
  start-up included, the gateway JVM's not (as the SparkSession's is not). The steady rate
  comes from the difference of two sizes' wall times, which cancels the start-up.
  Without ``.venv-pyflink`` the PyFlink side is skipped and the results say why.

The two systems alternate (ABBA), one PyFlink worker process per round, so that the load of
this shared machine hits both alike.

Writes ``tests/benchmarks/results/per_record.md`` and ``.json``. This file is also the
PyFlink worker (``--pyflink-worker``), run by ``.venv-pyflink``'s Python, which has neither
pyspark nor sparkpoint: so each side imports its system inside its own functions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT))
PYFLINK_PYTHON = ROOT / ".venv-pyflink" / "bin" / "python"
PARALLELISM = 2
INTERVAL_MS = 1000
AIM_RATIO = 50.0
AIM_RECORDS_PER_S = 1_000_000


# ---------------------------------------------------------------------------------- Sparkpoint
def sparkpoint_run(spark: Any, base: str, name: str, events: int, apps: int) -> dict[str, float]:
    """Run the job once with Sparkpoint; wall time, records/s and the steady rate."""
    from sparkpoint import FileSink, GeneratorSource
    from sparkpoint.checkpointing.config import CheckpointConfig
    from sparkpoint.functions import KeyedProcessFunction
    from sparkpoint.graph import StreamExecutionEnvironment
    from sparkpoint.options import JobOptions
    from sparkpoint.protocol import CheckpointCompleted, Heartbeat
    from sparkpoint.runtime.driver import JobDriver
    from sparkpoint.state.descriptors import ValueStateDescriptor

    class Count(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.count = ctx.get_state(ValueStateDescriptor("count", 0))

        def process_element(self, value: Any, ctx: Any) -> tuple[()]:
            self.count.update(self.count.value() + 1)
            return ()

    options = JobOptions(
        job_id=name,
        checkpoint=CheckpointConfig(interval_ms=INTERVAL_MS),
        checkpoint_dir=f"file://{base}/{name}/chk",
        checkpoint_storage="filesystem",
        local_dir=os.path.join(base, name, "local"),
        restart_strategy={"restart-strategy.type": "none"},
        state_backend="hashmap",
    )
    env = StreamExecutionEnvironment(options)
    source = GeneratorSource(events=events, apps=apps, rate=0, splits=PARALLELISM)
    out = os.path.join(base, name, "out")
    env.from_source(source, uid="events").key_by("app_id").process(Count(), uid="count").sink_to(
        FileSink(out), uid="sink"
    )
    env.graph.name = "per-record-bench"
    started = time.perf_counter()
    result = JobDriver(env.graph, options, spark=spark).run()
    wall = time.perf_counter() - started
    assert result.records == events, (result.records, events)
    assert result.events is not None
    beats = list(result.events.of_type(Heartbeat))
    steady = 0.0
    if len(beats) >= 2:
        span_ms = beats[-1].host_time - beats[0].host_time
        steady = sum(b.records for b in beats[1:]) / span_ms * 1000 if span_ms > 0 else 0.0
    return {
        "seconds": wall,
        "records_per_s": events / wall,
        "steady_records_per_s": steady,
        "epochs": result.epochs,
        "checkpoints": len(list(result.events.of_type(CheckpointCompleted))),
    }


# ------------------------------------------------------------------------------------- PyFlink
def pyflink_run(base: str, name: str, events: int, apps: int) -> dict[str, float]:
    """Run the job once on a PyFlink local mini-cluster (in the PyFlink worker process)."""
    from pyflink.common import Configuration, Types, WatermarkStrategy
    from pyflink.datastream import KeyedProcessFunction, RuntimeContext, StreamExecutionEnvironment
    from pyflink.datastream.connectors.base import Sink
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.datastream.state import ValueStateDescriptor

    class Count(KeyedProcessFunction):
        def open(self, ctx: RuntimeContext) -> None:
            self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

        def process_element(self, value: Any, ctx: Any) -> tuple[()]:
            self.count.update((self.count.value() or 0) + 1)
            return ()

    config = Configuration()
    for key, value in {
        "python.execution-mode": "thread",
        "python.executable": sys.executable,
        "python.client.executable": sys.executable,
        "state.backend.type": "hashmap",
        "execution.checkpointing.interval": f"{INTERVAL_MS} ms",
        "execution.checkpointing.dir": (Path(base) / name).as_uri(),
        "restart-strategy.type": "none",
    }.items():
        config.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(PARALLELISM)
    source = NumberSequenceSource(0, events - 1)
    env.from_source(source, WatermarkStrategy.no_watermarks(), "events").map(
        lambda i: f"app-{i % apps}", output_type=Types.STRING()
    ).key_by(lambda app: app, key_type=Types.STRING()).process(Count()).sink_to(
        Sink("org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink")
    )
    started = time.perf_counter()
    job_id = str(env.execute(name).get_job_id())
    wall = time.perf_counter() - started
    # A finished job's checkpoints are deleted; the mini-cluster's log names each one.
    completed = rf"Completed checkpoint \d+ for job {job_id}"
    logs = "".join(log.read_text() for log in (Path(base) / "log").glob("*.log"))
    return {
        "seconds": wall,
        "records_per_s": events / wall,
        "checkpoints": len(re.findall(completed, logs)),
    }


def pyflink_worker(args: argparse.Namespace) -> int:
    """One round of the PyFlink side, run by ``.venv-pyflink``'s Python: a warm-up run, then
    one run of each size; writes their figures to ``args.pyflink_worker`` (JSON)."""
    import sysconfig
    from importlib.metadata import version

    # Thread mode embeds the base interpreter (pemja), which does not see the venv's
    # site-packages unless PYTHONPATH names them; the gateway JVM inherits this environment.
    os.environ["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-pyflink-") as base:
        os.environ["FLINK_LOG_DIR"] = os.path.join(base, "log")  # read by pyflink_run
        pyflink_run(base, "warmup", min(args.pyflink_small, 50_000), args.apps)
        large = pyflink_run(base, "large", args.pyflink_events, args.apps)
        small = pyflink_run(base, "small", args.pyflink_small, args.apps)
    longer = large["seconds"] - small["seconds"]
    extra = args.pyflink_events - args.pyflink_small
    large["steady_records_per_s"] = extra / longer if longer > 0 else 0.0
    result = {"version": version("apache-flink"), "large": large, "small": small}
    Path(args.pyflink_worker).write_text(json.dumps(result))
    return 0


def pyflink_round(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """PyFlink's version and one run of each size (``large``, ``small``), from a worker
    process in ``.venv-pyflink``; or none and why not."""
    python = Path(args.pyflink_python)
    if not python.exists():
        return {}, f"no {python} (`make bench-per-record` creates it)"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [str(python), __file__, "--pyflink-worker", out.name]
        for flag in ("apps", "pyflink_events", "pyflink_small"):
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            tail = " ".join(done.stderr.strip().splitlines()[-3:])
            return {}, f"the PyFlink worker failed (exit {done.returncode}): {tail}"
        return json.loads(Path(out.name).read_text()), ""


# ------------------------------------------------------------------------------------- results
def runs_cell(rs: list[dict[str, float]], key: str) -> str:
    return ", ".join(f"{r[key]:,.0f}" for r in rs)


def measure(args: argparse.Namespace) -> tuple[list[dict[str, float]], dict[str, Any], str]:
    """Sparkpoint's runs, PyFlink's (version, ``large`` and ``small`` runs) and, when PyFlink
    was skipped, why; the systems alternate (ABBA), so that this shared machine's load hits
    both alike."""
    from sparkpoint.runtime.spark import spark_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("local[*]", "sparkpoint-bench-per-record")
    sp: list[dict[str, float]] = []
    flink: dict[str, Any] = {"large": [], "small": []}
    skipped = ""
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-per-record-") as base:
        sparkpoint_run(spark, base, "warmup", min(args.events, 200_000), args.apps)
        for i in range(args.repeats):
            for system in ("sparkpoint", "pyflink") if i % 2 == 0 else ("pyflink", "sparkpoint"):
                if system == "sparkpoint":
                    sp.append(sparkpoint_run(spark, base, f"r{i}", args.events, args.apps))
                elif not skipped:
                    got, skipped = pyflink_round(args)
                    if got:
                        flink["version"] = got["version"]
                        flink["large"].append(got["large"])
                        flink["small"].append(got["small"])
    spark.stop()
    return sp, {} if skipped else flink, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=4_000_000, help="Sparkpoint's events")
    parser.add_argument("--apps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pyflink-events", type=int, default=1_000_000)
    parser.add_argument("--pyflink-small", type=int, default=200_000, help="for the steady rate")
    parser.add_argument("--pyflink-python", default=str(PYFLINK_PYTHON))
    parser.add_argument("--pyflink-worker", metavar="OUT_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pyflink_worker:
        return pyflink_worker(args)
    from tests.benchmarks.bench_pv import write_results  # imports sparkpoint: not in the worker

    commit = subprocess.run(  # before the runs: others may commit meanwhile
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    sp, flink, skipped = measure(args)
    sp_med = statistics.median(r["records_per_s"] for r in sp)
    sp_steady = statistics.median(r["steady_records_per_s"] for r in sp)
    rows = [
        "| system | events | median records/s (start-up included) | runs | "
        "steady records/s (median) | runs | checkpoints |",
        "|---|---:|---:|---|---:|---|---:|",
        f"| Sparkpoint | {args.events:,} | {sp_med:,.0f} | {runs_cell(sp, 'records_per_s')} "
        f"| {sp_steady:,.0f} | {runs_cell(sp, 'steady_records_per_s')} "
        f"| {sp[-1]['checkpoints']:.0f} in {sp[-1]['epochs']:.0f} epochs |",
    ]
    medians: dict[str, float] = {"sparkpoint": sp_med, "sparkpoint_steady": sp_steady}
    if flink:
        large, small = flink["large"], flink["small"]
        medians["pyflink"] = statistics.median(r["records_per_s"] for r in large)
        medians["pyflink_small"] = statistics.median(r["records_per_s"] for r in small)
        medians["pyflink_steady"] = statistics.median(r["steady_records_per_s"] for r in large)
        rows += [
            f"| PyFlink | {args.pyflink_events:,} | {medians['pyflink']:,.0f} "
            f"| {runs_cell(large, 'records_per_s')} | {medians['pyflink_steady']:,.0f} "
            f"| {runs_cell(large, 'steady_records_per_s')} | {large[-1]['checkpoints']:.0f} |",
            f"| PyFlink | {args.pyflink_small:,} | {medians['pyflink_small']:,.0f} "
            f"| {runs_cell(small, 'records_per_s')} | | | {small[-1]['checkpoints']:.0f} |",
        ]
        whole = sp_med / medians["pyflink"]
        steady = sp_steady / medians["pyflink_steady"]
        medians |= {"ratio": whole, "ratio_steady": steady}
        rows.append(
            f"\nSparkpoint / PyFlink: **{whole:.1f}x** start-up included, **{steady:.1f}x** "
            f"steady (aim: >= {AIM_RATIO:.0f}x, about {AIM_RECORDS_PER_S / 1e6:.0f} M records/s)"
        )
    else:
        rows.append(f"\nPyFlink skipped: {skipped}.")
    header = (
        f"Per-record keyed state (KeyedProcessFunction, ValueState count per key), {args.apps:,} "
        f"apps, checkpoint every {INTERVAL_MS / 1000:.0f} s, hashmap backend, parallelism "
        f"{PARALLELISM}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}, commit {commit}\n\n"
        "Sparkpoint: events / wall time of `JobDriver.run` (job start-up included, the "
        "SparkSession's not); steady: the epochs after the first, by their heartbeats."
        + (
            f" PyFlink {flink['version']} (local mini-cluster, thread mode, its own venv): "
            "events / wall time of `execute()` (mini-cluster start-up included, the gateway "
            "JVM's not); steady: the difference of the two sizes' events over the difference "
            "of their wall times, per round (a worker process: a warm-up, then each size "
            "once). The systems alternated (ABBA)."
            if flink
            else ""
        )
        + "\n\n"
        f"`.venv/bin/python tests/benchmarks/bench_per_record.py --events {args.events} "
        f"--apps {args.apps} --repeats {args.repeats} --pyflink-events {args.pyflink_events} "
        f"--pyflink-small {args.pyflink_small}`"
    )
    table = header + "\n\n" + "\n".join(rows)
    data = {
        "events": args.events,
        "apps": args.apps,
        "pyflink_events": args.pyflink_events,
        "pyflink_small": args.pyflink_small,
        "runs": {"sparkpoint": sp, "pyflink": flink},
        "median": medians,
        "pyflink_skipped": skipped or None,
    }
    write_results("per_record", table, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
