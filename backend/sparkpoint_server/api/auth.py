"""Who calls, and what their role allows: the bearer token's role and each operation's need.

Roles, each including the ones below it (as Kubernetes' view/edit/admin or Grafana's
Viewer/Editor/Admin service accounts):

- ``viewer``: reads, which need a token only when ``SPARKPOINT_PROTECT_READS`` is set;
- ``operator``: every mutating call on jobs (checkpoint, savepoint, stop, restore, cancel,
  configuration, a job's key);
- ``admin``: the tokens (``/tokens``) and the audit log (``/audit``), always authenticated.

The token of the settings (``SPARKPOINT_API_TOKEN`` or the generated ``api-token`` file) is the
bootstrap admin token; the others live in the database, hashed (``storage/access.py``). An app
without a token of its settings (one built without ``sparkpoint server``) asks for none.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_server.config import Settings
from sparkpoint_server.errors import ControlPlaneError, NotAuthenticatedError
from sparkpoint_server.storage import access

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Paths (and their sub-paths) that only an admin may call, reads included.
ADMIN_PATHS = ("/tokens", "/audit")
BOOTSTRAP_ID = "bootstrap"
BOOTSTRAP_NAME = "bootstrap admin"
ANONYMOUS = "anonymous"
INVALID = "invalid token"


class Role(enum.IntEnum):
    """A token's role; a higher one includes the lower ones."""

    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def of(cls, label: str) -> Role:
        return cls[label.upper()]


class PermissionDeniedError(ControlPlaneError):
    """The token is valid but its role does not allow the call; the message names the role
    needed."""

    status_code = 403


@dataclass(frozen=True)
class Principal:
    """Who made a call, as the audit log names them: a token (its id, name and role), or
    nobody (``anonymous``: no token, ``invalid token``: unknown, revoked or expired)."""

    name: str
    token_id: str | None = None
    role: Role | None = None

    @property
    def label(self) -> str:
        """``"<name> (<id>)"``: the creator or revoker a token row names."""
        return f"{self.name} ({self.token_id})" if self.token_id else self.name


class Unauthenticated(NotAuthenticatedError):
    """A 401 that also says who the audit log should name (anonymous or an invalid token)."""

    def __init__(self, message: str, principal: Principal) -> None:
        super().__init__(message)
        self.principal = principal


def required_role(method: str, path: str, settings: Settings) -> Role | None:
    """The role an operation needs (``path`` is its template, ``/jobs/{job_id}``), or
    ``None`` when it is open: no token configured, or a read while reads are open."""
    if settings.api_token is None:
        return None
    if any(path == p or path.startswith(p + "/") for p in ADMIN_PATHS):
        return Role.ADMIN
    if method.upper() in MUTATING_METHODS:
        return Role.OPERATOR
    return Role.VIEWER if settings.protect_reads else None


def identify(
    secret: str | None,
    what: str,
    settings: Settings,
    sessions: sessionmaker[Session] | None,
    now_ms: int,
) -> Principal:
    """The principal a bearer ``secret`` stands for; ``what`` names the call in messages.

    Raises:
        Unauthenticated: no secret, or one that is unknown, revoked or expired (the message
            says which, never the secret).
    """
    if not secret:
        raise Unauthenticated(
            f"a bearer token is required for {what}: send 'Authorization: Bearer <token>'",
            Principal(ANONYMOUS),
        )
    bootstrap = settings.api_token
    if bootstrap and hmac.compare_digest(secret.encode(), bootstrap.encode()):
        return Principal(BOOTSTRAP_NAME, BOOTSTRAP_ID, Role.ADMIN)
    row = None
    if sessions is not None:
        with sessions() as session:
            row = access.find_token(session, secret)
    if row is None:
        raise Unauthenticated(f"the bearer token is wrong for {what}", Principal(INVALID))
    who = Principal(INVALID, row.token_id)
    if row.revoked_at is not None:
        raise Unauthenticated(f"the bearer token {row.token_id} is revoked", who)
    if row.expires_at is not None and row.expires_at <= now_ms:
        raise Unauthenticated(f"the bearer token {row.token_id} has expired", who)
    return Principal(row.name, row.token_id, Role.of(row.role))


def authorize(principal: Principal, needed: Role) -> None:
    """Raises:
    PermissionDeniedError: the principal's role is below ``needed`` (naming both)."""
    if principal.role is None or principal.role < needed:
        has = principal.role.label if principal.role else "none"
        raise PermissionDeniedError(
            f"this call needs a token with the role {needed.label} (or higher); "
            f"token {principal.token_id} has the role {has}"
        )
