"""Checkpoint coordination by the control plane: trigger, complete, expire, decline, retain."""

from __future__ import annotations

import json
import os
from pathlib import Path

from service_harness import VERTICES, Harness
from sqlalchemy import select
from tests.support.ports import free_port

from sparkpoint import protocol as p
from sparkpoint.transport import ReceivedMessage, redis_client
from sparkpoint_server.storage import checkpoint_stats
from sparkpoint_server.storage.models import Checkpoint, CheckpointSubtask, Job, JobException

RESTART_AFTER_1_S = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.delay": "1 s",
}


def _row(h: Harness, cid: int) -> Checkpoint:
    with h.sessions() as s:
        row = s.get(Checkpoint, (h.job_id, cid))
        assert row is not None
        return row


def test_registration_starts_attempt_one_from_the_beginning(harness: Harness) -> None:
    harness.register()
    [(env, cmd)] = harness.commands()
    assert isinstance(cmd, p.RestoreJob)
    assert (env.attempt, cmd.new_attempt, cmd.checkpoint_id) == (1, 1, None)
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None and (job.status, job.attempt) == ("CREATED", 1)
    harness.running(1)
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None and job.status == "RUNNING"


def test_periodic_trigger_then_completion_in_design_order(harness: Harness) -> None:
    harness.start()
    harness.tick(999)
    assert harness.commands() == []  # the interval (1 s) has not passed
    cid = harness.trigger_periodic()
    assert cid == 1 and _row(harness, 1).status == "IN_PROGRESS"
    harness.ack_all(1, 1)
    row = _row(harness, 1)
    assert row.status == "COMPLETED" and row.num_acknowledged_subtasks == 4
    # Step 1 happened: the _metadata is on disk and names every acknowledgement.
    meta_path = os.path.join(harness.checkpoint_dir, harness.job_id, "chk-1", "_metadata")
    with open(meta_path) as fh:
        assert len(json.load(fh)["acks"]) == 4
    assert row.external_path is not None and row.external_path.endswith("chk-1")
    # Step 3: the notification went out.
    assert [type(c) for _, c in harness.commands()] == [p.NotifyCheckpointComplete]
    with harness.sessions() as s:
        subtasks = s.scalars(
            select(CheckpointSubtask).where(CheckpointSubtask.job_id == harness.job_id)
        ).all()
    assert {(t.operator_id, t.subtask, t.sync_duration) for t in subtasks} == {
        ("source", 0, 3.0),
        ("source", 1, 3.0),
        ("pv", 0, 3.0),
        ("pv", 1, 3.0),
    }


def test_duplicate_and_redelivered_events_change_nothing(harness: Harness) -> None:
    harness.start()
    cid = harness.trigger_periodic()
    acks = [harness.ack(1, cid, op, i) for op in ("source", "pv") for i in range(2)]
    harness.send(1, *acks[:2])
    harness.send(1, *acks[:2])  # redelivered
    assert _row(harness, cid).num_acknowledged_subtasks == 2
    harness.send(1, *acks[2:])
    harness.send(1, *acks)  # everything again, after completion
    assert _row(harness, cid).status == "COMPLETED"
    assert harness.command_types() == ["checkpoint_complete"]  # exactly one notification
    harness.register()  # the same driver process registering twice: the same start again
    assert harness.command_types() == ["restore"]
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None and job.attempt == 1


def test_timeout_expires_aborts_and_deletes_partial_state(harness: Harness) -> None:
    harness.start(timeout_ms=5000)
    cid = harness.trigger_periodic()
    harness.send(1, harness.ack(1, cid, "source", 0))
    chk = os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    assert os.listdir(chk)  # partial state written
    harness.tick(4999)
    assert _row(harness, cid).status == "IN_PROGRESS"
    harness.tick(1)
    row = _row(harness, cid)
    assert row.status == "FAILED" and row.failure_reason == "CHECKPOINT_EXPIRED"
    assert "1/4 subtasks acknowledged" in (row.failure_message or "")
    aborts = [c for _, c in harness.commands() if isinstance(c, p.NotifyCheckpointAborted)]
    assert [a.checkpoint_id for a in aborts] == [cid]
    assert not os.path.exists(chk)


def test_an_expired_checkpoint_names_the_epoch_that_outran_its_timeout(harness: Harness) -> None:
    # Epoch 3 ends before the trigger, epoch 4 (running at the trigger) 300 ms after it;
    # epoch 5, which would carry the barrier, has not ended when the 5 s timeout passes.
    harness.start(timeout_ms=5000)
    harness.tick(200)
    harness.epoch_ended(1, 3)
    cid = harness.trigger_periodic()  # 1 s later
    harness.tick(300)
    harness.epoch_ended(1, 4)
    harness.tick(4700)
    message = _row(harness, cid).failure_message or ""
    assert message.startswith(f"checkpoint {cid} of job {harness.job_id} expired")
    assert (
        "0/4 subtasks acknowledged; missing: pv[0], pv[1], source[0], source[1]. "
        "Epoch 4 ended 300 ms after the trigger, and no epoch ended in the 4700 ms from then "
        "to the expiry; a barrier travels with an epoch"
    ) in message
    assert "--epoch-target-ms" in message and "--checkpoint-timeout" in message
    [abort] = [c for _, c in harness.commands() if isinstance(c, p.NotifyCheckpointAborted)]
    assert "Epoch 4 ended 300 ms after the trigger" in abort.reason  # the job's console too


def test_a_failover_for_expired_checkpoints_quotes_why_the_last_one_expired(
    harness: Harness,
) -> None:
    harness.start(timeout_ms=2000, tolerable_failures=0, restart_strategy=RESTART_AFTER_1_S)
    harness.epoch_ended(1, 6)
    cid = harness.trigger_periodic()
    harness.tick(2000)
    with harness.sessions() as s:
        assert s.get(Job, harness.job_id).status == "RESTARTING"  # type: ignore[union-attr]
        [exc] = s.scalars(select(JobException).where(JobException.job_id == harness.job_id))
    assert exc.cause.startswith("Exceeded checkpoint tolerable failure threshold.")
    assert (
        f"last: checkpoint {cid} of job {harness.job_id} expired before completing after "
        "2000 ms: 0/4 subtasks acknowledged; missing: pv[0], pv[1], source[0], source[1]. "
        "No epoch ended between the trigger and the expiry: the last to end, epoch 6, ended "
        "1000 ms before the trigger and 3000 ms before the expiry; "
    ) in exc.cause
    assert exc.cause.endswith("(CHECKPOINT_EXPIRED)")


def test_an_expired_checkpoint_without_an_epoch_end_since_its_trigger_says_so(
    harness: Harness,
) -> None:
    harness.start(timeout_ms=5000)
    harness.tick(700)
    harness.epoch_ended(1, 7)
    cid = harness.trigger_periodic()  # 1 s later
    harness.tick(5000)
    assert (
        "No epoch ended between the trigger and the expiry: the last to end, epoch 7, ended "
        "1000 ms before the trigger and 6000 ms before the expiry; "
    ) in (_row(harness, cid).failure_message or "")


def test_an_expired_checkpoint_whose_epochs_ended_blames_no_epoch(harness: Harness) -> None:
    # Two epochs ended after the trigger: the barrier's epoch did too; the subtasks' own
    # acknowledgements are what is missing, and the message names only them.
    harness.start(timeout_ms=5000)
    cid = harness.trigger_periodic()
    for epoch in (1, 2):
        harness.tick(1000)
        harness.epoch_ended(1, epoch)
    harness.tick(3000)
    message = _row(harness, cid).failure_message or ""
    assert message.endswith("missing: pv[0], pv[1], source[0], source[1]")


def test_decline_fails_the_checkpoint_with_the_reason(harness: Harness) -> None:
    harness.start(tolerable_failures=3)
    cid = harness.trigger_periodic()
    harness.send(
        1,
        p.CheckpointDeclined(
            checkpoint_id=cid, operator_id="pv", subtask=1, reason="state above 1 MiB inline"
        ),
    )
    row = _row(harness, cid)
    assert row.status == "FAILED" and row.failure_reason == "CHECKPOINT_DECLINED"
    assert "pv[1]" in (row.failure_message or "") and "1 MiB" in (row.failure_message or "")


def test_a_snapshot_that_could_not_be_written_fails_with_the_asynchronous_reason(
    harness: Harness,
) -> None:
    harness.start(tolerable_failures=3)
    cid = harness.trigger_periodic()
    why = "its snapshot could not be written to file:///chk/j/chk-1: OSError: disk full"
    declined = p.CheckpointDeclined(
        checkpoint_id=cid, operator_id="pv", subtask=1, reason=why, asynchronous=True
    )
    harness.send(1, declined)
    row = _row(harness, cid)
    assert (row.status, row.failure_reason) == ("FAILED", "CHECKPOINT_ASYNC_EXCEPTION")
    assert row.failure_message is not None and why in row.failure_message


def test_stale_attempt_events_are_refused_and_counted(harness: Harness) -> None:
    harness.start(restart_strategy=RESTART_AFTER_1_S)
    cid = harness.trigger_periodic()
    harness.send(1, p.TaskFailed(epoch=3, cause="boom"))
    harness.tick(1000)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert restore.new_attempt == 2
    harness.send(1, harness.ack(1, cid, "source", 0))  # attempt 1 is over
    assert harness.stats.stale_messages == 1
    assert _row(harness, cid).status == "FAILED"  # aborted by the failover


def test_retention_keeps_a_checkpoint_until_its_sinks_committed(harness: Harness) -> None:
    harness.start(retained=1)
    first = harness.trigger_periodic()
    harness.ack_all(1, first, sink=True)
    second = harness.trigger_periodic()
    harness.ack_all(1, second, sink=True)
    chk1 = os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{first}")
    assert os.path.exists(chk1)  # subsumed, but its transactions are not committed yet
    for i in range(2):
        harness.send(
            1,
            p.SinkCommitted(
                checkpoint_id=first, operator_id="pv", subtask=i, transaction_id="t", parts=1
            ),
        )
    assert not os.path.exists(chk1)
    assert _row(harness, first).discarded and _row(harness, first).committed
    assert not _row(harness, second).discarded


def test_a_checkpoint_is_committed_when_its_last_sink_subtask_committed_at_the_jobs_time(
    harness: Harness,
) -> None:
    harness.start()
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid, sink=True)
    row = _row(harness, cid)
    assert (row.status, row.committed, row.commit_timestamp) == ("COMPLETED", False, None)
    harness.clock.advance(7)
    commit = p.SinkCommitted(
        checkpoint_id=cid, operator_id="pv", subtask=0, transaction_id="t", parts=1
    )
    harness.send(1, commit)
    assert (_row(harness, cid).committed, _row(harness, cid).commit_timestamp) == (False, None)
    harness.clock.advance(5)
    harness.send(1, commit.model_copy(update={"subtask": 1}))
    row = _row(harness, cid)
    assert (row.committed, row.commit_timestamp) == (True, harness.clock.now_ms())
    with harness.sessions() as session:
        details = checkpoint_stats.checkpoint_details(session, harness.job_id, cid)
    assert (details["committed"], details["commit_timestamp"]) == (True, harness.clock.now_ms())


def test_the_interval_counts_from_running_not_from_registration(harness: Harness) -> None:
    harness.register()
    harness.clock.advance(5000)  # Spark starting up
    harness.running(1)
    harness.commands()
    harness.tick(999)
    assert harness.commands() == []
    harness.tick(1)
    assert harness.command_types() == ["trigger_checkpoint"]


def test_a_job_whose_configuration_cannot_run_is_refused_and_told_why(harness: Harness) -> None:
    harness.register(restart_strategy={"restart-strategy.type": "sometimes"})
    [(env, cancel)] = harness.commands()
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert "sometimes" in (cancel.cause or "") and env.attempt == 0
    with harness.sessions() as s:
        assert s.get(Job, harness.job_id) is None
    harness.register(restart_strategy={"restart-strategy.type": "none"})  # fixed: accepted
    assert harness.command_types() == ["restore"]


def test_a_duplicate_registration_gets_the_same_start_again(
    harness: Harness, tmp_path: Path
) -> None:
    harness.start()
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid)
    path = os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    other = Harness(tmp_path / "other", harness.sessions, harness.client, harness.streams)
    other.register(incarnation="driver-9", from_checkpoint=f"file://{path}")
    [first] = [c for _, c in other.commands() if isinstance(c, p.RestoreJob)]
    assert first.checkpoint_id == cid and first.external_path is not None
    other.register(incarnation="driver-9")  # redelivered: the same start, from the checkpoint
    [again] = [c for _, c in other.commands() if isinstance(c, p.RestoreJob)]
    assert again == first


def test_a_job_that_gives_up_by_itself_ends_failed(harness: Harness) -> None:
    harness.start()
    harness.trigger_periodic()
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.FAILED, cause="Redis unreachable"))
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None and job.status == "FAILED"
        row = s.get(Checkpoint, (harness.job_id, 1))
        assert row is not None and row.status == "FAILED"  # nothing pending survives the job


def test_an_acknowledgement_carrying_the_barrier_events_fills_the_rows_they_filled(
    harness: Harness,
) -> None:
    """A connected job sends an acknowledging subtask's barrier and alignment inside its
    acknowledgement; an older job sends them apart. Both give the same rows: the barrier's
    time, the records the alignment held back, and the epoch that carried the barrier."""
    harness.start()
    at = harness.clock.now_ms()
    rows = {}
    for folded in (False, True):
        cid = harness.trigger_periodic()
        barriers: list[object] = []
        acks = []
        for op, n in (("source", 2), ("pv", 2)):
            for i in range(n):
                ack = harness.ack(1, cid, op, i)
                barrier_at, held = at + 10 * i + (5 if op == "pv" else 0), 7 * (i + 1)
                if folded:
                    ack = ack.model_copy(
                        update={"barrier_timestamp": barrier_at, "alignment_buffered_records": held}
                    )
                elif op == "source":
                    barriers.append(
                        p.BarrierInjected(
                            checkpoint_id=cid,
                            operator_id=op,
                            subtask=i,
                            epoch=cid,
                            split_id=f"split-{i}",
                            offset=cid * 100,
                            timestamp=barrier_at,
                        )
                    )
                else:
                    barriers += [
                        p.BarrierReceived(
                            checkpoint_id=cid,
                            operator_id=op,
                            subtask=i,
                            channel=0,
                            timestamp=barrier_at,
                        ),
                        p.AlignmentCompleted(
                            checkpoint_id=cid,
                            operator_id=op,
                            subtask=i,
                            duration_ms=2.0,
                            buffered_bytes=10,
                            buffered_records=held,
                        ),
                    ]
                acks.append(ack)
        harness.send(1, *barriers, *acks)
        row = _row(harness, cid)
        assert row.status == "COMPLETED" and row.epoch == cid
        with harness.sessions() as s:
            subtasks = s.scalars(
                select(CheckpointSubtask).where(
                    CheckpointSubtask.job_id == harness.job_id,
                    CheckpointSubtask.checkpoint_id == cid,
                )
            ).all()
        rows[folded] = {
            (t.operator_id, t.subtask): (
                t.barrier_timestamp,
                t.alignment_duration,
                t.alignment_buffered,
                t.alignment_buffered_records if t.operator_id == "pv" else None,
            )
            for t in subtasks
        }
    assert rows[True] == rows[False]
    assert rows[True][("pv", 1)] == (at + 15, 2.0, 10, 14)


def test_commands_that_redis_does_not_take_cost_no_completion_and_no_deletion(
    harness: Harness,
) -> None:
    harness.start(retained=1)
    first = harness.trigger_periodic()
    harness.ack_all(1, first)
    second = harness.trigger_periodic()
    harness.commands()
    sender = harness.plane.sender
    sender.client = redis_client(f"redis://127.0.0.1:{free_port()}/0")  # Redis away
    sender.retry_for_s = 0  # given up at once

    harness.ack_all(1, second)  # completes, subsumes the first; its notification cannot go

    row = _row(harness, second)
    assert row.status == "COMPLETED" and row.external_path is not None
    assert os.path.exists(os.path.join(row.external_path.removeprefix("file://"), "_metadata"))
    assert not os.path.exists(os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{first}"))
    assert sender.wait_idle(30)
    sender.client = harness.client  # Redis is back: checkpointing goes on
    third = harness.trigger_periodic()
    harness.ack_all(1, third)
    assert third == second + 1 and _row(harness, third).status == "COMPLETED"
    [(_, notified)] = harness.commands()
    assert isinstance(notified, p.NotifyCheckpointComplete) and notified.checkpoint_id == third


def test_a_late_acknowledgement_in_the_batch_of_its_failover_loses_its_state_too(
    harness: Harness,
) -> None:
    """A restarted driver's registration fails the job over, and the paused old driver's
    acknowledgement comes right after it, in the same ingest batch. The checkpoint's FAILED
    status is then the batch's own write, not in the database yet, so the stale
    acknowledgement does not discard anything itself; its state goes all the same, with the
    checkpoint's directory that the failover discards once the batch committed: the state was
    written before its acknowledgement was sent, so before that batch was read."""
    harness.start()
    cid = harness.trigger_periodic()
    chk = os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    late = harness.ack(1, cid, "source", 0)  # the old driver wrote its state file
    registered = p.JobRegistered(
        job_name="pv",
        vertices=VERTICES,
        edges=[("source", "pv")],
        config=harness.config(),
        incarnation="driver-2",
    )
    now = harness.clock.now_ms()
    harness.plane.handle_batch(
        [
            ReceivedMessage("1-1", p.envelope(harness.job_id, 0, now, registered), registered),
            ReceivedMessage("1-2", p.envelope(harness.job_id, 1, now, late), late),
        ]
    )
    harness.plane.wait_idle()
    with harness.sessions() as s:
        assert s.get(Job, harness.job_id).attempt == 2  # type: ignore[union-attr]
    assert harness.stats.stale_messages == 1
    assert _row(harness, cid).status == "FAILED"
    assert not os.path.exists(chk)


def test_the_state_of_a_late_acknowledgement_of_a_failed_over_attempt_goes(
    harness: Harness,
) -> None:
    """A driver paused (or cut off) while it snapshots is failed over; the failover discards
    the checkpoint's directory, and then the driver wakes and writes its state there."""
    harness.start(restart_strategy=RESTART_AFTER_1_S)
    cid = harness.trigger_periodic()
    harness.send(1, p.TaskFailed(epoch=3, cause="driver lost"))
    harness.tick(1000)
    chk = os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    assert _row(harness, cid).status == "FAILED" and not os.path.exists(chk)

    harness.send(1, harness.ack(1, cid, "source", 0))  # written after the failover

    assert harness.stats.stale_messages == 1
    assert not os.path.exists(chk)
    harness.running(2)
    completed = harness.trigger_periodic(2)  # a completed checkpoint keeps its state
    harness.ack_all(2, completed)
    harness.send(1, harness.ack(1, completed, "source", 0))
    assert harness.stats.stale_messages == 2
    assert os.path.exists(os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{completed}"))
