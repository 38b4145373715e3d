"""What a job reports of a restore's duration: the heartbeat of the epoch that restored."""

from __future__ import annotations

from pathlib import Path

from sparkpoint import protocol as p
from sparkpoint.testing import FailureInjection

from .keyed_stages_job import restored_before_failure
from .pv_harness import IN_PROCESS, run_pv


def test_only_the_epoch_after_a_restore_reports_the_restore_and_its_first_records(
    tmp_path: Path,
) -> None:
    failure = FailureInjection("source", subtask=0, offset=3500)  # epoch 3, after checkpoints
    result, _ = run_pv(IN_PROCESS, tmp_path, "timings", failure=failure)
    # Which checkpoint completed last before the failure follows the machine's timing.
    restored_id = restored_before_failure(result)
    assert restored_id is not None and result.restores == [restored_id]
    assert result.events is not None
    events = list(result.events.events)
    restored = next(e for e in events if e.type == "job_restored")
    beats = [(e, e.decoded()) for e in events if e.type == "heartbeat"]
    first_env, first = next((e, hb) for e, hb in beats if e.attempt == 2)
    assert isinstance(first, p.Heartbeat)
    assert first.restore_duration_ms is not None and first.restore_duration_ms >= 0
    assert first.first_record_after_restore is not None
    assert restored.timestamp <= first.first_record_after_restore <= first_env.timestamp
    others = [hb for e, hb in beats if e is not first_env]
    assert len(others) == len(beats) - 1 >= 5
    for hb in others:
        assert isinstance(hb, p.Heartbeat)
        assert hb.restore_duration_ms is None and hb.first_record_after_restore is None
