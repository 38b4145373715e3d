"""``sparkpoint checkpoints``'s text from an answer of ``GET /jobs/{id}/checkpoints`` (the
end-to-end test in ``tests/e2e/test_cli_client.py`` reads it from a real control plane)."""

from __future__ import annotations

from typing import Any

from sparkpoint.cli_checkpoints import history_lines

JOB = {"jid": "owner", "name": "pv", "state": "RUNNING", "attempt": 1}
COUNTS = {"total": 9, "completed": 9, "failed": 0, "in_progress": 0, "restored": 0}


def _stats(**latest: Any) -> dict[str, Any]:
    return {"counts": COUNTS, "latest": latest, "history": []}


def test_a_checkpoint_kept_for_other_jobs_is_named_with_them() -> None:
    failover = {"id": 9, "is_savepoint": False, "external_path": "file:///c/owner/chk-9"}
    kept = {"id": 3, "external_path": "file:///c/owner/chk-3", "jobs": ["fork-1", "fork-2"]}
    lines = history_lines(JOB, _stats(failover=failover, origin_of=[kept]))
    assert lines[1:] == [
        "a failover restores: checkpoint 9",
        "other jobs' restore point: checkpoint 3: fork-1, fork-2 would restore it in a "
        "failover (kept until they have a checkpoint of their own)",
        "no checkpoint yet",
    ]
    assert not any("other jobs" in line for line in history_lines(JOB, _stats(failover=failover)))
    savepoint = {**kept, "is_savepoint": True, "jobs": ["fork-1"]}
    [line] = [x for x in history_lines(JOB, _stats(origin_of=[savepoint])) if "other" in x]
    assert line.startswith("other jobs' restore point: savepoint 3: fork-1 would restore it")
