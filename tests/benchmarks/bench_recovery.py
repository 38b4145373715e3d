"""Recovery: from a task failure to the first record processed after the restore, with about
1 MB and 100 MB of keyed state, on the hashmap and the rocksdb backend (issue 14, benchmark 6).

    make bench-recovery   # or: .venv/bin/python tests/benchmarks/bench_recovery.py --repeats 5

Runs the example PV job (``--emit epoch``, unpaced, checkpoints every second, standalone: the
in-process coordinator) on one shared local SparkSession, alternating the configurations so
that warm-up and machine noise hit all alike. Source subtask 0 fails late in its split (the
injection of ``--fail-after``), after several completed checkpoints; the restart strategy is
fixed-delay with a delay of 0, so that the strategy's own wait is not measured; the job
restores the latest completed checkpoint and runs to its end, and its committed output must
hold every app's true count (the number is the recovery of a correct run). The rocksdb backend
takes incremental checkpoints. The state size is the restored checkpoint's (Flink's state
size: the bytes its snapshot references).

The interval and its parts, all on this machine's wall clock:

1. *detect*: the source task raises the failure (its clock, written in the failure's message)
   -> the driver reports ``task_failed`` (the failed Spark job returned);
2. *decide*: -> ``RESTARTING`` (the restart strategy allowed a restart);
3. *driver restore*: -> ``job_restored`` (the checkpoint chosen and its files verified, the
   pending checkpoints aborted, its sink transactions committed again, other uncommitted parts
   aborted, the sources sought back);
4. *epoch start*: -> the next epoch's source stage submitted (Spark's status tracker);
5. *source stage*: -> its keyed stage submitted (the source tasks read and shipped the epoch's
   records: Spark starts a shuffle's reducers once every mapper finished);
6. *keyed stage*: -> the first keyed subtask had processed its first records (the heartbeat's
   ``first_record_after_restore``): the keyed tasks started, restored their state and read
   their first input. *Of which state restore*: the heartbeat's ``restore_duration_ms``, the
   longest keyed subtask's, from its start until its state was open.

``--small-epochs N`` (default 250,000; 0: off) also runs the smallest size on hashmap with
epochs of at most N records per split, so that the first epoch after the restore is small too:
what the source stage of a full-size first epoch costs. Writes
``tests/benchmarks/results/recovery.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
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
import pyarrow.json as pa_json

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_pv import write_results  # noqa: E402

from examples import pv_count  # noqa: E402
from sparkpoint import protocol as p  # noqa: E402
from sparkpoint.checkpointing.config import CheckpointConfig  # noqa: E402
from sparkpoint.connectors.sources import GeneratorSource  # noqa: E402
from sparkpoint.graph import StreamExecutionEnvironment  # noqa: E402
from sparkpoint.options import JobOptions  # noqa: E402
from sparkpoint.records import DictColumn  # noqa: E402
from sparkpoint.runtime.driver import JobDriver  # noqa: E402
from sparkpoint.runtime.spark import spark_session  # noqa: E402
from sparkpoint.testing import FailureInjection, committed_files  # noqa: E402

#: Per state size: distinct apps, events, and the offset of split 0 where its task fails.
#: Epochs grow to 4 M records per split (8 M in all). The failure comes after 36 M (1MB) or
#: 33 M (100MB) events, more than 5 s of input at the fastest this machine runs the job: several
#: checkpoints (one a second) completed before it. The checkpoint restored is the one of the
#: epoch before the failed one or of the epoch before that, which covers at least 16 M events
#: fewer: nearly every app (100MB: >= 17 M events of 5.8 M apps, >= 95 %, ~17 bytes each).
SIZES = {
    "1MB": {"apps": 60_000, "events": 40_000_000, "fail_at": 18_000_000},
    "100MB": {"apps": 5_800_000, "events": 34_000_000, "fail_at": 16_500_000},
}
BACKENDS = {"hashmap": ("hashmap", False), "rocksdb": ("rocksdb", True)}
#: The parts of the interval, in the order they happen (they add up to its total).
PARTS = ("detect", "decide", "driver_restore", "epoch_start", "source_stage", "keyed_stage")
RAISED = re.compile(r" at unix time (\d+\.\d{3})")
RESTART_AT_ONCE = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": "1",
    "restart-strategy.fixed-delay.delay": "0 ms",
}


def run_once(
    spark: Any, base: str, name: str, size: str, backend: str, max_epoch_records: int
) -> dict[str, Any]:
    """One job that fails once and recovers; its timeline, the parts, the restored size."""
    conf = SIZES[size]
    state_backend, incremental = BACKENDS[backend]
    root = os.path.join(base, name)
    options = JobOptions(
        job_id=name,
        checkpoint=CheckpointConfig(interval_ms=1000),
        checkpoint_dir=f"file://{root}/chk",
        checkpoint_storage="filesystem",
        local_dir=os.path.join(root, "local"),
        restart_strategy=dict(RESTART_AT_ONCE),
        state_backend=state_backend,
        incremental=incremental,
        max_epoch_records=max_epoch_records,
    )
    env = StreamExecutionEnvironment(options)
    out = os.path.join(root, "out")
    argv = ["--events", str(conf["events"]), "--apps", str(conf["apps"]), "--rate", "0"]
    pv_count.build(env, [*argv, "--emit", "epoch", "--output", out])
    env.graph.name = f"recovery-{name}"  # its own Spark job groups
    failure = FailureInjection("source", subtask=0, offset=conf["fail_at"])
    started = time.perf_counter()
    result = JobDriver(env.graph, options, spark=spark, failure=failure).run()
    wall = time.perf_counter() - started
    assert result.status is p.JobStatus.FINISHED, result.status
    assert result.events is not None
    (restored_id,) = result.restores
    assert restored_id is not None, f"{name}: restored the beginning, not a checkpoint"
    run = timeline(list(result.events.events), restored_id)
    run.update(stage_times(spark, env.graph.name, run))
    run["parts"] = parts(run)
    run["wall_s"] = wall
    run["output_correct"] = output_is_true_counts(out, conf["events"], conf["apps"])
    assert run["output_correct"], f"{name}: the committed counts are not the true counts"
    shutil.rmtree(root, ignore_errors=True)  # up to a GB of output and state per run
    return run


def timeline(events: list[p.Envelope], restored_id: int) -> dict[str, Any]:
    """The moments of the recovery, from the job's events (wall clock, ms)."""
    decoded = [(e, e.decoded()) for e in events]
    at = next(i for i, (_, pl) in enumerate(decoded) if isinstance(pl, p.TaskFailed))
    failed_env, failed = decoded[at]
    assert isinstance(failed, p.TaskFailed)
    raised = RAISED.search(failed.cause)
    assert raised is not None, failed.cause
    after = decoded[at:]
    decided = next(
        e
        for e, pl in after
        if isinstance(pl, p.JobStatusChanged) and pl.status is p.JobStatus.RESTARTING
    )
    restored = next(e for e, pl in after if isinstance(pl, p.JobRestored))
    beat_env, beat = next(
        (e, pl)
        for e, pl in after
        if isinstance(pl, p.Heartbeat) and pl.restore_duration_ms is not None
    )
    assert isinstance(beat, p.Heartbeat) and beat.first_record_after_restore is not None
    state = next(
        pl
        for _, pl in decoded
        if isinstance(pl, p.CheckpointCompleted) and pl.checkpoint_id == restored_id
    )
    assert isinstance(state, p.CheckpointCompleted)
    return {
        "raised": round(float(raised[1]) * 1000),
        "detected": failed_env.timestamp,
        "decided": decided.timestamp,
        "restored": restored.timestamp,
        "first_record": beat.first_record_after_restore,
        "restore_ms": beat.restore_duration_ms,
        "failed_epoch": failed.epoch,
        "epoch_after": beat.epoch,
        "epoch_after_attempt": beat_env.attempt,
        "epoch_after_records": beat.records,
        "epoch_after_ms": beat.duration_ms,
        "restored_checkpoint": restored_id,
        "state_size": state.state_size,
    }


def stage_times(spark: Any, job_name: str, run: dict[str, Any]) -> dict[str, int]:
    """When Spark submitted the source stage and the keyed stage of the epoch after the
    restore (its status tracker, asked right after the job)."""
    group = p.spark_job_group(job_name, run["epoch_after_attempt"], run["epoch_after"])
    tracker = spark.sparkContext.statusTracker()
    java = spark.sparkContext._jsc.statusTracker()
    submitted = []
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job is not None else []:
            info = java.getStageInfo(stage_id)
            if info is not None:
                submitted.append((stage_id, int(info.submissionTime())))
    assert len(submitted) == 2, f"{group}: stages {submitted}, not a source and a keyed one"
    (_, source), (_, keyed) = sorted(submitted)
    return {"source_submitted": source, "keyed_submitted": keyed}


def parts(run: dict[str, Any]) -> dict[str, float]:
    """The :data:`PARTS` of one run's interval (ms), its ``total`` and ``state_restore``."""
    return {
        "total": run["first_record"] - run["raised"],
        "detect": run["detected"] - run["raised"],
        "decide": run["decided"] - run["detected"],
        "driver_restore": run["restored"] - run["decided"],
        "epoch_start": run["source_submitted"] - run["restored"],
        "source_stage": run["keyed_submitted"] - run["source_submitted"],
        "keyed_stage": run["first_record"] - run["keyed_submitted"],
        "state_restore": run["restore_ms"],
    }


def true_counts(events: int, apps: int) -> tuple[np.ndarray, np.ndarray]:
    """Every app's name and its true number of events, read straight from the source."""
    src = GeneratorSource(events=events, apps=apps, rate=0)
    counts = np.zeros(apps, dtype=np.int64)
    names = None
    for split in range(src.splits):
        column = src.read(split, 0, src.total(split) or 0).column("app_id")
        assert isinstance(column, DictColumn), "the generator's app ids are dictionary-coded"
        # A read of at least ``apps`` records codes every app by its index (_app_ids).
        assert len(column.values) == apps, "a split shorter than the number of apps"
        names = column.values
        counts += np.bincount(column.codes, minlength=apps)
    assert names is not None
    return names, counts


def output_is_true_counts(out: str, events: int, apps: int) -> bool:
    """Whether each app's highest committed count is its true count, and no app is missing
    or extra (read with Arrow: the 100 MB job commits tens of millions of lines)."""
    names, counts = true_counts(events, apps)
    seen = counts > 0
    truth = pa.table({"app_id": pa.array(names[seen]), "true": counts[seen]})
    lines = pa.concat_tables([pa_json.read_json(f) for f in committed_files(out)])
    final = lines.group_by("app_id").aggregate([("pv", "max")])
    joined = truth.join(final, "app_id", join_type="full outer")
    matches = pc.equal(joined["true"], joined["pv_max"]).fill_null(False)
    return joined.num_rows == truth.num_rows and bool(pc.all(matches).as_py())


def _ms(values: list[float]) -> str:
    """Median (min-max) of durations in ms, in seconds above 10 s."""
    med, lo, hi = statistics.median(values), min(values), max(values)
    if hi >= 10_000:
        return f"{med / 1000:.1f} s ({lo / 1000:.1f}-{hi / 1000:.1f})"
    return f"{med:,.0f} ms ({lo:,.0f}-{hi:,.0f})"


def table_rows(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    names = ("total", *PARTS, "state_restore")
    rows = [
        "| configuration | restored state | runs | "
        + " | ".join(n.replace("_", " ") for n in names[:-1])
        + " | of which state restore | first epoch after | output |",
        "|---|---:|---:|" + "---:|" * len(names) + "---:|---|",
    ]
    for label, rs in runs.items():
        cells = []
        for name in names:
            cells.append(_ms([r["parts"][name] for r in rs]))
        sizes = sorted(r["state_size"] for r in rs)
        size = f"{sizes[0] / 1e6:.1f}" + (
            f"-{sizes[-1] / 1e6:.1f}" if sizes[-1] != sizes[0] else ""
        )
        records = statistics.median(r["epoch_after_records"] for r in rs)
        epoch_ms = statistics.median(r["epoch_after_ms"] for r in rs)
        ok = "true counts" if all(r["output_correct"] for r in rs) else "**WRONG**"
        rows.append(
            f"| {label} | {size} MB | {len(rs)} | "
            + " | ".join(cells)
            + f" | {records / 1e6:.1f} M records, {epoch_ms:,.0f} ms | {ok} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default=",".join(SIZES), help="of " + ", ".join(SIZES))
    parser.add_argument("--backends", default=",".join(BACKENDS), help="of hashmap, rocksdb")
    parser.add_argument(
        "--small-epochs",
        type=int,
        default=250_000,
        help="also run the smallest size on hashmap with epochs of at most this many records "
        "per split (the first epoch after the restore is then small too; 0: not)",
    )
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("local[*]", "sparkpoint-bench-recovery")
    default = JobOptions.max_epoch_records
    sizes, backends = args.sizes.split(","), args.backends.split(",")
    configs = [(s, b, default) for s in sizes for b in backends]
    if args.small_epochs:
        configs.append((sizes[0], "hashmap", args.small_epochs))
    runs: dict[str, list[dict[str, Any]]] = {_label(*c): [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-recovery-") as base:
        for backend in backends:
            run_once(spark, base, f"warmup-{backend}", sizes[0], backend, default)
        for i in range(args.repeats):
            for size, backend, epochs in configs if i % 2 == 0 else configs[::-1]:  # ABBA
                name = f"r{i}-{size}-{backend}-{epochs}"
                run = run_once(spark, base, name, size, backend, epochs)
                runs[_label(size, backend, epochs)].append(run)
                print(f"{name}: {run['parts']}", flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    command = (
        f"`.venv/bin/python tests/benchmarks/bench_recovery.py --repeats {args.repeats} "
        f"--sizes {args.sizes} --backends {args.backends} --small-epochs {args.small_epochs}`"
    )
    header = (
        "Recovery: injected task failure -> first record processed after the restore; PV "
        "count (`--emit epoch`), unpaced, checkpoints every 1 s (rocksdb: incremental), "
        "standalone, fixed-delay restart with delay 0, parallelism 2, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}, commit {commit}\n\n{command}\n\n"
        + "\n".join(
            f"- {s}: {SIZES[s]['apps']:,} apps, {SIZES[s]['events']:,} events, source subtask 0 "
            f"fails at offset {SIZES[s]['fail_at']:,} of its split"
            for s in sizes
        )
    )
    legend = (
        "Median (min-max) over the runs, wall clock. *detect*: the task raised the failure -> "
        "the driver reported it (the failed Spark job returned); *decide*: -> RESTARTING "
        "(restart strategy); *driver restore*: -> job_restored (checkpoint chosen and verified, "
        "sinks, source positions); *epoch start*: -> the next epoch's source stage submitted; "
        "*source stage*: -> its keyed stage submitted; *keyed stage*: -> the first keyed "
        "subtask had processed its first records, *of which state restore*: the longest keyed "
        "subtask's, from its start until its state was open. *Restored state*: the restored "
        "checkpoint's state size (rocksdb's files hold the same apps in more bytes). *First "
        "epoch after*: the records and the duration of the epoch after the restore."
    )
    table = header + "\n\n" + "\n".join(table_rows(runs)) + "\n\n" + legend
    write_results("recovery", table, {"sizes": SIZES, "runs": runs})
    spark.stop()
    return 0


def _label(size: str, backend: str, max_epoch_records: int) -> str:
    if max_epoch_records == JobOptions.max_epoch_records:
        return f"{size}, {backend}"
    return f"{size}, {backend}, epochs <= {max_epoch_records:,} records per split"


if __name__ == "__main__":
    sys.exit(main())
