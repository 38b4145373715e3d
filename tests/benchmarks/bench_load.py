"""Load on a real control plane: many connected jobs checkpointing every second, for minutes.

    .venv/bin/python tests/benchmarks/bench_load.py [--jobs 200] [--parallelism 4] [--minutes 10]

Starts a Redis server of its own (``redis-server`` on a free port, no persistence; or
``--redis-url``) and a real ``sparkpoint server`` process on SQLite (or ``--database-url``),
then a simulator process (``load_sim.py``) that plays ``--jobs`` connected drivers through the
real protocol: each registers, reports RUNNING, answers every checkpoint the control plane
triggers on its command stream (barriers, 2n acknowledgements, sink commits) and sends
heartbeats. Meanwhile this process samples the REST API over HTTP (``GET /jobs`` and
``GET /jobs/{id}/checkpoints`` of a random job, alternately), Redis memory
(``INFO memory used_memory``), the events stream's backlog, and the CPU and RSS of the server,
Redis and the simulator. After the simulator stops, the server drains the stream and the
events it ingested are compared with those sent. The first ``--warmup-s`` seconds (all jobs
registering at once) are left out of the rates and latencies.

Writes ``tests/benchmarks/results/load.md`` (the table) and ``load.csv`` (the time series).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis
from load_report import (
    profile_summary,
    summarize,
    table,
    wait_summary,
    write_series,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results"
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout_s:g} s")


# ----------------------------------------------------------------------------- sampling


@dataclass
class Samples:
    """What the sampler threads collected; times in seconds since the simulator started."""

    rest: list[tuple[float, str, float, int]] = field(default_factory=list)
    series: list[dict[str, float]] = field(default_factory=list)


def sample_rest(
    base: str, stop: threading.Event, started: float, every_s: float, out: Samples
) -> None:
    """Alternate ``GET /jobs`` and ``GET /jobs/{id}/checkpoints`` (a random known job)."""
    rng = random.Random(1)
    job_ids: list[str] = []
    with httpx.Client(base_url=base, timeout=30.0) as http:
        turn = 0
        while not stop.wait(every_s):
            if turn % 2 == 0 or not job_ids:
                path, label = "/jobs", "GET /jobs"
            else:
                path, label = (
                    f"/jobs/{rng.choice(job_ids)}/checkpoints",
                    "GET /jobs/{id}/checkpoints",
                )
            t0 = time.perf_counter()
            try:
                response = http.get(path)
                status = response.status_code
            except httpx.HTTPError:
                status = 0
            elapsed_ms = (time.perf_counter() - t0) * 1000
            out.rest.append((time.monotonic() - started, label, elapsed_ms, status))
            if label == "GET /jobs" and status == 200:
                body = response.json()
                jobs = body.get("jobs", body) if isinstance(body, dict) else body
                job_ids = [j.get("jid") or j.get("id") or j.get("job_id") for j in jobs]
                job_ids = [j for j in job_ids if j]
            turn += 1


def sample_resources(
    client: redis.Redis,
    events_stream: str,
    procs: dict[str, psutil.Process],
    stop: threading.Event,
    started: float,
    every_s: float,
    out: Samples,
) -> None:
    """Every ``every_s``: Redis memory, the events backlog, CPU and RSS of each process."""
    last_cpu = {name: sum(proc.cpu_times()[:2]) for name, proc in procs.items()}
    last_t = time.monotonic()
    while not stop.wait(every_s):
        now = time.monotonic()
        row: dict[str, float] = {"t_s": round(now - started, 1)}
        try:
            row["redis_used_memory"] = int(client.info("memory")["used_memory"])
            row["events_stream_length"] = int(client.xlen(events_stream))
            groups = client.xinfo_groups(events_stream)
            row["events_pending"] = sum(int(g["pending"]) for g in groups)
            row["events_lag"] = sum(int(g.get("lag") or 0) for g in groups)
        except redis.RedisError:
            pass
        for name, proc in procs.items():
            try:
                cpu = sum(proc.cpu_times()[:2])
                row[f"{name}_cpu_pct"] = round(100 * (cpu - last_cpu[name]) / (now - last_t), 1)
                row[f"{name}_rss"] = proc.memory_info().rss
                last_cpu[name] = cpu
            except psutil.Error:
                pass
        row["load_avg_1m"] = os.getloadavg()[0]
        last_t = now
        out.series.append(row)


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if re.match(rf"^{re.escape(name)}(\{{.*\}})?\s", line):
            total += float(line.rsplit(None, 1)[1])
    return total


# ----------------------------------------------------------------------------- the run


def start_redis(base: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", str(base)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    wait_for(lambda: redis.Redis.from_url(url).ping(), 10, "redis-server")
    return proc, url


def start_server(
    base: Path, redis_url: str, prefix: str, database_url: str | None, api_process: bool = True
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "SPARKPOINT_DATA_DIR": str(base / "server"),
        "SPARKPOINT_STREAM_PREFIX": prefix,
        "SPARKPOINT_API_TOKEN": secrets.token_urlsafe(24),
    }
    env.pop("DATABASE_URL", None)
    env["SPARKPOINT_API_PROCESS"] = "true" if api_process else "false"
    if database_url:
        env["DATABASE_URL"] = database_url
    log = (base / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(VENV_BIN / "sparkpoint"), "server", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, 60, "sparkpoint server")
    return proc, url


def drain(client: redis.Redis, stream: str, timeout_s: float) -> float:
    """Wait until the control plane read and acknowledged every event; returns the seconds."""
    t0 = time.monotonic()

    def drained() -> bool:
        groups = client.xinfo_groups(stream)
        return all(int(g["pending"]) == 0 and int(g.get("lag") or 0) == 0 for g in groups)

    wait_for(drained, timeout_s, "the events stream drained")
    return time.monotonic() - t0


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    prefix = f"load-{uuid.uuid4().hex[:8]}"
    redis_proc = None
    redis_url = args.redis_url
    if not redis_url:
        redis_proc, redis_url = start_redis(base)
    server, api = start_server(base, redis_url, prefix, args.database_url, args.api_process)
    client = redis.Redis.from_url(redis_url)
    events_stream = f"{prefix}:events"
    seconds = args.minutes * 60
    samples = Samples()
    stop = threading.Event()
    sim_out = base / "sim.json"
    sim = subprocess.Popen(
        [sys.executable, str(HERE / "load_sim.py"), "--redis-url", redis_url]
        + ["--prefix", prefix, "--jobs", str(args.jobs), "--parallelism", str(args.parallelism)]
        + ["--seconds", str(seconds), "--ack-delay-ms", str(args.ack_delay_ms)]
        + ["--checkpoint-dir", str(base / "checkpoints"), "--out", str(sim_out)]
        + ["--data-dir", str(base / "server")]
        + (["--full-events"] if args.full_events else [])
    )
    started = time.monotonic()
    procs = {"server": psutil.Process(server.pid), "simulator": psutil.Process(sim.pid)}
    if redis_proc is not None:
        procs["redis"] = psutil.Process(redis_proc.pid)
    if args.api_process:  # the engine: the server's Python child (the API is the server)
        engines = [c for c in procs["server"].children() if "spawn_main" in " ".join(c.cmdline())]
        if len(engines) != 1:  # nothing may outlive the run
            for proc in (sim, server, redis_proc):
                if proc is not None:
                    proc.kill()
            raise RuntimeError(f"expected one engine process, found {engines}")
        procs["engine"] = engines[0]
    threads = [
        threading.Thread(
            target=sample_rest, args=(api, stop, started, args.rest_every_ms / 1000, samples)
        ),
        threading.Thread(
            target=sample_resources,
            args=(client, events_stream, procs, stop, started, args.sample_every_s, samples),
        ),
    ]
    for thread in threads:
        thread.start()
    profiles: dict[str, str] = {}
    try:
        if args.py_spy:  # mid-run: 20 s of CPU samples, then 20 s of every thread (waits too)
            time.sleep(max(0.0, min(seconds / 2, seconds - 50)))
            for name, extra in (("cpu", []), ("wall", ["--idle"])):
                out_file = base / f"server.pyspy-{name}.txt"
                subprocess.run(
                    [
                        *(args.py_spy, "record", "--pid", str(server.pid), "--duration", "20"),
                        *("--format", "raw", "--output", str(out_file), "--nonblocking"),
                        *("--threads", *extra),
                    ],
                    capture_output=True,
                    check=False,
                )
                if out_file.exists():
                    profiles[name] = out_file.read_text()
        sim.wait(timeout=seconds + 600)
        sim_stopped = time.monotonic() - started
        drain_s = drain(client, events_stream, 300)
        metrics = httpx.get(f"{api}/metrics").text
        final = (
            {
                job: httpx.get(f"{api}/jobs/{job}/checkpoints").json()
                for job in random.Random(2).sample(
                    [j["id"] for j in httpx.get(f"{api}/jobs").json()["jobs"]], min(5, args.jobs)
                )
            }
            if args.jobs
            else {}
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        if sim.poll() is None:
            sim.kill()
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
    result = json.loads(sim_out.read_text())
    result.update(
        samples_rest=samples.rest,
        series=samples.series,
        sim_stopped_s=sim_stopped,
        drain_s=drain_s,
        ingested=metric(metrics, "sparkpoint_events_ingested_total"),
        dead_letters=metric(metrics, "sparkpoint_dead_letters_total"),
        stale=metric(metrics, "sparkpoint_stale_messages_total"),
        gc={
            what: [metric(metrics, f'{name}{{generation="{g}"}}') for g in range(3)]
            for what, name in (
                ("collections", "sparkpoint_gc_collections_total"),
                ("seconds", "sparkpoint_gc_pause_seconds_total"),
                ("longest", "sparkpoint_gc_pause_max_seconds"),
            )
        },
        api_checkpoints=final,
        py_spy=profiles,
        server_log_tail=(base / "server.log").read_text(errors="replace")[-4000:],
    )
    return result


# ----------------------------------------------------------------------------- the results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, help="default: 10%% of the run, at most 60 s")
    parser.add_argument("--ack-delay-ms", type=int, default=0)
    parser.add_argument("--full-events", action="store_true")
    parser.add_argument(
        "--one-process",
        dest="api_process",
        action="store_false",
        help="SPARKPOINT_API_PROCESS=false: the API and the coordination in one server process "
        "(default: the API in the server process, the coordination in its child, the engine)",
    )
    parser.add_argument("--redis-url", help="an existing Redis (default: start redis-server)")
    parser.add_argument("--database-url", help="default: SQLite in the server's data directory")
    parser.add_argument("--rest-every-ms", type=int, default=100)
    parser.add_argument("--sample-every-s", type=float, default=5.0)
    parser.add_argument("--py-spy", help="py-spy binary: profile the server for 30 s mid-run")
    parser.add_argument("--keep-dir", help="work here (server log, database) and keep it")
    parser.add_argument("--results", default=str(RESULTS), help="directory of load.md/.csv")
    args = parser.parse_args()
    if args.warmup_s is None:
        args.warmup_s = min(60.0, args.minutes * 6)
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-load-") as tmp:
        base = Path(args.keep_dir or tmp)
        base.mkdir(parents=True, exist_ok=True)
        result = run(args, base)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    figures = summarize(args, result)
    text = table(args, figures)
    print(text)
    (out / "load.md").write_text(text + "\n")
    write_series(result["series"], out / "load.csv")
    if result["py_spy"]:
        (out / "load-server-profile.txt").write_text(
            profile_summary(result["py_spy"].get("cpu", ""))
            + "\n"
            + wait_summary(result["py_spy"].get("wall", ""))
        )
    if figures["lost"] or figures["dead_letters"]:
        print(result["server_log_tail"], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
