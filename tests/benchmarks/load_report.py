"""The load benchmark's report: figures over the measured window, the results table, the
profile summaries and the time series (``bench_load.py`` measures; this writes it down).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

EVENT_SETS = {
    False: "acks carrying their barrier events, sink commits, heartbeats",
    True: "barriers injected and received, alignments, acks, sink commits, heartbeats",
}
PHASES = (
    "trigger -> command in Redis",
    "-> read by the job",
    "-> acks sent",
    "-> checkpoint_complete in Redis (ingest, completion, _metadata)",
    "-> read by the job",
)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


AIMS = {"rate": 0.95, "latency_p99_ms": 1000.0, "rest_p99_ms": 100.0}


def summarize(args: argparse.Namespace, r: dict[str, Any]) -> dict[str, Any]:
    """The figures of the table, over the measured window (after the warm-up)."""
    window = (args.warmup_s, r["sim_stopped_s"])
    span = window[1] - window[0]
    # Completions on the simulator's clock (it starts a little after this process's).
    sim_window = (r["started_ms"] + 1000 * args.warmup_s, r["started_ms"] + 1000 * r["wall_s"])
    rates, latencies = [], []
    # Where a checkpoint's time goes: trigger -> trigger command in Redis -> read by the job
    # -> acknowledgements sent -> checkpoint_complete in Redis -> read by the job.
    phases: dict[str, list[float]] = {name: [] for name in PHASES}
    for job in r["jobs"].values():
        for c in job["completed"]:
            if sim_window[0] <= c[2] <= sim_window[1] and len(c) == 7:
                _, trig, seen, trig_redis, trig_read, acks, done_redis = c
                marks = [trig, trig_redis, trig_read, acks, done_redis, seen]
                for name, a, b in zip(PHASES, marks, marks[1:], strict=False):
                    phases[name].append(float(b - a))
    for job in r["jobs"].values():
        inside = [c for c in job["completed"] if sim_window[0] <= c[2] <= sim_window[1]]
        seen = [c[2] for c in inside]
        latencies += [float(c[2] - c[1]) for c in inside]
        # Completions per second: from the first to the last one seen in the window (counting
        # them over the window would be off by up to one at each end).
        rates.append((len(seen) - 1) / ((seen[-1] - seen[0]) / 1000) if len(seen) > 2 else 0.0)
    rest: dict[str, list[float]] = {}
    errors = 0
    for t, label, ms, status in r["samples_rest"]:
        if window[0] <= t <= window[1]:
            rest.setdefault(label, []).append(ms)
            errors += status != 200
    series = [row for row in r["series"] if window[0] <= row["t_s"] <= window[1]]

    def trend(key: str) -> tuple[float, float, float]:
        values = [row[key] for row in series if key in row]
        if not values:
            return (float("nan"),) * 3
        k = max(1, len(values) // 5)
        return statistics.mean(values[:k]), statistics.mean(values[-k:]), max(values)

    delays = r["read_delays_ms"]
    stored = [
        body["summary"]["end_to_end_duration"]
        for body in r["api_checkpoints"].values()
        if isinstance(body, dict) and body.get("summary", {}).get("end_to_end_duration")
    ]
    return {
        "window_s": span,
        "rate_min": min(rates, default=0.0),
        "rate_median": statistics.median(rates) if rates else 0.0,
        "rate_mean": statistics.mean(rates) if rates else 0.0,
        "jobs_below_aim": sum(x < AIMS["rate"] for x in rates),
        "rate_overall": len(latencies) / max(1, len(rates)) / span,
        "completions": len(latencies),
        "latency_p50": percentile(latencies, 50),
        "latency_p99": percentile(latencies, 99),
        "latency_max": max(latencies, default=float("nan")),
        "phases": {k: (percentile(v, 50), percentile(v, 99)) for k, v in phases.items()},
        "stored_p50": statistics.median(x["p50"] for x in stored) if stored else float("nan"),
        "stored_p99": statistics.median(x["p99"] for x in stored) if stored else float("nan"),
        "stored_jobs": len(stored),
        "rest": {
            k: (percentile(v, 50), percentile(v, 99), max(v), len(v)) for k, v in rest.items()
        },
        "rest_p99_all": percentile([x for v in rest.values() for x in v], 99),
        "rest_errors": errors,
        "redis_memory": trend("redis_used_memory"),
        "server_rss": trend("server_rss"),
        "server_cpu": trend("server_cpu_pct"),
        "engine_cpu": trend("engine_cpu_pct") if args.api_process else None,
        "redis_cpu": trend("redis_cpu_pct"),
        "sim_cpu_pct": 100 * r["cpu_s"] / r["wall_s"],
        "events_backlog": trend("events_lag"),
        "read_delay_p50": percentile(delays, 50),
        "read_delay_p99": percentile(delays, 99),
        "events_sent": r["events_sent"],
        "events_ingested": r["ingested"],
        "dead_letters": r["dead_letters"],
        "lost": r["events_sent"] - r["ingested"] - r["dead_letters"],
        "aborted": sum(j["aborted"] for j in r["jobs"].values()),
        "restores": sum(max(0, j["restores"] - 1) for j in r["jobs"].values()),
        "ended": sum(bool(j["ended"]) for j in r["jobs"].values()),
        "gc": r.get("gc"),
        "run_s": r["sim_stopped_s"] + r["drain_s"],
    }


SPLIT = ": the API in it, the coordination in its engine child"
ONE = " with SPARKPOINT_API_PROCESS=false: the API and the coordination in it"


def mib(x: float) -> str:
    return f"{x / (1 << 20):,.1f} MiB"


def table(args: argparse.Namespace, s: dict[str, Any]) -> str:
    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lines = [
        "Load on a real control plane (`sparkpoint server` process"
        f"{SPLIT if args.api_process else ONE}, "
        f"{'PostgreSQL' if args.database_url else 'SQLite'}, its own Redis): {args.jobs} "
        f"simulated connected jobs x parallelism {args.parallelism} (2 vertices: "
        f"{2 * args.parallelism} acknowledgements per checkpoint), checkpoint interval 1 s, "
        f"{args.minutes:g} min ({s['window_s']:.0f} s measured after {args.warmup_s:g} s of "
        f"warm-up), acks {args.ack_delay_ms} ms after the trigger, "
        f"{EVENT_SETS[args.full_events]}; "
        f"one simulator process; REST sampled over HTTP every {args.rest_every_ms} ms; "
        f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| figure | measured | aim | |",
        "|---|---:|---:|---|",
        f"| checkpoints/s per job (min / median / mean) | {s['rate_min']:.3f} / "
        f"{s['rate_median']:.3f} / {s['rate_mean']:.3f} | >= 0.95 | "
        f"{verdict(s['rate_min'] >= AIMS['rate'])} ({s['jobs_below_aim']} jobs below) |",
        f"| completions per job and second of the window (all jobs) | "
        f"{s['rate_overall']:.3f} | >= 0.95 | |",
        f"| completion latency trigger -> `checkpoint_complete` at the job, p50 / p99 / max "
        f"({s['completions']:,} checkpoints) | {s['latency_p50']:.0f} / {s['latency_p99']:.0f} "
        f"/ {s['latency_max']:.0f} ms | p99 <= 1000 ms | "
        f"{verdict(s['latency_p99'] <= AIMS['latency_p99_ms'])} |",
    ]
    lines.append(
        f"| the same as the control plane stores it (trigger -> last ack applied; "
        f"`GET /jobs/{{id}}/checkpoints` summary, median of {s['stored_jobs']} jobs) p50 / p99 "
        f"| {s['stored_p50']:.0f} / {s['stored_p99']:.0f} ms | | |"
    )
    for name, (p50, p99) in s["phases"].items():
        lines.append(f"| &nbsp;&nbsp;{name} p50 / p99 | {p50:.0f} / {p99:.0f} ms | | |")
    for label, (p50, p99, worst, n) in sorted(s["rest"].items()):
        lines.append(
            f"| REST `{label}` p50 / p99 / max ({n} requests) | {p50:.1f} / {p99:.1f} / "
            f"{worst:.0f} ms | p99 <= 100 ms | {verdict(p99 <= AIMS['rest_p99_ms'])} |"
        )
    rm, rss = s["redis_memory"], s["server_rss"]
    lines += [
        f"| REST errors (non-200) | {s['rest_errors']} | 0 | {verdict(s['rest_errors'] == 0)} |",
        f"| Redis `used_memory`, first fifth / last fifth / max | {mib(rm[0])} / {mib(rm[1])} "
        f"/ {mib(rm[2])} | flat | {verdict(rm[1] <= 1.2 * rm[0] + (8 << 20))} |",
        f"| server RSS, first fifth / last fifth / max | {mib(rss[0])} / {mib(rss[1])} / "
        f"{mib(rss[2])} | flat | {verdict(rss[1] <= 1.2 * rss[0])} |",
        f"| events sent / ingested / dead-lettered / lost | {s['events_sent']:,} / "
        f"{s['events_ingested']:,.0f} / {s['dead_letters']:,.0f} / {s['lost']:,.0f} | 0 lost "
        f"| {verdict(s['lost'] == 0)} |",
        f"| events backlog in the stream (mean first / last fifth, max) | "
        f"{s['events_backlog'][0]:,.0f} / {s['events_backlog'][1]:,.0f}, "
        f"{s['events_backlog'][2]:,.0f} | ~0 | |",
        f"| checkpoints aborted / jobs restarted / jobs ended | {s['aborted']} / "
        f"{s['restores']} / {s['ended']} | 0 | |",
        f"| server CPU (mean first / last fifth) | {s['server_cpu'][0]:.0f}% / "
        f"{s['server_cpu'][1]:.0f}% | | |",
        *(
            [
                f"| engine process CPU (mean first / last fifth) | {s['engine_cpu'][0]:.0f}% / "
                f"{s['engine_cpu'][1]:.0f}% | | |"
            ]
            if s["engine_cpu"]
            else []
        ),
        f"| Redis CPU (mean first / last fifth) | {s['redis_cpu'][0]:.0f}% / "
        f"{s['redis_cpu'][1]:.0f}% | | |",
        *_gc_rows(s["gc"], s["run_s"]),
        f"| simulator CPU (whole run) / command read delay p50 / p99 | "
        f"{s['sim_cpu_pct']:.0f}% / {s['read_delay_p50']:.0f} / {s['read_delay_p99']:.0f} ms "
        f"| not the bottleneck | |",
    ]
    return "\n".join(lines)


def _gc_rows(gc: dict[str, list[float]] | None, run_s: float) -> list[str]:
    """The server's garbage-collector pauses over the whole run (its ``/metrics``)."""
    if not gc:
        return []
    total = sum(gc["seconds"])
    per_generation = ", ".join(
        f"gen {g}: {n:,.0f} / {1000 * gc['longest'][g]:.0f} ms"
        for g, n in enumerate(gc["collections"])
    )
    return [
        f"| server GC pauses, whole run: collections / longest per generation; time held | "
        f"{per_generation}; {total:.2f} s ({100 * total / run_s:.1f}% of the run) | | |"
    ]


def profile_summary(raw: str, top: int = 40) -> str:
    """py-spy's collapsed stacks as the share of samples per thread and per function
    (inclusive: a function counts once per stack it is in)."""
    threads: dict[str, int] = {}
    functions: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        total += n
        thread = re.sub(r"\(\d+\)|-\d+$", "", frames[0]).strip()
        threads[thread] = threads.get(thread, 0) + n
        for name in {f.split(" (")[0] for f in frames[1:]}:
            functions[name] = functions.get(name, 0) + n
    out = [f"{total} samples (100 Hz, on-CPU only); by thread:"]
    out += [
        f"{100 * n / total:5.1f}%  {t}"
        for t, n in sorted(threads.items(), key=lambda x: -x[1])[:12]
    ]
    out.append("by function (inclusive):")
    ranked = sorted(functions.items(), key=lambda x: -x[1])[:top]
    out += [f"{100 * n / total:5.1f}%  {f}" for f, n in ranked]
    return "\n".join(out) + "\n"


def wait_summary(raw: str, per_thread: int = 6) -> str:
    """Where each long-lived server thread spends its wall time (py-spy ``--idle``): its
    innermost Sparkpoint frame and the frame it is in."""
    places: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        thread = re.sub(r"\(\d+\)|-\d+$", "", frames[0]).strip()
        if not any(k in thread for k in ("sparkpoint-", "MainThread", "AnyIO")):
            continue
        ours = [f for f in frames[1:] if "sparkpoint" in f]
        place = f"{ours[-1].split(' (')[0] if ours else '-'} > {frames[-1].split(' (')[0]}"
        places.setdefault(thread, {})
        places[thread][place] = places[thread].get(place, 0) + int(count)
        totals[thread] = totals.get(thread, 0) + int(count)
    out = ["wall time of the server's threads (py-spy --idle), top places each:"]
    for thread, where in sorted(places.items()):
        out.append(f"{thread} ({totals[thread]} samples)")
        ranked = sorted(where.items(), key=lambda x: -x[1])[:per_thread]
        out += [f"  {100 * n / totals[thread]:5.1f}%  {w}" for w, n in ranked]
    return "\n".join(out) + "\n"


def write_series(rows: list[dict[str, float]], path: Path) -> None:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
