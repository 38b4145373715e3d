"""How long a connected job's output waits after its checkpoint completed, with the driver
obeying completions while an epoch runs (today) and only between epochs (before).

    make bench-commit-latency   # or: .venv/bin/python tests/benchmarks/bench_commit_latency.py

Starts a real ``sparkpoint server`` (the tests' Redis at 127.0.0.1:6379, SQLite) and runs the
example PV job connected to it on one shared local SparkSession, paced (``--rate``), with a
checkpoint every second, alternating the two configurations so that warm-up and machine noise
hit both alike. "Between epochs only" is today's driver with its reader told to obey nothing
while an epoch runs (every command then waits for the epoch's end, as before).

Times come from Redis itself (a stream entry's id is the Redis server's clock at ``XADD``),
read through consumer groups of the benchmark's own, so that nothing is trimmed before it is
read: per checkpoint, from the control plane's ``checkpoint_complete`` command to the last
``sink_committed`` event of the job (*commit delay*: what this change moves), and from the
``trigger_checkpoint`` command to that event (*trigger to output*: when a checkpoint's output
becomes visible). Writes ``tests/benchmarks/results/commit_latency.md`` and ``.json``.
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
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "jobs")]

from tests.e2e.control_plane import ServerProcess  # noqa: E402
from tests.support.redis_server import REDIS_URL  # noqa: E402

from examples import pv_count  # noqa: E402
from sparkpoint import protocol as p  # noqa: E402
from sparkpoint.checkpointing.config import CheckpointConfig  # noqa: E402
from sparkpoint.graph import StreamExecutionEnvironment  # noqa: E402
from sparkpoint.options import JobOptions  # noqa: E402
from sparkpoint.runtime.connected import ControlPlaneAuthority  # noqa: E402
from sparkpoint.runtime.driver import JobDriver  # noqa: E402
from sparkpoint.runtime.spark import spark_session  # noqa: E402
from sparkpoint.transport import FIELD, Streams, redis_client  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DURING = "completions obeyed while an epoch runs"
BETWEEN = "completions obeyed between epochs only"
GROUP = "bench-commit-latency"


def _entry_ms(entry_id: bytes) -> int:
    return int(entry_id.split(b"-")[0])


def _read_all(client: Any, stream: str) -> list[tuple[int, p.Envelope, Any]]:
    """Every entry of ``stream`` since the benchmark's group was made, with its Redis time."""
    out: list[tuple[int, p.Envelope, Any]] = []
    while True:
        answer = client.xreadgroup(GROUP, "bench", {stream: ">"}, count=10_000)
        entries = [e for _, es in answer or [] for e in es]
        if not entries:
            return out
        for entry_id, fields in entries:
            env, payload = p.decode(fields[FIELD])
            out.append((_entry_ms(entry_id), env, payload))


def run_once(
    spark: Any, server: ServerProcess, base: str, name: str, events: int, rate: float
) -> dict[str, Any]:
    client = redis_client(REDIS_URL)
    streams = Streams(server.prefix)
    job_id = name
    for stream in (streams.events, streams.commands(job_id)):
        try:  # (the events stream's group reads on from the run before)
            client.xgroup_create(stream, GROUP, id="$", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
    options = JobOptions(
        job_id=job_id,
        standalone=False,
        redis_url=REDIS_URL,
        stream_prefix=server.prefix,
        checkpoint=CheckpointConfig(interval_ms=1000),
        checkpoint_dir=f"file://{base}/{name}/chk",
        checkpoint_storage="filesystem",
        local_dir=os.path.join(base, name, "local"),
    )
    env = StreamExecutionEnvironment(options)
    out = os.path.join(base, name, "out")
    argv = ["--events", str(events), "--apps", "100", "--rate", str(rate), "--emit", "epoch"]
    pv_count.build(env, [*argv, "--output", out])
    env.graph.name = "pv-commit-latency"
    started = time.perf_counter()
    result = JobDriver(env.graph, options, spark=spark).run()
    wall = time.perf_counter() - started
    assert result.status is p.JobStatus.FINISHED and result.records == events, result
    commands = _read_all(client, streams.commands(job_id))
    job_events = [e for e in _read_all(client, streams.events) if e[1].job_id == job_id]
    triggered = {c.checkpoint_id: t for t, _, c in commands if isinstance(c, p.TriggerCheckpoint)}
    notified = {
        c.checkpoint_id: t for t, _, c in commands if isinstance(c, p.NotifyCheckpointComplete)
    }
    committed: dict[int, int] = {}
    for t, _, ev in job_events:
        if isinstance(ev, p.SinkCommitted):
            committed[ev.checkpoint_id] = max(t, committed.get(ev.checkpoint_id, 0))
    regular = sorted(set(notified) & set(committed) & set(triggered))
    return {
        "seconds": wall,
        "events_per_s": events / wall,
        "epochs": result.epochs,
        "checkpoints": len(regular),
        "commit_delay_ms": [committed[c] - notified[c] for c in regular],
        "trigger_to_output_ms": [committed[c] - triggered[c] for c in regular],
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--rate", type=float, default=500_000, help="events/s (paced)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = spark_session("local[2]", "sparkpoint-bench-commit-latency")
    obey_during = ControlPlaneAuthority._obey_while_running
    runs: dict[str, list[dict[str, Any]]] = {DURING: [], BETWEEN: []}
    with tempfile.TemporaryDirectory() as base:
        server = ServerProcess(Path(base) / "server")
        server.data_dir.mkdir()
        server.start()
        os.environ["SPARKPOINT_DATA_DIR"] = str(server.data_dir)  # the drivers' job keys
        try:
            warm = run_once(spark, server, base, "warm-up", args.events // 10, args.rate)
            print(f"warm-up: {warm['events_per_s']:,.0f} events/s", flush=True)
            for i in range(args.repeats):
                for label in (DURING, BETWEEN):
                    if label == BETWEEN:
                        ControlPlaneAuthority._obey_while_running = (  # type: ignore[method-assign]
                            lambda self, message: False
                        )
                    try:
                        name = f"{'during' if label == DURING else 'between'}-{i}"
                        r = run_once(spark, server, base, name, args.events, args.rate)
                    finally:
                        ControlPlaneAuthority._obey_while_running = obey_during  # type: ignore[method-assign]
                    runs[label].append(r)
                    print(
                        f"{label}: {r['events_per_s']:,.0f} events/s, {r['epochs']} epochs, "
                        f"commit delay p50 {statistics.median(r['commit_delay_ms']):.0f} ms",
                        flush=True,
                    )
        finally:
            server.stop()
    spark.stop()
    write_results(args, runs)


def write_results(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> None:
    RESULTS.mkdir(exist_ok=True)
    command = (
        ".venv/bin/python tests/benchmarks/bench_commit_latency.py "
        f"--events {args.events} --rate {args.rate:g} --repeats {args.repeats}"
    )
    lines = [
        f"PV count connected to `sparkpoint server`, {args.events:,} events paced at "
        f"{args.rate:,.0f}/s, 100 apps, --emit epoch, a checkpoint every 1 s, "
        f"{os.cpu_count()} cores, {platform.python_version()}, {time.strftime('%Y-%m-%d')}",
        "",
        f"`{command}`",
        "",
        "| configuration | checkpoints | commit delay p50 | p99 | trigger to output p50 | p99 "
        "| events/s (median) | epochs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary: dict[str, Any] = {}
    for label, rs in runs.items():
        delay = [d for r in rs for d in r["commit_delay_ms"]]
        output = [d for r in rs for d in r["trigger_to_output_ms"]]
        rate = statistics.median(r["events_per_s"] for r in rs)
        summary[label] = {
            "commit_delay_p50_ms": _percentile(delay, 0.5),
            "commit_delay_p99_ms": _percentile(delay, 0.99),
            "trigger_to_output_p50_ms": _percentile(output, 0.5),
            "trigger_to_output_p99_ms": _percentile(output, 0.99),
            "events_per_s": rate,
        }
        s = summary[label]
        lines.append(
            f"| {label} | {len(delay)} | {s['commit_delay_p50_ms']:.0f} ms "
            f"| {s['commit_delay_p99_ms']:.0f} ms | {s['trigger_to_output_p50_ms']:.0f} ms "
            f"| {s['trigger_to_output_p99_ms']:.0f} ms | {rate:,.0f} "
            f"| {statistics.median(r['epochs'] for r in rs):.0f} |"
        )
    during, between = summary[DURING], summary[BETWEEN]
    lines += [
        "",
        "Commit delay: from the control plane's `checkpoint_complete` to the job's last "
        "`sink_committed` of that checkpoint; trigger to output: from `trigger_checkpoint` to "
        "that event (Redis's clock at each `XADD`).",
        "",
        f"commit delay p50 **{between['commit_delay_p50_ms']:.0f} ms -> "
        f"{during['commit_delay_p50_ms']:.0f} ms** (between epochs only -> while an epoch "
        f"runs); trigger to output p50 {between['trigger_to_output_p50_ms']:.0f} ms -> "
        f"{during['trigger_to_output_p50_ms']:.0f} ms; throughput while an epoch runs / "
        f"between epochs only: **{during['events_per_s'] / between['events_per_s']:.3f}** "
        "(paced: both near the rate)",
        "",
    ]
    (RESULTS / "commit_latency.md").write_text("\n".join(lines))
    (RESULTS / "commit_latency.json").write_text(
        json.dumps({"command": command, "summary": summary, "runs": runs}, indent=1) + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
