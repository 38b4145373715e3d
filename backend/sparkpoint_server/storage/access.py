"""API tokens and the audit log in the database: create, find, list and revoke tokens; record
and read audit entries.

A token's secret is never stored: :func:`create_token` keeps its SHA-256 and hands the secret
back once. The audit log keeps its newest ``retention`` rows (:func:`record_audit`).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from sparkpoint_server.storage.models import ApiToken, AuditEntry

SECRET_PREFIX = "spt_"  # tells a Sparkpoint token apart in a secret scanner or a config file


def secret_digest(secret: str) -> str:
    """The SHA-256 of a token's secret, in hex: what the database holds instead of it."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class NewToken:
    """A token just created: its row, shaped for the API, and its secret (shown once)."""

    token: dict[str, Any]
    secret: str


def shape_token(row: ApiToken) -> dict[str, Any]:
    """A token as the API shows it (never its secret nor its digest)."""
    return {
        "id": row.token_id,
        "name": row.name,
        "role": row.role,
        "created": row.created_at,
        "created-by": row.created_by,
        "expires": row.expires_at,
        "revoked": row.revoked_at,
        "revoked-by": row.revoked_by,
    }


def create_token(
    session: Session, name: str, role: str, created_by: str, now_ms: int, expires_at: int | None
) -> NewToken:
    """Store a new token of ``role`` (its secret's digest only) and return it with its secret."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        token_id=secrets.token_hex(8),
        name=name,
        role=role,
        secret_sha256=secret_digest(secret),
        created_at=now_ms,
        created_by=created_by,
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return NewToken(shape_token(row), secret)


def find_token(session: Session, secret: str) -> ApiToken | None:
    """The token whose secret is ``secret`` (revoked and expired ones too), else ``None``."""
    digest = secret_digest(secret)
    return session.scalars(select(ApiToken).where(ApiToken.secret_sha256 == digest)).first()


def list_tokens(session: Session) -> list[dict[str, Any]]:
    """Every token, newest first (revoked and expired ones too)."""
    rows = session.scalars(select(ApiToken).order_by(ApiToken.created_at.desc()))
    return [shape_token(row) for row in rows]


def revoke_token(session: Session, token_id: str, revoked_by: str, now_ms: int) -> dict[str, Any]:
    """Revoke a token (once: revoking it again changes nothing); returns it.

    Raises:
        KeyError: no token has this id.
    """
    row = session.get(ApiToken, token_id)
    if row is None:
        raise KeyError(token_id)
    if row.revoked_at is None:
        row.revoked_at = now_ms
        row.revoked_by = revoked_by
    return shape_token(row)


def record_audit(session: Session, entry: dict[str, Any], retention: int) -> None:
    """Add one audit entry (:class:`AuditEntry`'s columns) and drop all but the newest
    ``retention`` rows."""
    row = AuditEntry(**entry)
    session.add(row)
    session.flush()
    oldest_kept = row.entry_id - retention
    if oldest_kept > 0:
        session.execute(delete(AuditEntry).where(AuditEntry.entry_id <= oldest_kept))


def shape_audit(row: AuditEntry) -> dict[str, Any]:
    return {
        "id": row.entry_id,
        "time": row.timestamp,
        "token-id": row.token_id,
        "token-name": row.token_name,
        "role": row.role,
        "method": row.method,
        "path": row.path,
        "job-id": row.job_id,
        "request": row.request_body,
        "status": row.status_code,
        "request-id": row.request_id,
    }


def audit_log(
    session: Session, limit: int, offset: int = 0, job_id: str | None = None
) -> dict[str, Any]:
    """``limit`` audit entries from ``offset``, newest first, of one job or all; ``total``
    counts the entries that match."""
    query = select(AuditEntry)
    count = select(func.count()).select_from(AuditEntry)
    if job_id is not None:
        query = query.where(AuditEntry.job_id == job_id)
        count = count.where(AuditEntry.job_id == job_id)
    rows = session.scalars(query.order_by(AuditEntry.entry_id.desc()).offset(offset).limit(limit))
    return {"entries": [shape_audit(row) for row in rows], "total": session.scalar(count) or 0}
