"""A control plane that restarts loses no decision: it rebuilds its jobs from the database."""

from __future__ import annotations

import os

from service_harness import Harness
from sqlalchemy import select

from sparkpoint import protocol as p
from sparkpoint_server.storage.models import Checkpoint, CheckpointSubtask, Job


def _status(h: Harness, cid: int) -> str:
    with h.sessions() as s:
        row = s.get(Checkpoint, (h.job_id, cid))
        assert row is not None
        return row.status


def test_a_pending_checkpoint_completes_after_a_restart(harness: Harness) -> None:
    harness.start(timeout_ms=60_000)
    cid = harness.trigger_periodic()
    acks = [harness.ack(1, cid, op, i) for op in ("source", "pv") for i in range(2)]
    harness.send(1, *acks[:3])
    harness.new_control_plane()  # the old one is gone with everything in its memory
    # Its trigger is sent again, in case the crash came between the commit and the send.
    [again] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    assert again.checkpoint_id == cid
    harness.send(1, acks[0])  # redelivered after the restart: still a duplicate
    assert _status(harness, cid) == "IN_PROGRESS"
    harness.send(1, acks[3])
    assert _status(harness, cid) == "COMPLETED"
    assert harness.command_types() == ["checkpoint_complete"]
    assert harness.trigger_periodic() == cid + 1  # ids continue


def test_timeouts_continue_across_a_restart(harness: Harness) -> None:
    harness.start(timeout_ms=5000)
    cid = harness.trigger_periodic()
    harness.tick(3000)
    harness.new_control_plane()
    harness.tick(1999)
    assert _status(harness, cid) == "IN_PROGRESS"
    harness.tick(1)
    assert _status(harness, cid) == "FAILED"


def test_a_decided_restart_and_uncommitted_completions_survive_a_restart(
    harness: Harness,
) -> None:
    harness.start(
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 1,
            "restart-strategy.fixed-delay.delay": "5 s",
        }
    )
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid, sink=True)
    harness.commands()
    harness.send(1, p.TaskFailed(epoch=2, cause="executor lost"))
    harness.new_control_plane()
    # The completion whose sinks never confirmed their commit is sent again.
    assert harness.command_types() == ["checkpoint_complete"]
    harness.tick(5000)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, cid)
    harness.running(2)
    # The restart strategy remembers the failure: fixed-delay allowed one restart only.
    harness.send(2, p.TaskFailed(epoch=3, cause="executor lost again"))
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None and job.status == "FAILED"
    chk = os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}", "_metadata")
    assert os.path.isfile(chk)


def test_acks_after_barrier_events_of_an_earlier_batch_are_kept_for_a_restart(
    harness: Harness,
) -> None:
    """A subtask's row first written by its barrier (one batch), its acknowledgement later
    (another batch): the acknowledgement is stored, and a restarted control plane rebuilds the
    completed checkpoint from it."""
    harness.start()
    cid = harness.trigger_periodic()
    now = harness.clock.now_ms()
    harness.send(
        1,
        *harness.barriers(cid, epoch=3),
        *(
            p.BarrierReceived(
                checkpoint_id=cid, operator_id="pv", subtask=i, channel=0, timestamp=now
            )
            for i in range(2)
        ),
    )
    harness.ack_all(1, cid, sink=True)
    with harness.sessions() as s:
        acks = s.scalars(
            select(CheckpointSubtask.ack).where(CheckpointSubtask.checkpoint_id == cid)
        ).all()
    assert len(acks) == 4
    assert all(a is not None and a["checkpoint_id"] == cid for a in acks)

    harness.new_control_plane()  # rebuilds the job from those acknowledgements

    assert _status(harness, cid) == "COMPLETED"
    assert harness.trigger_periodic() == cid + 1
