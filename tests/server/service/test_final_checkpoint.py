"""A final checkpoint that failed is triggered again as a periodic one would be: once the
interval since its trigger is over, not at once. Retried at once, a storage away for a few
seconds at the end of a bounded input would use up the tolerable failures in as many
immediate retries and fail the job over (Flink triggers a finished job's checkpoints on its
periodic schedule)."""

from __future__ import annotations

from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint_server.storage.models import Checkpoint, Job

FULL = (
    "its snapshot could not be written to file:///data/chk/j/chk-4: OSError: [Errno 28] No "
    "space left on device"
)


def _finals(h: Harness) -> list[int]:
    return [c.checkpoint_id for _, c in h.commands() if isinstance(c, p.TriggerCheckpoint)]


def _status(h: Harness, cid: int) -> str:
    with h.sessions() as s:
        row = s.get(Checkpoint, (h.job_id, cid))
        assert row is not None
        return row.status


def _decline_the_final(h: Harness) -> int:
    """The input ends, its final checkpoint is triggered at once and a subtask declines it;
    the job asks for the next one at once (``EndOfInput`` again)."""
    h.send(1, p.EndOfInput(epoch=3))
    [cid] = _finals(h)
    h.send(1, p.CheckpointDeclined(checkpoint_id=cid, operator_id="pv", subtask=0, reason=FULL))
    assert _status(h, cid) == "FAILED"
    h.send(1, p.EndOfInput(epoch=3))
    return cid


def test_the_next_final_checkpoint_waits_the_interval_after_one_failed(harness: Harness) -> None:
    harness.start(tolerable_failures=3, interval_ms=1000)
    failed = _decline_the_final(harness)
    assert _finals(harness) == []  # not at once
    harness.tick(999)  # and no periodic checkpoint meanwhile: the job is ending
    assert _finals(harness) == []
    harness.tick(1)
    [again] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    assert (again.checkpoint_id, again.is_final) == (failed + 1, True)
    harness.send(1, p.EndOfInput(epoch=3))  # asked again while it runs: its trigger, again
    assert _finals(harness) == [failed + 1]
    harness.ack_all(1, failed + 1)
    assert _status(harness, failed + 1) == "COMPLETED"


def test_the_wait_for_the_next_final_checkpoint_survives_a_control_plane_restart(
    harness: Harness,
) -> None:
    harness.start(tolerable_failures=3, interval_ms=1000, min_pause_ms=1500)
    failed = _decline_the_final(harness)
    harness.tick(400)
    harness.new_control_plane()  # it had the job's request in memory only
    assert _finals(harness) == []
    harness.tick(1099)  # the minimum pause since the failure is longer than the interval
    assert _finals(harness) == []
    harness.tick(1)
    assert _finals(harness) == [failed + 1]


def test_with_no_tolerable_failure_a_failed_final_checkpoint_fails_the_job_over(
    harness: Harness,
) -> None:
    harness.start(tolerable_failures=0)
    _decline_the_final(harness)
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None
        assert job.status == "RESTARTING"
        assert "declined by pv[0]" in (job.restart_cause or "")


def test_a_manual_checkpoint_that_completes_meanwhile_does_not_lose_the_wait_at_a_restart(
    harness: Harness,
) -> None:
    """A completed checkpoint above the failed final one: the restart still finds that the job
    waits for its final checkpoint (else it would stay RUNNING for ever)."""
    harness.start(tolerable_failures=3, interval_ms=1000)
    failed = _decline_the_final(harness)
    harness.plane.trigger_checkpoint(harness.job_id)
    [manual] = _finals(harness)
    harness.ack_all(1, manual)
    assert _status(harness, manual) == "COMPLETED"
    harness.new_control_plane()
    harness.commands()
    harness.tick(1000)
    [again] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    assert (again.checkpoint_id, again.is_final) == (manual + 1, True)
    assert manual == failed + 1


def test_no_final_checkpoint_is_triggered_while_the_job_stops_with_a_savepoint(
    harness: Harness,
) -> None:
    harness.start(tolerable_failures=3, interval_ms=1000)
    _decline_the_final(harness)
    harness.plane.stop_with_savepoint(harness.job_id, None)
    [stop] = [c for _, c in harness.commands() if isinstance(c, p.StopWithSavepoint)]
    harness.tick(1000)
    assert _finals(harness) == []
    assert stop.checkpoint_id > 0
