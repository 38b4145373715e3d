"""Per-operator checkpoint timelines: each operator's statistics over the last N checkpoints.

Flink's REST API shows one checkpoint at a time (``/checkpoints/details/{id}`` and its
subtasks); which operator holds checkpoints up *across* checkpoints has to be read off one
page after another. This is the read side of that question: for each operator (vertex) of a
job, one entry per checkpoint of the newest ``limit``, with its end-to-end duration (its latest
acknowledgement minus the trigger, as Flink's ``TaskCheckpointStatistics`` counts it), the
slowest subtask's synchronous, asynchronous, alignment and start-delay parts, its sizes and its
slowest subtask.

Two statements, each an index range over the primary keys: the checkpoints (``checkpoints``
backwards from the newest id) and their subtasks aggregated per (checkpoint, operator), with
the slowest subtask picked by a window function (SQLite and PostgreSQL both have them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from sparkpoint_server.errors import JobNotFoundError
from sparkpoint_server.storage.models import Checkpoint, CheckpointSubtask, Job

C = Checkpoint.__table__.c
S = CheckpointSubtask.__table__.c
J = Job.__table__.c

MAX_TIMELINE_CHECKPOINTS = 1000  # the most checkpoints one answer covers
COMPLETED = "COMPLETED"


def operator_timelines(session: Session, job_id: str, limit: int) -> dict[str, Any]:
    """Each operator's statistics over the job's newest ``limit`` checkpoints, oldest first.

    Steps: (1) the job and its vertices, (2) the newest ``limit`` checkpoints, (3) their
    subtasks aggregated per (checkpoint, operator), (4) the slowest subtask of each, (5) one
    entry per operator and checkpoint (an operator without a row for a checkpoint gets an
    entry with no acknowledgement, so that every operator's list lines up with
    ``checkpoints``).

    Args:
        session: an open session.
        job_id: the job.
        limit: how many checkpoints, at most :data:`MAX_TIMELINE_CHECKPOINTS`.

    Raises:
        JobNotFoundError: the job is unknown.
    """
    # Step 1
    job = session.execute(select(J.graph).where(J.job_id == job_id)).first()
    if job is None:
        raise JobNotFoundError(job_id)
    vertices: list[dict[str, Any]] = list((job.graph or {}).get("vertices") or [])
    # Step 2
    rows = session.execute(
        select(
            C.checkpoint_id,
            C.status,
            C.kind,
            C.trigger_timestamp,
            C.end_to_end_duration,
            C.num_subtasks,
            C.num_acknowledged_subtasks,
        )
        .where(C.job_id == job_id)
        .order_by(C.checkpoint_id.desc())
        .limit(min(limit, MAX_TIMELINE_CHECKPOINTS))
    ).all()
    checkpoints = [_checkpoint_entry(row) for row in reversed(rows)]
    if not checkpoints:
        return {"checkpoints": [], "operators": [_operator(v, []) for v in vertices]}
    first, last = checkpoints[0]["id"], checkpoints[-1]["id"]
    in_range = and_(S.job_id == job_id, S.checkpoint_id.between(first, last))
    # Step 3
    aggregates = {
        (agg.checkpoint_id, agg.operator_id): agg
        for agg in session.execute(
            select(
                S.checkpoint_id,
                S.operator_id,
                func.count(S.ack_timestamp).label("acknowledged"),
                func.max(S.ack_timestamp).label("latest_ack"),
                func.max(S.sync_duration).label("sync"),
                func.max(S.async_duration).label("async_"),
                func.max(S.alignment_duration).label("alignment"),
                func.max(S.start_delay).label("start_delay"),
                func.sum(S.state_size).label("state_size"),
                func.sum(S.checkpointed_size).label("checkpointed_size"),
                func.max(S.subtask).label("max_subtask"),
            )
            .where(in_range)
            .group_by(S.checkpoint_id, S.operator_id)
        ).all()
    }
    # Step 4
    rank = (
        func.row_number()
        .over(
            partition_by=(S.checkpoint_id, S.operator_id),
            order_by=(S.end_to_end_duration.desc().nulls_last(), S.subtask),
        )
        .label("rank")
    )
    ranked = (
        select(S.checkpoint_id, S.operator_id, S.subtask, S.end_to_end_duration.label("e2e"), rank)
        .where(in_range, S.end_to_end_duration.is_not(None))
        .subquery()
    )
    slowest = {
        (r.checkpoint_id, r.operator_id): {"index": r.subtask, "end_to_end_duration": r.e2e}
        for r in session.execute(
            select(
                ranked.c.checkpoint_id, ranked.c.operator_id, ranked.c.subtask, ranked.c.e2e
            ).where(ranked.c.rank == 1)
        ).all()
    }
    # Step 5
    known = {v["id"] for v in vertices}
    for operator_id in sorted({op for _, op in aggregates} - known):  # no longer in the graph
        vertices.append({"id": operator_id, "name": operator_id, "parallelism": 0})
    operators = []
    for vertex in vertices:
        entries = []
        for checkpoint in checkpoints:
            key = (checkpoint["id"], vertex["id"])
            entries.append(_task_entry(checkpoint, vertex, aggregates.get(key), slowest.get(key)))
        operators.append(_operator(vertex, entries))
    return {"checkpoints": checkpoints, "operators": operators}


def _checkpoint_entry(row: Any) -> dict[str, Any]:
    is_savepoint = row.kind == "savepoint"
    return {
        "id": row.checkpoint_id,
        "status": row.status,
        "is_savepoint": is_savepoint,
        "checkpoint_type": "SAVEPOINT" if is_savepoint else "CHECKPOINT",
        "trigger_timestamp": row.trigger_timestamp,
        "end_to_end_duration": row.end_to_end_duration,
        "num_subtasks": row.num_subtasks,
        "num_acknowledged_subtasks": row.num_acknowledged_subtasks,
    }


def _operator(vertex: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": vertex["id"],
        "name": vertex.get("name", vertex["id"]),
        "parallelism": int(vertex.get("parallelism") or 0),
        "checkpoints": entries,
    }


def _task_entry(
    checkpoint: dict[str, Any],
    vertex: dict[str, Any],
    agg: Any | None,
    slowest: dict[str, Any] | None,
) -> dict[str, Any]:
    """One operator's part of one checkpoint (its status as :func:`checkpoint_details`'s task
    entry says it: COMPLETED once every subtask acknowledged, else the checkpoint's)."""
    parallelism = int(vertex.get("parallelism") or 0) or (agg.max_subtask + 1 if agg else 0)
    acknowledged = agg.acknowledged if agg is not None else 0
    latest_ack = agg.latest_ack if agg is not None else None
    trigger = checkpoint["trigger_timestamp"]
    end_to_end = None
    if latest_ack is not None and trigger is not None:
        end_to_end = float(max(latest_ack - trigger, 0))
    return {
        "id": checkpoint["id"],
        "status": COMPLETED if acknowledged >= parallelism > 0 else checkpoint["status"],
        "trigger_timestamp": trigger,
        "latest_ack_timestamp": latest_ack,
        "end_to_end_duration": end_to_end,
        "sync_duration": agg.sync if agg is not None else None,
        "async_duration": agg.async_ if agg is not None else None,
        "alignment_duration": agg.alignment if agg is not None else None,
        "start_delay": agg.start_delay if agg is not None else None,
        "state_size": int(agg.state_size or 0) if agg is not None else 0,
        "checkpointed_size": int(agg.checkpointed_size or 0) if agg is not None else 0,
        "num_subtasks": parallelism,
        "num_acknowledged_subtasks": acknowledged,
        "slowest_subtask": slowest,
    }
