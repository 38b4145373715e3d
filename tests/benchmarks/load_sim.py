"""Simulated connected jobs for the load benchmark: many drivers in one thread, real protocol.

Each :class:`SimulatedJob` does what a connected driver does (``runtime/connected.py``): it
opens its command stream (consumer group ``job``), registers under attempt 0 with a graph of
two vertices (``source`` and ``pv -> sink``, parallelism n each), obeys the ``restore`` that
starts attempt 1 (``job_restored``, then ``RUNNING``), and answers every checkpoint the control
plane triggers: after ``ack_delay_ms``, 2n ``snapshot_completed`` (inline state handles,
source positions, sink transactions, and the barrier's time and alignment, which a connected
job's acknowledgements carry) and, with ``full_events`` (what jobs sent before they folded
their barrier events into the acknowledgements), n ``barrier_injected`` at once and, with the
acknowledgements, the n ``barrier_received`` (one per keyed subtask: its input's first) and n
``alignment_completed`` of a keyed shuffle; on ``checkpoint_complete`` its sinks commit (n
``sink_committed``). It sends a metrics ``heartbeat`` every second (one per epoch) and a
``driver_heartbeat`` every ``heartbeat_interval_ms``.

One :class:`Simulator` drives all of them from one loop: one ``XREADGROUP`` over every
command stream, then one pipeline with every event due (``XADD``), the commands' ``XACK`` and,
every few seconds, an ``XTRIM`` of what was acknowledged (a driver trims its own commands).

    .venv/bin/python tests/benchmarks/load_sim.py --redis-url URL --prefix P --jobs 200 \
        --seconds 600 --out sim.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import resource
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "jobs")]

from sparkpoint import protocol as p  # noqa: E402
from sparkpoint.checkpointing.jobmanager_storage import JobManagerCheckpointStorage  # noqa: E402
from sparkpoint.transport import COMMANDS_GROUP, FIELD, Streams, redis_client  # noqa: E402

try:  # drivers sign their events with their job's key (``sparkpoint.signing``)
    from sparkpoint import signing
except ImportError:  # a tree from before signed events
    signing = None  # type: ignore[assignment]

HEARTBEAT_EVERY_MS = 1000  # one metrics heartbeat per (1 s) epoch
TRIM_EVERY_MS = 5000
CONSUMER = "sim"


def now_ms() -> int:
    return int(time.time() * 1000)


def _fixed_key(key: bytes) -> Callable[[str], bytes]:
    """A signer's key lookup that answers ``key`` for every job (one simulated job's)."""
    return lambda _job_id: key


@dataclass
class SimulatedJob:
    """One simulated driver: its attempt, what it was told, what it saw completed."""

    job_id: str
    parallelism: int
    handle: p.StateHandleModel
    attempt: int = 0
    started: bool = False
    ended: str | None = None
    # checkpoint id -> [trigger ts, trigger in Redis, trigger read here, acks sent] (ms)
    triggers: dict[int, list[int]] = field(default_factory=dict)
    # (id, trigger ts, complete read here, trigger in Redis, trigger read, acks sent,
    # complete in Redis): the times of one checkpoint, epoch ms
    completed: list[tuple[int, ...]] = field(default_factory=list)
    aborted: int = 0
    restores: int = 0
    last_acked: str | None = None  # the newest command entry id acknowledged

    def registration(self, config: dict[str, Any], heartbeat_interval_ms: int) -> p.JobRegistered:
        n = self.parallelism
        return p.JobRegistered(
            job_name="pv",
            vertices=[
                p.VertexModel(id="source", name="source", parallelism=n, operators=["source"]),
                p.VertexModel(id="pv", name="pv -> sink", parallelism=n, operators=["pv", "sink"]),
            ],
            edges=[("source", "pv")],
            config=config,
            incarnation=f"sim-{uuid.uuid4().hex[:12]}",
            heartbeat_interval_ms=heartbeat_interval_ms,
        )

    def barriers(self, cid: int, ts: int) -> list[p.BarrierInjected]:
        return [
            p.BarrierInjected(
                checkpoint_id=cid,
                operator_id="source",
                subtask=i,
                epoch=cid,
                split_id=f"s{i}",
                offset=cid * 1000,
                timestamp=ts,
            )
            for i in range(self.parallelism)
        ]

    def alignment(self, cid: int, ts: int) -> list[Any]:
        out: list[Any] = []
        for i in range(self.parallelism):
            out.append(
                p.BarrierReceived(
                    checkpoint_id=cid, operator_id="pv", subtask=i, channel=0, timestamp=ts
                )
            )
            out.append(
                p.AlignmentCompleted(
                    checkpoint_id=cid,
                    operator_id="pv",
                    subtask=i,
                    duration_ms=1.0,
                    buffered_bytes=0,
                    buffered_records=0,
                )
            )
        return out

    def acks(self, cid: int, ts: int, trigger_ts: int) -> list[p.SnapshotCompleted]:
        out = []
        for op in ("source", "pv"):
            for i in range(self.parallelism):
                out.append(
                    p.SnapshotCompleted(
                        checkpoint_id=cid,
                        operator_id=op,
                        subtask=i,
                        epoch=cid,
                        ack_timestamp=ts,
                        start_delay_ms=float(max(0, ts - trigger_ts)),
                        alignment_duration_ms=1.0,
                        alignment_buffered_bytes=0,
                        sync_duration_ms=1.0,
                        async_duration_ms=1.0,
                        barrier_timestamp=ts,  # trigger + the start delay above
                        alignment_buffered_records=0,
                        state_size=self.handle.size if op == "pv" else 0,
                        checkpointed_size=self.handle.size if op == "pv" else 0,
                        handles=[self.handle] if op == "pv" else [],
                        source_positions={f"s{i}": cid * 1000} if op == "source" else {},
                        sink_transactions=[
                            p.SinkTransactionModel(transaction_id=f"{cid}-{i}", parts=[f"p{i}"])
                        ]
                        if op == "pv"
                        else [],
                    )
                )
        return out

    def sink_commits(self, cid: int) -> list[p.SinkCommitted]:
        return [
            p.SinkCommitted(
                checkpoint_id=cid,
                operator_id="pv",
                subtask=i,
                transaction_id=f"{cid}-{i}",
                parts=1,
            )
            for i in range(self.parallelism)
        ]


@dataclass
class SimulatorStats:
    events_sent: int = 0
    commands_read: int = 0
    loops: int = 0
    read_delays_ms: list[int] = field(default_factory=list)  # command XADD -> read here
    flush_ms: list[float] = field(default_factory=list)


class Simulator:
    """Drives every :class:`SimulatedJob` from one loop (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        streams: Streams,
        jobs: int,
        *,
        parallelism: int = 4,
        interval_ms: int = 1000,
        ack_delay_ms: int = 0,
        full_events: bool = False,
        heartbeat_interval_ms: int = 10_000,
        checkpoint_dir: str,
        secret: bytes | None = None,
    ) -> None:
        """``secret``: the control plane's event secret; each job signs with its key."""
        self.client = client
        self.streams = streams
        self.ack_delay_ms = ack_delay_ms
        self.full_events = full_events
        self.heartbeat_interval_ms = heartbeat_interval_ms
        storage = JobManagerCheckpointStorage(max_state_size=1 << 20)
        run = uuid.uuid4().hex[:6]
        self.jobs: dict[str, SimulatedJob] = {}
        for k in range(jobs):
            job_id = f"load-{run}-{k:04d}"
            handle = storage.write_state(job_id, 1, "pv", os.urandom(512))
            self.jobs[job_id] = SimulatedJob(job_id, parallelism, handle)
        self.config = {
            "mode": "exactly_once",
            "interval_ms": interval_ms,
            "timeout_ms": 10_000,
            "min_pause_ms": 0,
            "max_concurrent": 1,
            "tolerable_failures": 3,
            "retained": 1,
            "checkpoint_storage": "jobmanager",
            "checkpoint_dir": checkpoint_dir,
            "restart_strategy": {"restart-strategy.type": "fixed-delay"},
        }
        self.stats = SimulatorStats()
        self._outbox: list[p.Envelope] = []
        self._acks: dict[str, list[str]] = {}
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self._stream_job = {streams.commands(j).encode(): j for j in self.jobs}
        self._signers: dict[str, Any] = {}
        if secret is not None and signing is not None:
            for job_id in self.jobs:
                key = signing.job_key(secret, job_id)
                self._signers[job_id] = signing.Signer(_fixed_key(key), f"sim-{job_id}")

    # ------------------------------------------------------------------ protocol

    def _send(self, job: SimulatedJob, payloads: list[Any], ts: int) -> None:
        self._outbox += [p.envelope(job.job_id, job.attempt, ts, e) for e in payloads]

    def _later(self, at_ms: int, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (at_ms, self._seq, action))

    def register_all(self) -> None:
        """Open every command stream (group ``job`` at its end), then register every job."""
        pipe = self.client.pipeline(transaction=False)
        for job_id in self.jobs:
            pipe.xgroup_create(self.streams.commands(job_id), COMMANDS_GROUP, id="$", mkstream=True)
        pipe.execute()
        start = now_ms()
        for k, job in enumerate(self.jobs.values()):
            reg = job.registration(self.config, self.heartbeat_interval_ms)
            self._send(job, [reg], start)
            # Heartbeats staggered over the first second, as drivers start at different times.
            offset = start + (k * HEARTBEAT_EVERY_MS) // len(self.jobs)
            self._later(offset, self._heartbeat_action(job, offset))
            self._later(offset, self._driver_heartbeat_action(job, offset, reg.incarnation or ""))
        self.flush()

    def _heartbeat_action(self, job: SimulatedJob, due: int) -> Callable[[], None]:
        def beat() -> None:
            if job.ended:
                return
            if job.started:
                epoch = max(job.triggers, default=0)
                payload = p.Heartbeat(
                    epoch=epoch,
                    records=100_000,
                    duration_ms=1000.0,
                    records_per_second=100_000.0,
                    source_lag=0,
                    host_time=now_ms(),
                )
                self._send(job, [payload], now_ms())
            nxt = due + HEARTBEAT_EVERY_MS
            self._later(nxt, self._heartbeat_action(job, nxt))

        return beat

    def _driver_heartbeat_action(
        self, job: SimulatedJob, due: int, incarnation: str
    ) -> Callable[[], None]:
        def beat() -> None:
            if job.ended:
                return
            self._send(job, [p.DriverHeartbeat(incarnation=incarnation, host_time=now_ms())], due)
            nxt = due + self.heartbeat_interval_ms
            self._later(nxt, self._driver_heartbeat_action(job, nxt, incarnation))

        return beat

    def obey(self, job: SimulatedJob, env: p.Envelope, cmd: Any, entry_ms: int) -> None:
        """What a driver does on one command (``entry_ms``: when it was added to Redis)."""
        ts = now_ms()
        if isinstance(cmd, p.RestoreJob):
            job.attempt, job.started = cmd.new_attempt, True
            job.restores += 1
            job.triggers.clear()
            self._send(job, [p.JobRestored(checkpoint_id=cmd.checkpoint_id)], ts)
            self._send(job, [p.JobStatusChanged(status=p.JobStatus.RUNNING)], ts)
        elif isinstance(cmd, p.TriggerCheckpoint):
            if env.attempt != job.attempt or cmd.checkpoint_id in job.triggers:
                return  # a trigger sent again after a control-plane restart
            cid = cmd.checkpoint_id
            times = job.triggers[cid] = [cmd.trigger_timestamp, entry_ms, ts, 0]
            if self.full_events:
                self._send(job, list(job.barriers(cid, ts)), ts)
            attempt = job.attempt

            def snapshot() -> None:
                if job.attempt != attempt or job.ended:
                    return
                t = times[3] = now_ms()
                events = job.alignment(cid, t) if self.full_events else []
                self._send(job, events + list(job.acks(cid, t, cmd.trigger_timestamp)), t)

            if self.ack_delay_ms:
                self._later(ts + self.ack_delay_ms, snapshot)
            else:
                snapshot()
        elif isinstance(cmd, p.NotifyCheckpointComplete):
            seen = job.triggers.pop(cmd.checkpoint_id, None)
            if seen is not None:
                trigger, *rest = seen
                job.completed.append((cmd.checkpoint_id, trigger, ts, *rest, entry_ms))
                self._send(job, list(job.sink_commits(cmd.checkpoint_id)), ts)
        elif isinstance(cmd, p.NotifyCheckpointAborted):
            job.triggers.pop(cmd.checkpoint_id, None)
            job.aborted += 1
        elif isinstance(cmd, p.CancelJob):
            job.ended = f"{cmd.status.value}: {cmd.cause}"
            self._send(job, [p.JobStatusChanged(status=cmd.status, cause=cmd.cause)], ts)

    # ------------------------------------------------------------------ the loop

    def flush(self) -> None:
        """One pipeline: every event due, the commands' acknowledgements, trims when due."""
        if not self._outbox and not self._acks:
            return
        started = time.perf_counter()
        pipe = self.client.pipeline(transaction=False)
        for env in self._outbox:
            signer = self._signers.get(env.job_id)
            signed = signer.sign([env])[0] if signer is not None else env
            pipe.xadd(self.streams.events, {FIELD: p.encode(signed)})
        for stream, ids in self._acks.items():
            pipe.xack(stream, COMMANDS_GROUP, *ids)
        pipe.execute()
        self.stats.events_sent += len(self._outbox)
        self._outbox.clear()
        self._acks.clear()
        self.stats.flush_ms.append((time.perf_counter() - started) * 1000)

    def trim(self) -> None:
        """Remove the acknowledged commands (MINID keeps the newest acknowledged one)."""
        pipe = self.client.pipeline(transaction=False)
        for job in self.jobs.values():
            if job.last_acked is not None:
                pipe.xtrim(self.streams.commands(job.job_id), minid=job.last_acked)
        pipe.execute()

    def step(self, block_ms: int) -> None:
        due = self._timers[0][0] - now_ms() if self._timers else block_ms
        wait = max(1, min(block_ms, due))
        response: Any = self.client.xreadgroup(
            COMMANDS_GROUP,
            CONSUMER,
            {s: ">" for s in self._stream_job},
            count=100,
            block=wait,
        )
        read_at = now_ms()
        for stream, entries in response or []:
            job = self.jobs[self._stream_job[stream]]
            ids = self._acks.setdefault(stream.decode(), [])
            for raw_id, fields in entries:
                entry_id = raw_id.decode()
                ids.append(entry_id)
                job.last_acked = entry_id
                self.stats.commands_read += 1
                entry_ms = int(entry_id.split("-")[0])
                self.stats.read_delays_ms.append(read_at - entry_ms)
                env, cmd = p.decode(fields[FIELD])
                self.obey(job, env, cmd, entry_ms)
        while self._timers and self._timers[0][0] <= now_ms():
            heapq.heappop(self._timers)[2]()
        self.flush()
        self.stats.loops += 1

    def run(self, seconds: float, block_ms: int = 20) -> None:
        self.register_all()
        end = time.monotonic() + seconds
        trimmed = time.monotonic()
        while time.monotonic() < end:
            self.step(block_ms)
            if time.monotonic() - trimmed >= TRIM_EVERY_MS / 1000:
                self.trim()
                trimmed = time.monotonic()

    def report(self, wall_s: float, cpu_s: float) -> dict[str, Any]:
        return {
            "jobs": {
                j.job_id: {
                    "completed": j.completed,
                    "aborted": j.aborted,
                    "restores": j.restores,
                    "ended": j.ended,
                    "attempt": j.attempt,
                }
                for j in self.jobs.values()
            },
            "events_sent": self.stats.events_sent,
            "commands_read": self.stats.commands_read,
            "loops": self.stats.loops,
            "read_delays_ms": self.stats.read_delays_ms,
            "flush_ms": self.stats.flush_ms,
            "wall_s": wall_s,
            "cpu_s": cpu_s,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--ack-delay-ms", type=int, default=0)
    parser.add_argument("--full-events", action="store_true")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--data-dir", help="the control plane's: sign with its event secret")
    args = parser.parse_args()
    secret = None
    if args.data_dir and signing is not None:
        deadline = time.monotonic() + 30
        while (secret := signing.read_secret(args.data_dir)) is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"no event secret in {args.data_dir}")
            time.sleep(0.1)
    client = redis_client(args.redis_url)
    sim = Simulator(
        client,
        Streams(prefix=args.prefix),
        args.jobs,
        parallelism=args.parallelism,
        interval_ms=args.interval_ms,
        ack_delay_ms=args.ack_delay_ms,
        full_events=args.full_events,
        checkpoint_dir=args.checkpoint_dir,
        secret=secret,
    )
    started, started_ms = time.monotonic(), now_ms()
    sim.run(args.seconds)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = sim.report(time.monotonic() - started, usage.ru_utime + usage.ru_stime)
    result["started_ms"] = started_ms
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
