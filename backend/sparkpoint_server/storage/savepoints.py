"""Read-side queries of savepoints and of the restores that used them.

A savepoint is a ``checkpoints`` row of kind ``savepoint`` (Flink: a checkpoint triggered by
the user, kept until the user deletes it). A restore is an ``operations`` row of kind
``restore``: it names the checkpoint id and the location it restored. A savepoint was used by
the restores whose location is its path (a savepoint can be restored into another job), or,
for a restore without a location, by those of its job naming its id.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sparkpoint_server.storage.models import Checkpoint, Operation
from sparkpoint_server.storage.queries import require_job

C = Checkpoint.__table__.c
O = Operation.__table__.c  # noqa: E741 - the operations table, as in ``queries``


def _restore(row: Any) -> dict[str, Any]:
    return {
        "request-id": row.request_id,
        "job-id": row.job_id,
        "status": row.status,
        "checkpoint-id": row.checkpoint_id,
        "location": row.location,
        "attempt": row.attempt,
        "requested-at": row.created_at,
        "updated-at": row.updated_at,
        "failure-cause": row.failure_cause,
    }


def _restore_rows(session: Session, job_id: str | None = None) -> list[Any]:
    query = select(
        O.request_id,
        O.job_id,
        O.status,
        O.checkpoint_id,
        O.location,
        O.attempt,
        O.created_at,
        O.updated_at,
        O.failure_cause,
    ).where(O.kind == "restore")
    if job_id is not None:
        query = query.where(O.job_id == job_id)
    return list(session.execute(query.order_by(O.created_at.desc(), O.request_id)).all())


def job_restores(session: Session, job_id: str, limit: int) -> dict[str, Any]:
    """The restores requested of a job, newest first: ``{"restores": [...], "truncated"}``.

    Raises:
        JobNotFoundError: the job is unknown.
    """
    require_job(session, job_id)
    rows = _restore_rows(session, job_id)
    return {"restores": [_restore(r) for r in rows[:limit]], "truncated": len(rows) > limit}


def savepoints(session: Session, job_id: str | None, limit: int) -> dict[str, Any]:
    """The completed savepoints, newest first, each with the restores that used it.

    Args:
        job_id: only this job's savepoints (None: every job's).
        limit: how many savepoints at most; ``truncated`` says when more exist.

    Raises:
        JobNotFoundError: ``job_id`` is given and unknown.
    """
    query = select(
        C.job_id,
        C.checkpoint_id,
        C.external_path,
        C.state_size,
        C.checkpointed_size,
        C.trigger_timestamp,
        C.latest_ack_timestamp,
        C.completion_timestamp,
        C.is_final,
        C.target_directory,
    ).where(
        C.kind == "savepoint",
        C.status == "COMPLETED",
        C.external_path.is_not(None),
        C.discarded.is_(False),  # disposed of (POST /savepoint-disposal)
    )
    if job_id is not None:
        require_job(session, job_id)
        query = query.where(C.job_id == job_id)
    rows = session.execute(
        query.order_by(C.completion_timestamp.desc(), C.job_id, C.checkpoint_id.desc()).limit(
            limit + 1
        )
    ).all()
    restores = _restore_rows(session)
    by_location: dict[str, list[dict[str, Any]]] = {}
    by_id: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in restores:
        if r.location:
            by_location.setdefault(r.location, []).append(_restore(r))
        elif r.checkpoint_id is not None:
            by_id.setdefault((r.job_id, r.checkpoint_id), []).append(_restore(r))
    entries = [
        {
            "job-id": r.job_id,
            "id": r.checkpoint_id,
            "location": r.external_path,
            "target-directory": r.target_directory,
            "state-size": r.state_size,
            "checkpointed-size": r.checkpointed_size,
            "trigger-timestamp": r.trigger_timestamp,
            "completion-timestamp": r.completion_timestamp or r.latest_ack_timestamp,
            "is-final": bool(r.is_final),
            "restores": [
                *by_location.get(r.external_path, []),
                *by_id.get((r.job_id, r.checkpoint_id), []),
            ],
        }
        for r in rows[:limit]
    ]
    return {"savepoints": entries, "truncated": len(rows) > limit}
