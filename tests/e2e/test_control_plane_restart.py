"""Killing the control plane mid-checkpoint loses no event and no decision.

This test plays the job's side of the protocol by hand over the real Redis (the PV job's own
end-to-end test is in test_control_plane_pv.py): a checkpoint is triggered, three of four
subtasks acknowledge, the server is SIGKILLed, the fourth acknowledgement is sent while it is
down, and the restarted server completes the checkpoint and tells the job.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.transport import CommandChannel, RedisEventSink, Streams, redis_client

from ..support.waiting import wait_for
from .control_plane import REDIS_URL, ROOT, ServerProcess

VERTICES = [
    p.VertexModel(id="source", name="source", parallelism=2, operators=["source"]),
    p.VertexModel(id="pv", name="pv -> sink", parallelism=2, operators=["pv", "sink"]),
]


class Inbox:
    """The job's commands, read from its real command stream and kept in order."""

    def __init__(self, channel: CommandChannel) -> None:
        self.channel = channel
        self.unread: list[Any] = []

    def next(self, kind: type[Any], after_id: int | None = None, timeout_s: float = 30) -> Any:
        """The next command of ``kind`` (of a checkpoint id above ``after_id`` if given).

        Commands of other kinds stay for their own ``next``: the next periodic trigger may be
        sent before the completion of the last checkpoint is notified (the notification waits
        for its ``_metadata`` write, the trigger does not).
        """

        def check() -> Any:
            for m in self.channel.read(block_ms=200):
                self.channel.ack([m.entry_id])
                self.unread.append(m.payload)
            for i, cmd in enumerate(self.unread):
                if isinstance(cmd, kind) and (after_id is None or cmd.checkpoint_id > after_id):
                    return self.unread.pop(i)
            return None

        return wait_for(f"a {kind.__name__} command", check, timeout_s)


def test_server_killed_mid_checkpoint_completes_it_after_restart(
    server: ServerProcess, tmp_path: Path
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    client = redis_client(REDIS_URL)
    streams = Streams(prefix=server.prefix)
    sink = RedisEventSink(client, streams, signer=server.signer())
    channel = CommandChannel(client, job, "driver-1", streams)
    channel.open()
    inbox = Inbox(channel)
    storage = FileSystemCheckpointStorage(f"file://{tmp_path / 'chk'}")
    config = {
        "interval_ms": 300,
        "timeout_ms": 120_000,
        "retained": 2,
        "mode": "exactly_once",
        "checkpoint_storage": "filesystem",
        "checkpoint_dir": f"file://{tmp_path / 'chk'}",
    }

    def send(attempt: int, *payloads: Any) -> None:
        sink.publish([p.envelope(job, attempt, 0, pl) for pl in payloads])

    send(
        0,
        p.JobRegistered(
            job_name="pv",
            vertices=VERTICES,
            edges=[("source", "pv")],
            config=config,
            incarnation="driver-1",
        ),
    )
    start = inbox.next(p.RestoreJob)
    assert (start.new_attempt, start.checkpoint_id) == (1, None)
    send(1, p.JobStatusChanged(status=p.JobStatus.RUNNING))
    trigger = inbox.next(p.TriggerCheckpoint)
    cid = trigger.checkpoint_id

    def ack(op: str, i: int) -> p.SnapshotCompleted:
        handle = storage.write_state(job, cid, f"{op}-{i}", f"{op}{i}".encode())
        return p.SnapshotCompleted(
            checkpoint_id=cid,
            operator_id=op,
            subtask=i,
            epoch=1,
            ack_timestamp=trigger.trigger_timestamp + 5,
            start_delay_ms=1,
            alignment_duration_ms=0,
            alignment_buffered_bytes=0,
            sync_duration_ms=1,
            async_duration_ms=1,
            state_size=4,
            checkpointed_size=4,
            handles=[handle],
            source_positions={f"s{i}": 10} if op == "source" else {},
        )

    send(1, ack("source", 0), ack("source", 1), ack("pv", 0))
    with server.api() as api:
        wait_for(
            "3 acknowledgements recorded",
            lambda: (
                api.get(f"/jobs/{job}/checkpoints/details/{cid}")
                .json()
                .get("num_acknowledged_subtasks")
                == 3
            ),
        )
    server.kill()
    send(1, ack("pv", 1))  # while the control plane is down: waits in the stream
    server.start()
    complete = inbox.next(p.NotifyCheckpointComplete)
    assert complete.checkpoint_id == cid
    with server.api() as api:
        details = api.get(f"/jobs/{job}/checkpoints/details/{cid}").json()
        assert (details["status"], details["num_acknowledged_subtasks"]) == ("COMPLETED", 4)
        assert details["external_path"].endswith(f"chk-{cid}")
        # Periodic triggers continue with the next id: nothing was decided twice (the
        # restarted server sent the trigger of the pending checkpoint again, as it should).
        nxt = inbox.next(p.TriggerCheckpoint, after_id=cid)
        assert nxt.checkpoint_id == cid + 1
        job_view = api.get(f"/jobs/{job}").json()
        assert (job_view["state"], job_view["attempt"]) == ("RUNNING", 1)


def test_a_job_the_control_plane_refuses_fails_at_once_with_the_reason(
    server: ServerProcess, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-checkpoint"
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("sparkpoint")),
            "run",
            "jobs/examples/pv_count.py",
            "--redis-url",
            REDIS_URL,
            "--stream-prefix",
            server.prefix,
            "--from-checkpoint",
            f"file://{missing}",
            "--events",
            "100",
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=server.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "refused" in done.stderr and str(missing) in done.stderr
    assert "SparkContext" not in done.stderr  # it failed before Spark started
