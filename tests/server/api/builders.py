"""Test data for the REST API: model rows with sensible defaults, inserted directly.

Each ``add_*`` takes an open session, adds one row (overrides as keyword arguments) and returns
it; the caller commits. Timestamps count from :data:`T0` so that expected values are exact.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from sparkpoint_server.storage.models import (
    Checkpoint,
    CheckpointSubtask,
    Heartbeat,
    Job,
    JobException,
    JobStatusChange,
    Operation,
)

T0 = 1_700_000_000_000

GRAPH: dict[str, Any] = {
    "vertices": [
        {"id": "source", "name": "source -> parse", "parallelism": 2, "operators": ["a", "b"]},
        {"id": "count", "name": "count -> sink", "parallelism": 3, "operators": ["c", "d"]},
    ],
    "edges": [["source", "count"]],
}
CHECKPOINT_CONFIG: dict[str, Any] = {
    "mode": "exactly_once",
    "interval_ms": 1000,
    "timeout_ms": 60_000,
    "min_pause_ms": 0,
    "max_concurrent": 1,
    "tolerable_failures": 2,
    "retained": 3,
}
CONFIG: dict[str, Any] = {
    **CHECKPOINT_CONFIG,
    "checkpoint_storage": "filesystem",
    "checkpoint_dir": "file:///tmp/chk",
    "state_backend": "rocksdb",
    "incremental": True,
    "max_parallelism": 128,
}
RESTART = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": 3,
    "restart-strategy.fixed-delay.delay": "10 s",
}


def add_job(session: Session, job_id: str = "job-1", **overrides: Any) -> Job:
    values: dict[str, Any] = {
        "job_id": job_id,
        "name": f"{job_id}-name",
        "status": "RUNNING",
        "attempt": 1,
        "created_at": T0,
        "updated_at": T0,
        "start_time": T0,
        "end_time": None,
        "graph": GRAPH,
        "config": CONFIG,
        "checkpoint_config": CHECKPOINT_CONFIG,
        "restart_strategy": RESTART,
        "next_checkpoint_id": 1,
        "restarts": 0,
        "spark_application_id": None,
        "spark_ui_url": None,
        "records": 0,
        "records_per_second": 0.0,
        "source_lag": 0,
    }
    job = Job(**{**values, **overrides})
    session.add(job)
    return job


def add_checkpoint(
    session: Session, checkpoint_id: int, job_id: str = "job-1", **overrides: Any
) -> Checkpoint:
    """A checkpoint, COMPLETED by default, triggered at ``T0 + 1000 * checkpoint_id``."""
    trigger = T0 + 1000 * checkpoint_id
    status = overrides.get("status", "COMPLETED")
    done = status == "COMPLETED"
    values: dict[str, Any] = {
        "job_id": job_id,
        "checkpoint_id": checkpoint_id,
        "attempt": 1,
        "epoch": None,
        "kind": "checkpoint",
        "is_final": False,
        "status": status,
        "trigger_timestamp": trigger,
        "latest_ack_timestamp": trigger + 40 if done else None,
        "completion_timestamp": trigger + 50 if status != "IN_PROGRESS" else None,
        "end_to_end_duration": 50.0 if done else None,
        "state_size": 1000 if done else 0,
        "checkpointed_size": 500 if done else 0,
        "alignment_buffered": 0,
        "num_subtasks": 5,
        "num_acknowledged_subtasks": 5 if done else 0,
        "external_path": f"file:///tmp/chk/{job_id}/chk-{checkpoint_id}" if done else None,
        "failure_reason": None,
        "failure_message": None,
        "discarded": False,
        "committed": done,
        "commit_timestamp": trigger + 53 if done else None,
    }
    row = Checkpoint(**{**values, **overrides})
    session.add(row)
    return row


def add_subtask(
    session: Session,
    checkpoint_id: int,
    operator_id: str,
    subtask: int,
    job_id: str = "job-1",
    **overrides: Any,
) -> CheckpointSubtask:
    """An acknowledged subtask (pass ``ack_timestamp=None`` for one that has not acked)."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "checkpoint_id": checkpoint_id,
        "operator_id": operator_id,
        "subtask": subtask,
        "attempt": 1,
        "barrier_timestamp": T0 + 10,
        "alignment_duration": 1.0,
        "alignment_buffered": 0,
        "alignment_buffered_records": 0,
        "ack_timestamp": T0 + 40,
        "start_delay": 2.0,
        "sync_duration": 3.0,
        "async_duration": 4.0,
        "state_size": 100,
        "checkpointed_size": 50,
        "end_to_end_duration": 40.0,
        "clock_flagged": False,
        "declined_reason": None,
        "ack": None,
    }
    row = CheckpointSubtask(**{**values, **overrides})
    session.add(row)
    return row


def add_status(
    session: Session, status: str, timestamp: int, job_id: str = "job-1", **overrides: Any
) -> JobStatusChange:
    values: dict[str, Any] = {
        "job_id": job_id,
        "attempt": 1,
        "timestamp": timestamp,
        "status": status,
        "previous": None,
        "cause": None,
    }
    row = JobStatusChange(**{**values, **overrides})
    session.add(row)
    return row


def add_exception(
    session: Session, timestamp: int, job_id: str = "job-1", **overrides: Any
) -> JobException:
    values: dict[str, Any] = {
        "job_id": job_id,
        "dedupe_key": f"{job_id}:{timestamp}",
        "attempt": 1,
        "timestamp": timestamp,
        "kind": "TASK_FAILURE",
        "cause": "boom",
        "epoch": 7,
        "operator_id": None,
        "subtask": None,
        "action": "restart in 10 s",
    }
    row = JobException(**{**values, **overrides})
    session.add(row)
    return row


def add_operation(
    session: Session, request_id: str, kind: str, job_id: str = "job-1", **overrides: Any
) -> Operation:
    values: dict[str, Any] = {
        "request_id": request_id,
        "job_id": job_id,
        "kind": kind,
        "status": "IN_PROGRESS",
        "created_at": T0,
        "updated_at": T0,
        "checkpoint_id": None,
        "attempt": None,
        "location": None,
        "failure_cause": None,
        "params": {},
    }
    row = Operation(**{**values, **overrides})
    session.add(row)
    return row


def add_heartbeat(
    session: Session, attempt: int, epoch: int, job_id: str = "job-1", **overrides: Any
) -> Heartbeat:
    values: dict[str, Any] = {
        "job_id": job_id,
        "attempt": attempt,
        "epoch": epoch,
        "timestamp": T0 + 1000 * epoch,
        "records": 100 * epoch,
        "duration_ms": 1000.0,
        "records_per_second": 100.0 * epoch,
        "source_lag": epoch,
    }
    row = Heartbeat(**{**values, **overrides})
    session.add(row)
    return row
