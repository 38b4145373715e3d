"""Catch-up (benchmark 5): the PV job paced at 20,000 events/s, started 2,000,000 events
behind its source, and the planner's epoch size and the lag over time.

    make bench-catch-up   # or: .venv/bin/python tests/benchmarks/bench_catch_up.py

Runs the example PV job (``--rate 20000 --backlog 2000000``, checkpoints every second) on a
local SparkSession after a short warm-up job (as ``bench_pv.py``), once per ``--emit`` mode
(default: ``epoch``, then ``every``), for ``--seconds`` of source time: the source's
last event exists that long after the job's first epoch, so a job that catches up within
40 s then runs caught up for 20 s or more. The aim: caught up within 60 s.

Every epoch is recorded by a :class:`RecordingPlanner` that takes the driver's planner's place
before the job starts (the benchmark's own subclass, no hook in the runtime): when it was
planned, its records, the lag before it (``planner.lag()`` once planned, before its ranges
are read) and after it, its duration. *Caught up*: the first epoch after which the lag is at
most what one caught-up epoch reads (the arrivals of one epoch target, ``rate x
--epoch-target-ms``: 20,000 records), and stays there until the end; the time is that
epoch's end, in seconds since the first epoch was planned (``planner.start()``, after Spark
started). The committed output is checked: every app's last count equals its true count.
Writes ``tests/benchmarks/results/catch_up.md``, ``.json`` and ``.svg`` (epoch size and lag
over time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_pv import RESULTS, write_results  # noqa: E402

from examples import pv_count  # noqa: E402
from sparkpoint.checkpointing.config import CheckpointConfig  # noqa: E402
from sparkpoint.connectors.sources import GeneratorSource  # noqa: E402
from sparkpoint.graph import StreamExecutionEnvironment  # noqa: E402
from sparkpoint.options import JobOptions  # noqa: E402
from sparkpoint.runtime.driver import JobDriver  # noqa: E402
from sparkpoint.runtime.plan import SplitRange  # noqa: E402
from sparkpoint.runtime.planner import EpochPlanner  # noqa: E402
from sparkpoint.runtime.spark import spark_session  # noqa: E402
from sparkpoint.testing import committed_lines  # noqa: E402

AIM_S = 60.0


@dataclass
class EpochRecord:
    planned_s: float  # since planner.start()
    records: int  # what the planner planned (and the epoch read)
    lag_before: int  # records that existed unread once it was planned, before it read them
    caught_up_size: int  # what the planner plans when not behind (per split x splits)
    end_s: float = 0.0
    duration_ms: float = 0.0  # as the runtime measured it (the planner's observe)
    lag_after: int = 0


class RecordingPlanner(EpochPlanner):
    """The driver's planner, unchanged, keeping an :class:`EpochRecord` per planned epoch."""

    @classmethod
    def like(cls, planner: EpochPlanner) -> RecordingPlanner:
        return cls(
            planner.source,
            planner.clock,
            target_ms=planner.target_ms,
            min_records=planner.min_records,
            max_records=planner.max_records,
            checkpoint_timeout_ms=planner.checkpoint_timeout_ms,
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started_ms = self.clock.monotonic_ms()
        self.epochs: list[EpochRecord] = []

    def start(self) -> None:
        super().start()
        self.started_ms = self.clock.monotonic_ms()

    def _since_start(self) -> float:
        return (self.clock.monotonic_ms() - self.started_ms) / 1000

    def next_ranges(self, wait_ms: float = math.inf) -> list[SplitRange]:
        ranges = super().next_ranges(wait_ms)
        size = self.per_split * len(self.split_ids)
        records = sum(r.records for r in ranges)
        self.epochs.append(EpochRecord(self._since_start(), records, self.lag(), size))
        return ranges

    def observe(self, records: int, duration_ms: float) -> None:
        super().observe(records, duration_ms)
        last = self.epochs[-1]
        last.end_s, last.duration_ms, last.lag_after = self._since_start(), duration_ms, self.lag()


def true_counts(source: GeneratorSource) -> dict[str, int]:
    """Every app's number of events, read straight from the source."""
    splits = range(len(source.split_ids()))
    ids = np.concatenate([source.read(i, 0, source.total(i) or 0).column("app_id") for i in splits])
    apps, counts = np.unique(ids, return_counts=True)
    return dict(zip(apps.tolist(), counts.tolist(), strict=True))


def last_counts(out: str) -> dict[str, int]:
    """Every app's highest committed count (its last one) in the PV job's output."""
    latest: dict[str, int] = {}
    for line in committed_lines(out):
        record = json.loads(line)
        latest[record["app_id"]] = max(latest.get(record["app_id"], 0), record["pv"])
    return latest


def run_once(
    spark: object, base: str, name: str, emit: str, args: argparse.Namespace
) -> dict[str, Any]:
    out = os.path.join(base, name, "out")
    options = JobOptions(
        job_id=name,
        checkpoint=CheckpointConfig(interval_ms=1000),
        checkpoint_dir=f"file://{base}/{name}/chk",
        checkpoint_storage="filesystem",
        local_dir=os.path.join(base, name, "local"),
        restart_strategy={"restart-strategy.type": "none"},
    )
    events = args.backlog + int(args.rate * args.seconds)
    env = StreamExecutionEnvironment(options)
    argv = ["--events", str(events), "--apps", str(args.apps), "--rate", str(args.rate)]
    argv += ["--backlog", str(args.backlog), "--emit", emit, "--output", out]
    pv_count.build(env, argv)
    env.graph.name = "catch-up-bench"
    driver = JobDriver(env.graph, options, spark=spark)
    planner = driver.job.planner = RecordingPlanner.like(driver.job.planner)
    started = planner.clock.monotonic_ms()
    result = driver.run()
    wall = (planner.clock.monotonic_ms() - started) / 1000
    assert result.records == events, (result.records, events)
    source = env.graph.source.source
    assert isinstance(source, GeneratorSource)
    correct = last_counts(out) == true_counts(source)
    epochs = planner.epochs
    one_epoch = args.rate * options.epoch_target_ms / 1000
    settled = next(
        (i for i in range(len(epochs)) if all(e.lag_after <= one_epoch for e in epochs[i:])),
        None,
    )
    caught_up_s = None if settled is None else epochs[settled].end_s
    caught = epochs[: settled + 1] if settled is not None else epochs
    after = epochs[settled + 1 :] if settled is not None else []
    return {
        "emit": emit,
        "events": events,
        "wall_s": wall,
        "start_up_s": (planner.started_ms - started) / 1000,
        "paced_s": epochs[-1].end_s,
        "events_per_s": events / epochs[-1].end_s,
        "epochs": len(epochs),
        "checkpoints": len(result.completed_checkpoints),
        "one_epoch_records": one_epoch,
        "caught_up_epoch": settled,
        "caught_up_s": caught_up_s,
        # Caught up before the source's last event existed (else only because it ended).
        "caught_up_while_paced": caught_up_s is not None and caught_up_s < args.seconds,
        "catch_up_events_per_s": sum(e.records for e in caught) / caught[-1].end_s,
        "peak_epoch_records": max(e.records for e in epochs),
        "caught_up_epochs_median_records": _median([e.records for e in after]),
        "caught_up_epochs_median_ms": _median([e.duration_ms for e in after]),
        "correct": correct,
        "per_epoch": [asdict(e) for e in epochs],
    }


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else math.nan


# The plot: one panel per run, WIDTH x HEIGHT, records on a log scale from 1 k to 10 M.
WIDTH, HEIGHT, LEFT, TOP, BOTTOM, RIGHT = 820, 320, 70, 44, 52, 20
DECADES = {3: "1 k", 4: "10 k", 5: "100 k", 6: "1 M", 7: "10 M"}


def svg_plot(runs: list[dict[str, Any]]) -> str:
    """Epoch size (a step over each epoch's span) and the lag before each epoch (a point),
    with the caught-up time and the 60 s aim as vertical lines: per run, a panel of the whole
    run and one of its first seconds (the catch-up)."""
    whole = max(AIM_S, *(r["paced_s"] for r in runs)) * 1.03
    panels = [(run, whole) for run in runs]
    panels += [(run, _zoom(run)) for run in runs if run["caught_up_s"] is not None]
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT * len(panels)}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for k, (run, xmax) in enumerate(panels):
        svg += _panel(run, k * HEIGHT, xmax)
    return "\n".join([*svg, "</svg>"]) + "\n"


def _zoom(run: dict[str, Any]) -> float:
    """The first seconds of a run: four times its catch-up, two at least."""
    return float(max(2, math.ceil(4 * run["caught_up_s"])))


def _panel(run: dict[str, Any], oy: int, xmax: float) -> list[str]:
    lo, hi, bottom = min(DECADES), max(DECADES), oy + HEIGHT - BOTTOM

    def x(s: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * s / xmax

    def y(v: float) -> float:
        share = (math.log10(max(v, 10**lo)) - lo) / (hi - lo)
        return bottom - (bottom - oy - TOP) * share

    def vline(s: float, style: str) -> str:
        return f'<line x1="{x(s):.1f}" x2="{x(s):.1f}" y1="{oy + TOP}" y2="{bottom}" {style}/>'

    caught = run["caught_up_s"]
    title = f"--emit {run['emit']}: " + (
        "never caught up" if caught is None else f"caught up after {caught:.2f} s"
    )
    if xmax < run["paced_s"]:
        title = f"--emit {run['emit']}, the first {xmax:.0f} s"
    epochs = [e for e in run["per_epoch"] if e["planned_s"] <= xmax]
    out = [f'<text x="{LEFT}" y="{oy + 22}" font-size="14">{title}</text>']
    for d, label in DECADES.items():
        out.append(
            f'<line x1="{LEFT}" x2="{x(xmax)}" y1="{y(10**d):.1f}" y2="{y(10**d):.1f}" '
            f'stroke="#ddd"/><text x="{LEFT - 6}" y="{y(10**d) + 4:.1f}" '
            f'text-anchor="end">{label}</text>'
        )
    step = next(t for t in (0.25, 0.5, 1, 2, 5, 10, 20, 60) if t >= xmax / 10)
    for i in range(int(xmax / step) + 1):
        out.append(
            f'<text x="{x(i * step):.1f}" y="{bottom + 16}" text-anchor="middle">'
            f"{i * step:g} s</text>"
        )
    out.append(
        f'<text x="{x(xmax)}" y="{bottom + 32}" text-anchor="end">time since the first '
        f"epoch (the driver started {run['start_up_s']:.1f} s before it)</text>"
    )
    one = y(run["one_epoch_records"])
    out.append(
        f'<line x1="{LEFT}" x2="{x(xmax)}" y1="{one:.1f}" y2="{one:.1f}" stroke="#888" '
        'stroke-dasharray="2,3"/>'
    )
    if xmax >= AIM_S:
        out.append(vline(AIM_S, 'stroke="#c00" stroke-dasharray="5,4"'))
    if caught is not None:
        out.append(vline(caught, 'stroke="#090"'))
    steps = " ".join(
        f"{x(e['planned_s']):.1f},{y(e['records']):.1f} "
        f"{x(min(e['end_s'], xmax)):.1f},{y(e['records']):.1f}"
        for e in epochs
    )
    out.append(f'<polyline points="{steps}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    out += [
        f'<circle cx="{x(e["planned_s"]):.1f}" cy="{y(e["lag_before"]):.1f}" r="2.5" '
        'fill="#ff7f0e"/>'
        for e in epochs
    ]
    legend = {
        "#1f77b4": "epoch size (records)",
        "#ff7f0e": "lag before the epoch",
        "#888": "one caught-up epoch",
        "#090": "caught up",
        "#c00": f"aim: {AIM_S:.0f} s",
    }
    for i, (color, text) in enumerate(legend.items()):
        lx, ly = LEFT + 250 + 150 * (i % 3), oy + 14 + 15 * (i // 3)
        out.append(
            f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{ly}">{text}</text>'
        )
    return out


def summary_rows(runs: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| --emit | caught up after | epochs to catch up | peak epoch | epochs | catch-up "
        "events/s | events/s (whole run) | caught-up epochs (median) | checkpoints | start-up "
        "| output |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in runs:
        caught = "never" if r["caught_up_s"] is None else f"**{r['caught_up_s']:.1f} s**"
        if r["caught_up_s"] is not None and not r["caught_up_while_paced"]:
            caught += " (only as the source ended)"
        epochs_to = "" if r["caught_up_epoch"] is None else str(r["caught_up_epoch"] + 1)
        rows.append(
            f"| {r['emit']} | {caught} | {epochs_to} | {r['peak_epoch_records']:,} "
            f"| {r['epochs']} | {r['catch_up_events_per_s']:,.0f} | {r['events_per_s']:,.0f} "
            f"| {r['caught_up_epochs_median_records']:,.0f} records, "
            f"{r['caught_up_epochs_median_ms']:.0f} ms | {r['checkpoints']} "
            f"| {r['start_up_s']:.1f} s | {'correct' if r['correct'] else '**WRONG**'} |"
        )
    return rows


def epoch_rows(run: dict[str, Any], after: int = 5) -> list[str]:
    """The epochs until caught up and ``after`` more (the rest is in the JSON)."""
    settled = run["caught_up_epoch"]
    shown = run["per_epoch"] if settled is None else run["per_epoch"][: settled + 1 + after]
    rows = [
        f"Epochs of the --emit {run['emit']} run until caught up and {after} after "
        f"(all {run['epochs']} in catch_up.json):",
        "",
        "| epoch | planned at | records | lag before | caught-up size | duration | lag after |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, e in enumerate(shown):
        rows.append(
            f"| {i} | {e['planned_s']:.2f} s | {e['records']:,} | {e['lag_before']:,} "
            f"| {e['caught_up_size']:,} | {e['duration_ms']:.0f} ms | {e['lag_after']:,} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=20_000, help="events/s of the source")
    parser.add_argument("--backlog", type=int, default=2_000_000, help="events behind at start")
    parser.add_argument("--seconds", type=float, default=60, help="source time of the run")
    parser.add_argument("--apps", type=int, default=100)
    parser.add_argument(
        "--emit", action="append", choices=["epoch", "every"], help="default: epoch, every"
    )
    args = parser.parse_args()
    emits = args.emit or ["epoch", "every"]
    load = os.getloadavg()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session("local[*]", "sparkpoint-bench")
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-") as base:
        warm_up = argparse.Namespace(**{**vars(args), "backlog": 100_000, "seconds": 2})
        run_once(spark, base, "warm-up", "epoch", warm_up)  # Python workers, JIT: as bench_pv
        runs = [run_once(spark, base, f"catch-up-{emit}", emit, args) for emit in emits]
    spark.stop()
    header = (
        f"Catch-up: PV count paced at {args.rate:,.0f} events/s, started {args.backlog:,} "
        f"events behind, {args.seconds:.0f} s of source time, {args.apps} apps, checkpoints "
        f"every 1 s; {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        f"at start, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}, "
        f"commit {commit}\n\n"
        f"`.venv/bin/python tests/benchmarks/bench_catch_up.py --rate {args.rate:.0f} "
        f"--backlog {args.backlog} --seconds {args.seconds:.0f} "
        + " ".join(f"--emit {e}" for e in emits)
        + "`\n\n"
        f"*Caught up*: the first epoch after which the lag stays at most what one caught-up "
        f"epoch reads ({runs[0]['one_epoch_records']:,.0f} records: the arrivals of one "
        f"1 s epoch target); times from the first epoch (Spark's start-up excluded, shown "
        f"apart). Aim: within {AIM_S:.0f} s. Output: every app's last committed count "
        "equals its true count. Plot: [catch_up.svg](catch_up.svg)."
    )
    table = "\n".join([header, "", *summary_rows(runs), "", *epoch_rows(runs[0])])
    data: dict[str, object] = {"args": vars(args), "load": load, "commit": commit, "runs": runs}
    write_results("catch_up", table, data)
    (RESULTS / "catch_up.svg").write_text(svg_plot(runs))
    return 0 if all(r["correct"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
