"""Control-plane event ingest: events per second from a Redis stream into the database.

The stream is filled first with the events that running jobs send for each checkpoint
(acknowledgements with handles and their barrier's time and alignment, sink commits,
heartbeats; and, for comparison in the same run, the barrier and alignment events apart, as
jobs sent them before), for checkpoints the control plane triggered; then the real ingest
path drains it: ``EventConsumer`` (XREADGROUP, decode, dead letters) →
``ControlPlane.handle_batch`` (one transaction per batch: coordinator, completions with
``_metadata`` files, rows) → XACK.
Batch sizes are compared within one run, on SQLite (the default) and on PostgreSQL. With
``--signed`` the events are signed as a job signs them and the consumer verifies them, as the
server's ingest does (``sparkpoint.signing``; every sender's sequence numbers are checked).

    .venv/bin/python tests/benchmarks/bench_ingest.py [--jobs 10] [--checkpoints 100] [--signed]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, text

from sparkpoint import protocol as p
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.signing import Signer
from sparkpoint.transport import RedisEventSink, Streams, redis_client
from sparkpoint_server.app import GC_THRESHOLDS
from sparkpoint_server.config import load_settings, normalize_database_url
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats
from sparkpoint_server.service.control_plane import ControlPlane
from sparkpoint_server.storage.db import create_db_engine, migrate, session_factory
from sparkpoint_server.storage.models import Checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from bench_pv import write_results

# The two event mixes: what connected jobs send now, and before their acknowledgements
# carried the barrier events.
FOLDED, APART = "in the acks", "apart"
MIXES = (APART, FOLDED)


def vertices(parallelism: int) -> list[p.VertexModel]:
    return [
        p.VertexModel(id="source", name="source", parallelism=parallelism, operators=["source"]),
        p.VertexModel(
            id="pv", name="pv -> sink", parallelism=parallelism, operators=["pv", "sink"]
        ),
    ]


def checkpoint_events(
    job: str, cid: int, now: int, handle: p.StateHandleModel, parallelism: int, folded: bool
) -> list[Any]:
    """What one job sends for one checkpoint with parallelism n. ``folded`` (connected jobs
    since the acknowledgements carry their barrier events): 2n acknowledgements, n sink
    commits, a heartbeat, 13 events for n = 4 and 49 for n = 16. Otherwise (before): n
    barriers injected, n received (a keyed subtask reports the first barrier of its input,
    not every channel's), n alignments, then the same: 25 events for n = 4, 97 for n = 16."""
    out: list[Any] = []
    for i in range(parallelism if not folded else 0):
        out.append(
            p.BarrierInjected(
                checkpoint_id=cid,
                operator_id="source",
                subtask=i,
                epoch=cid,
                split_id=f"s{i}",
                offset=cid * 1000,
                timestamp=now,
            )
        )
    for i in range(parallelism if not folded else 0):
        out.append(
            p.BarrierReceived(
                checkpoint_id=cid, operator_id="pv", subtask=i, channel=0, timestamp=now
            )
        )
        out.append(
            p.AlignmentCompleted(
                checkpoint_id=cid,
                operator_id="pv",
                subtask=i,
                duration_ms=3.0,
                buffered_bytes=1024,
                buffered_records=10,
            )
        )
    for op in ("source", "pv"):
        for i in range(parallelism):
            out.append(
                p.SnapshotCompleted(
                    checkpoint_id=cid,
                    operator_id=op,
                    subtask=i,
                    epoch=cid,
                    ack_timestamp=now + 5,
                    start_delay_ms=1.0,
                    alignment_duration_ms=3.0,
                    alignment_buffered_bytes=1024,
                    sync_duration_ms=2.0,
                    async_duration_ms=4.0,
                    state_size=4096,
                    checkpointed_size=4096,
                    handles=[handle],
                    source_positions={f"s{i}": cid * 1000} if op == "source" else {},
                    sink_transactions=[
                        p.SinkTransactionModel(transaction_id=f"{cid}-{i}", parts=[f"part-{i}"])
                    ]
                    if op == "pv"
                    else [],
                    barrier_timestamp=now if folded else None,
                    alignment_buffered_records=(10 if op == "pv" else 0) if folded else None,
                )
            )
    out += [
        p.SinkCommitted(
            checkpoint_id=cid, operator_id="pv", subtask=i, transaction_id=f"{cid}-{i}", parts=1
        )
        for i in range(parallelism)
    ]
    out.append(
        p.Heartbeat(
            epoch=cid,
            records=100_000,
            duration_ms=1000.0,
            records_per_second=100_000.0,
            source_lag=0,
            host_time=now,
        )
    )
    return out


def run_once(
    database_url: str,
    redis_url: str,
    jobs: int,
    checkpoints: int,
    batch: int,
    base: str,
    parallelism: int = 4,
    signed: bool = False,
    folded: bool = True,
) -> dict[str, float]:
    """Register jobs, trigger their checkpoints, fill the stream, then time the drain."""
    migrate(database_url)
    engine = create_db_engine(database_url)
    sessions = session_factory(engine)
    client = redis_client(redis_url)
    streams = Streams(prefix=f"bench-{uuid.uuid4().hex[:8]}")
    settings = load_settings(data_dir=os.path.join(base, "data"))
    stats = IngestStats()
    plane = ControlPlane(settings, sessions, client, streams=streams, stats=stats)
    consumer = EventConsumer(
        client,
        plane.handle_batch,
        stats,
        streams=streams,
        batch_size=batch,
        verifier=plane.verify_event if signed else None,
    )
    consumer.ensure_group()
    signer = Signer(plane.key_of, f"bench-{uuid.uuid4().hex[:8]}") if signed else None
    sink = RedisEventSink(client, streams, signer=signer)
    ids = [f"bench-{uuid.uuid4().hex[:10]}" for _ in range(jobs)]
    config = {
        "interval_ms": 0,
        "max_concurrent": checkpoints + 1,
        "timeout_ms": 3_600_000,
        "retained": 3,
        "checkpoint_storage": "filesystem",
        "checkpoint_dir": f"file://{base}/checkpoints",
    }
    for job in ids:
        sink.publish(
            [
                p.envelope(
                    job,
                    0,
                    0,
                    p.JobRegistered(
                        job_name="pv",
                        vertices=vertices(parallelism),
                        edges=[("source", "pv")],
                        config=config,
                        incarnation="bench",
                    ),
                )
            ]
        )
        sink.publish([p.envelope(job, 1, 0, p.JobStatusChanged(status=p.JobStatus.RUNNING))])
    while consumer.poll_once():
        pass
    for job in ids:  # the control plane assigns the ids (one unit of work each; not timed)
        for _ in range(checkpoints):
            plane.trigger_checkpoint(job)
    total = 0
    now = int(time.time() * 1000)
    storage = FileSystemCheckpointStorage(str(config["checkpoint_dir"]))
    for cid in range(1, checkpoints + 1):
        envelopes = []
        for job in ids:  # the subtasks' state files, as a job writes them (one per checkpoint)
            handle = storage.write_state(job, cid, "state", b"x" * 4096)
            envelopes += [
                p.envelope(job, 1, now, e)
                for e in checkpoint_events(job, cid, now, handle, parallelism, folded)
            ]
        sink.publish(envelopes)
        total += len(envelopes)
    before = stats.events_ingested
    started, cpu_started = time.perf_counter(), time.process_time()
    while consumer.poll_once():
        pass
    # The last completions' writes, their finishing units and the retention deletes end on
    # other threads after the stream is drained: they are part of the ingest's work.
    plane.wait_idle()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started  # every thread of this process
    ingested = stats.events_ingested - before
    with sessions() as s:
        completed = s.execute(
            select(func.count())
            .select_from(Checkpoint)
            .where(Checkpoint.status == "COMPLETED", Checkpoint.job_id.in_(ids))
        ).scalar_one()
    for key in client.scan_iter(f"{streams.prefix}:*"):
        client.delete(key)
    engine.dispose()
    assert ingested == total, f"ingested {ingested} of {total}"
    assert stats.dead_letters == 0, f"{stats.dead_letters} dead letters"
    assert completed == jobs * checkpoints, f"{completed} completed"
    return {
        "events": total,
        "completions": jobs * checkpoints,
        "seconds": elapsed,
        "events_per_s": total / elapsed,
        "cpu_ms_per_completion": 1000 * cpu / (jobs * checkpoints),
    }


def measure_in_process(args: argparse.Namespace) -> int:
    """``--one``: one measurement in this (fresh) process; prints its result as JSON."""
    # As the server does at start (sparkpoint_server.app): a long-lived process keeps its
    # start-up objects out of the cyclic GC and collects less often.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-ingest-") as base:
        url = args.database or f"sqlite:///{base}/ingest.db"
        result = run_once(
            url,
            args.redis_url,
            args.jobs,
            args.checkpoints,
            args.batch,
            base,
            args.parallelism,
            args.signed,
            not args.apart,
        )
    print(json.dumps(result))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get("DATABASE_TEST_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument(
        "--signed", action="store_true", help="sign the events and verify them (as the server)"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--apart", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1000, help=argparse.SUPPRESS)
    parser.add_argument("--parallelism", type=int, default=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return measure_in_process(args)
    # Each measurement runs in a fresh process, as a control plane does, repeated; the table
    # gives the median and the range.
    runs: dict[str, list[dict[str, float]]] = {}
    pg_admin = normalize_database_url(args.postgres)
    admin = create_engine(pg_admin, isolation_level="AUTOCOMMIT")
    for repeat in range(args.repeats):
        for parallelism, checkpoints in (
            (4, args.checkpoints),
            (16, max(1, args.checkpoints // 8)),
        ):
            for batch in (100, 1000):
                for db, mix in itertools.product(("sqlite", "postgresql"), MIXES):
                    label = f"{parallelism}+{parallelism} | {db} | {batch} | {mix}"
                    command = [
                        sys.executable,
                        __file__,
                        "--one",
                        "--jobs",
                        str(args.jobs),
                        "--checkpoints",
                        str(checkpoints),
                        "--batch",
                        str(batch),
                        "--parallelism",
                        str(parallelism),
                        "--redis-url",
                        args.redis_url,
                        *(["--signed"] if args.signed else []),
                        *(["--apart"] if mix == APART else []),
                    ]
                    pg_name = f"sparkpoint_bench_{uuid.uuid4().hex[:8]}"
                    if db == "postgresql":
                        with admin.connect() as conn:
                            conn.execute(text(f'CREATE DATABASE "{pg_name}"'))
                        command += ["--database", pg_admin.rsplit("/", 1)[0] + f"/{pg_name}"]
                    try:
                        out = subprocess.run(
                            command, capture_output=True, text=True, check=True, timeout=600
                        ).stdout
                    finally:
                        if db == "postgresql":
                            with admin.connect() as conn:
                                conn.execute(
                                    text(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
                                )
                    result = json.loads(out.strip().splitlines()[-1])
                    runs.setdefault(label, []).append(result)
                    print(
                        f"run {repeat + 1}: {label}: {result['events_per_s']:,.0f} events/s",
                        flush=True,
                    )
    admin.dispose()
    rows = [
        "| parallelism | database | XREADGROUP batch | barrier events | events | completions "
        "| median events/s | runs (events/s) | median completions/s "
        "| CPU per completion (median, all threads) |",
        "|---|---|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    completions_per_s = {}
    for label, results in runs.items():
        rates = sorted(r["events_per_s"] for r in results)
        per_completion = results[0]["events"] / results[0]["completions"]
        completions_per_s[label] = statistics.median(rates) / per_completion
        rows.append(
            f"| {label} | {results[0]['events']:,.0f} | {results[0]['completions']:,.0f} "
            f"| {statistics.median(rates):,.0f} | {', '.join(f'{x:,.0f}' for x in rates)} "
            f"| {completions_per_s[label]:,.0f} "
            f"| {statistics.median(r['cpu_ms_per_completion'] for r in results):.2f} ms |"
        )
    rows.append("")
    for label, rate in completions_per_s.items():
        if label.endswith(FOLDED):
            before = completions_per_s[label.removesuffix(FOLDED) + APART]
            config = label.removesuffix(f" | {FOLDED}")
            rows.append(
                f"- {config}: completed checkpoints per second with the barrier events in the "
                f"acks / apart = **{rate / before:.2f}**"
            )
    table = "\n".join(
        [
            f"Control-plane ingest from Redis into the database, {args.jobs} jobs; per job and "
            "checkpoint, as connected jobs send them: 2n acknowledgements carrying the "
            "barrier's time and alignment, n sink commits, one heartbeat (13 events for n = 4, "
            "49 for n = 16); before (barrier events apart): n barriers injected, n received, "
            "n alignments besides (25 and 97 events). Every checkpoint completes (`_metadata` "
            "written, rows, notification, retention deletes the subsumed one's files). "
            + (
                "Events signed by the jobs and verified by the ingest, as in the server. "
                if args.signed
                else "Events unsigned and not verified (the server verifies them: --signed). "
            )
            + "Each run in a fresh process "
            f"(GC as the server sets it), {args.repeats} runs each, interleaved.",
            "",
            *rows,
        ]
    )
    write_results("ingest", table, {"args": vars(args), "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
