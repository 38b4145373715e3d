"""A control plane on a real database and a real Redis, driven by hand with a ManualClock.

Events go straight to ``ControlPlane.handle_batch`` (the ingest path has its own tests);
commands are read back from the job's real command stream. Subtasks acknowledge with real
state files written to a real checkpoint directory, so completion, savepoints, retention and
restores touch real files.
"""

from __future__ import annotations

import copy
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint import protocol as p
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.clock import ManualClock
from sparkpoint.transport import ReceivedMessage, Streams
from sparkpoint_server.config import load_settings
from sparkpoint_server.service.control_plane import ControlPlane
from sparkpoint_server.storage.models import Operation

REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Stats:
    """The counters the control plane bumps (the ingest's IngestStats has more)."""

    stale_messages: int = 0


TASKS = {"source": 2, "pv": 2}
# A restart strategy that restarts at once, five times.
NO_DELAY = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": 5,
    "restart-strategy.fixed-delay.delay": "0 s",
}
VERTICES = [
    p.VertexModel(id="source", name="source -> map", parallelism=2, operators=["source", "map"]),
    p.VertexModel(id="pv", name="pv -> sink", parallelism=2, operators=["pv", "sink"]),
]


@dataclass
class Harness:
    """One control plane, one job; see the module docstring."""

    tmp: Path
    sessions: sessionmaker[Session]
    client: redis.Redis
    streams: Streams
    clock: ManualClock = field(default_factory=ManualClock)
    job_id: str = field(default_factory=lambda: f"job-{uuid.uuid4().hex[:8]}")
    stats: Stats = field(default_factory=Stats)
    cp: ControlPlane | None = None
    _seen: str = "0"

    def __post_init__(self) -> None:
        self.settings = load_settings(data_dir=str(self.tmp / "data"))
        self.checkpoint_dir = str(self.tmp / "checkpoints")
        self.storage = FileSystemCheckpointStorage(self.checkpoint_dir)
        self.cp = self.new_control_plane()

    def new_control_plane(self) -> ControlPlane:
        """A fresh control plane on the same database and streams (a restart)."""
        cp = ControlPlane(
            self.settings,
            self.sessions,
            self.client,
            streams=self.streams,
            clock=self.clock,
            stats=self.stats,
        )
        cp.recover()
        self.cp = cp
        return cp

    def savepoint(self, name: str) -> tuple[int, str]:
        """A completed savepoint of the job (attempt 1) under the server's savepoint directory:
        its id and its location (a ``file://`` URL)."""
        target = os.path.join(self.settings.savepoint_dir, name)
        request = self.plane.trigger_savepoint(self.job_id, target, cancel_job=False)
        [trigger] = [c for _, c in self.commands() if isinstance(c, p.TriggerCheckpoint)]
        self.ack_all(1, trigger.checkpoint_id)
        with self.sessions() as s:
            op = s.get(Operation, request)
            assert op is not None and op.status == "COMPLETED" and op.location is not None
            return trigger.checkpoint_id, op.location

    def another_job(self) -> Harness:
        """A harness for a second job on the same control plane (its own command stream)."""
        other = copy.copy(self)
        other.job_id, other._seen = f"job-{uuid.uuid4().hex[:8]}", "0"
        return other

    @property
    def plane(self) -> ControlPlane:
        assert self.cp is not None
        return self.cp

    # ------------------------------------------------------------------ events in

    def send(self, attempt: int, *payloads: Any, job_id: str | None = None) -> None:
        messages = []
        for payload in payloads:
            env = p.envelope(job_id or self.job_id, attempt, self.clock.now_ms(), payload)
            messages.append(ReceivedMessage(f"0-{uuid.uuid4().int % 10**9}", env, payload))
        self.plane.handle_batch(messages)
        self.plane.wait_idle()

    def register(
        self,
        incarnation: str = "driver-1",
        *,
        heartbeat_interval_ms: int | None = None,
        previous_failure: str | None = None,
        vertices: list[p.VertexModel] = VERTICES,
        first_epoch_heartbeat: bool = False,
        **config: Any,
    ) -> None:
        """``job_registered``; ``heartbeat_interval_ms``: a driver that sends heartbeats;
        ``first_epoch_heartbeat``: one that ends each attempt's first epoch with one."""
        conf = self.config(**config)
        self.send(
            0,
            p.JobRegistered(
                job_name="pv",
                vertices=vertices,
                edges=[("source", "pv")],
                config=conf,
                incarnation=incarnation,
                heartbeat_interval_ms=heartbeat_interval_ms,
                previous_failure=previous_failure,
                first_epoch_heartbeat=first_epoch_heartbeat,
            ),
        )

    def config(self, **config: Any) -> dict[str, Any]:
        """A registration's configuration: the harness's defaults, then ``config``."""
        return {
            "mode": "exactly_once",
            "interval_ms": 1000,
            "timeout_ms": 10_000,
            "min_pause_ms": 0,
            "max_concurrent": 1,
            "tolerable_failures": 0,
            "retained": 1,
            "checkpoint_storage": "filesystem",
            "checkpoint_dir": self.checkpoint_dir,
            "restart_strategy": {"restart-strategy.type": "fixed-delay"},
            **config,
        }

    def driver_heartbeat(self, attempt: int, incarnation: str = "driver-1") -> None:
        """The driver process ``incarnation`` is alive."""
        self.send(attempt, p.DriverHeartbeat(incarnation=incarnation, host_time=0))

    def epoch_ended(self, attempt: int, epoch: int, **fields: Any) -> None:
        """The driver's heartbeat at the end of ``epoch`` (``fields``: its other fields)."""
        numbers: dict[str, Any] = dict(
            records=10, duration_ms=5.0, records_per_second=2.0, source_lag=0
        )
        beat = p.Heartbeat(epoch=epoch, host_time=self.clock.now_ms(), **{**numbers, **fields})
        self.send(attempt, beat)

    def running(self, attempt: int, **spark: str | None) -> None:
        """RUNNING under ``attempt``; ``spark``: ``spark_application_id``, ``spark_ui_url``."""
        self.send(attempt, p.JobStatusChanged(status=p.JobStatus.RUNNING, **spark))

    def barriers(self, checkpoint_id: int, epoch: int) -> list[p.BarrierInjected]:
        """Every source subtask's ``barrier_injected`` of a checkpoint carried by ``epoch``."""
        return [
            p.BarrierInjected(
                checkpoint_id=checkpoint_id,
                operator_id="source",
                subtask=i,
                epoch=epoch,
                split_id=f"split-{i}",
                offset=checkpoint_id * 100,
                timestamp=self.clock.now_ms(),
            )
            for i in range(TASKS["source"])
        ]

    def ack(
        self,
        attempt: int,
        checkpoint_id: int,
        operator_id: str,
        subtask: int,
        *,
        state: bytes = b"state",
        sink: bool = False,
    ) -> p.SnapshotCompleted:
        handle = self.storage.write_state(
            self.job_id, checkpoint_id, f"{operator_id}-{subtask}-a{attempt}", state
        )
        txns = (
            [p.SinkTransactionModel(transaction_id=f"t{checkpoint_id}-{subtask}", parts=["x"])]
            if sink
            else []
        )
        return p.SnapshotCompleted(
            checkpoint_id=checkpoint_id,
            operator_id=operator_id,
            subtask=subtask,
            epoch=checkpoint_id,
            ack_timestamp=self.clock.now_ms(),
            start_delay_ms=1.0,
            alignment_duration_ms=2.0,
            alignment_buffered_bytes=10,
            sync_duration_ms=3.0,
            async_duration_ms=4.0,
            state_size=len(state),
            checkpointed_size=len(state),
            handles=[handle],
            source_positions={f"split-{subtask}": checkpoint_id * 100}
            if operator_id == "source"
            else {},
            sink_transactions=txns,
        )

    def ack_all(self, attempt: int, checkpoint_id: int, *, sink: bool = False) -> None:
        acks = [
            self.ack(attempt, checkpoint_id, op, i, sink=sink and op == "pv")
            for op, n in TASKS.items()
            for i in range(n)
        ]
        self.send(attempt, *acks)

    # ------------------------------------------------------------------ commands out

    def commands(self) -> list[tuple[p.Envelope, Any]]:
        """The commands sent to the job since the last call."""
        raw = self.client.xrange(self.streams.commands(self.job_id), min=f"({self._seen}")
        out = []
        for raw_id, fields in raw:
            entry_id = raw_id.decode()
            env, payload = p.decode(fields[b"m"])
            out.append((env, payload))
            self._seen = entry_id
        return out

    def command_types(self) -> list[str]:
        return [env.type for env, _ in self.commands()]

    def tick(self, advance_ms: float = 0) -> None:
        self.clock.advance(advance_ms)
        self.plane.tick()
        self.plane.wait_idle()

    def trigger_periodic(self, attempt: int = 1) -> int:
        """Advance past the interval and tick; returns the triggered checkpoint id."""
        self.tick(1000)
        triggers = [c for _, c in self.commands() if isinstance(c, p.TriggerCheckpoint)]
        assert triggers, "no checkpoint was triggered"
        return triggers[-1].checkpoint_id

    def start(self, **config: Any) -> None:
        """Register, answer nothing special, report RUNNING under attempt 1."""
        self.register(**config)
        self.running(1)
        self.commands()
