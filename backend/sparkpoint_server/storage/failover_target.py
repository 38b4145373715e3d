"""What a failover of a job restores now, read from its rows: ``latest.failover`` of
``GET /jobs/{job_id}/checkpoints``.

The engine decides with the rule of ``service.origins.candidates``: the newest retained
checkpoint of the job's line (``service.origins.in_line``: its origin, the checkpoint its
``--from-checkpoint`` or its latest restore request named, or one completed since), else the
origin by its path, else the beginning. The API process reads the same from the database, so
that an operator sees which checkpoint a failure would bring the job back to, and which
retained checkpoints a restore went back past (listed, restorable on request, but not by a
failover).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from sparkpoint_server.coordination.job import TERMINAL, Origin
from sparkpoint_server.service.origins import in_line, same_place
from sparkpoint_server.storage.models import Checkpoint as C
from sparkpoint_server.storage.models import Job as J

_ORIGIN = select(J.origin_checkpoint_id, J.origin_path, J.origin_next_id).where(
    J.job_id == bindparam("job_id")
)
_RETAINED = (
    select(C.checkpoint_id, C.kind, C.external_path)
    .where(
        C.job_id == bindparam("job_id"),
        C.status == "COMPLETED",
        C.discarded.is_(False),
    )
    .order_by(C.checkpoint_id.desc())
)


def failover_target(session: Session, job_id: str) -> dict[str, Any]:
    """``id``, ``is_savepoint`` and ``external_path`` of what a failover restores now (``id``
    null: the beginning), the job's ``origin`` (``id``, ``external_path``, ``next_id``; null:
    it started from the beginning and was never restored) and ``passed_over``: the retained
    checkpoints that a failover does not restore, newest first."""
    row = session.execute(_ORIGIN, {"job_id": job_id}).first()
    origin = None
    if row is not None and row.origin_checkpoint_id is not None and row.origin_next_id is not None:
        origin = Origin(row.origin_checkpoint_id, row.origin_path, row.origin_next_id)
    rows = session.execute(_RETAINED, {"job_id": job_id}).all()

    def is_origin(cid: int, path: str | None) -> bool:
        assert origin is not None
        return cid == origin.checkpoint_id and same_place(path, origin.path)

    held = origin is not None and any(is_origin(cid, path) for cid, _, path in rows)
    target: dict[str, Any] | None = None
    passed_over: list[int] = []
    for cid, kind, path in rows:
        if origin is not None and not in_line(
            origin, cid, is_origin=is_origin(cid, path), origin_held=held
        ):
            passed_over.append(cid)
        elif target is None:
            target = {"id": cid, "is_savepoint": kind == "savepoint", "external_path": path}
    if target is None and origin is not None and origin.path:
        target = {"id": origin.checkpoint_id, "is_savepoint": None, "external_path": origin.path}
    if target is None:
        target = {"id": None, "is_savepoint": False, "external_path": None}
    described = None
    if origin is not None:
        described = {"id": origin.checkpoint_id, "external_path": origin.path}
        described["next_id"] = origin.next_id
    return {**target, "origin": described, "passed_over": passed_over}


_STARTED_ELSEWHERE = select(J.job_id, J.origin_path).where(
    J.origin_path.is_not(None),
    J.job_id != bindparam("job_id"),
    J.status.not_in([status.value for status in TERMINAL]),
)


def origin_of(session: Session, job_id: str) -> list[dict[str, Any]]:
    """The job's retained checkpoints that another live job's failover would restore by their
    path (it started from one, or restored it, and has no checkpoint since), oldest first:
    ``id``, ``is_savepoint``, ``external_path`` and the ``jobs`` that rely on it. Retention
    keeps them, past ``retained`` if need be, until those jobs no longer do
    (``service.origins.relied_on``)."""
    others = session.execute(_STARTED_ELSEWHERE, {"job_id": job_id}).all()
    if not others:
        return []
    retained = [
        (cid, kind, path)
        for cid, kind, path in session.execute(_RETAINED, {"job_id": job_id}).all()
        if path is not None
    ]
    found: dict[int, dict[str, Any]] = {}
    for other, origin_path in sorted(others):
        at = [row for row in retained if same_place(row[2], origin_path)]
        if not at:  # its line started elsewhere: no query for it
            continue
        target = failover_target(session, other)
        if target["is_savepoint"] is not None or target["external_path"] is None:
            continue  # it would restore a checkpoint of its own, or the beginning
        for cid, kind, path in at:
            entry = found.setdefault(
                cid,
                {"id": cid, "is_savepoint": kind == "savepoint", "external_path": path, "jobs": []},
            )
            entry["jobs"].append(other)
    return [found[cid] for cid in sorted(found)]
