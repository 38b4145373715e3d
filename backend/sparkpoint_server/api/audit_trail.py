"""The audit trail: every mutating call of the REST API, allowed or refused, recorded in the
database before its answer leaves (who, what, when, the outcome).

:class:`AuditTrail` is an ASGI middleware around the whole API, so that it also sees what
never reaches a route: a refused token (401, 403), invalid input (400), an unknown path
(404). For each POST, PUT, PATCH or DELETE it:

1. copies at most ``CAPTURE`` bytes of the request body as the app reads it;
2. holds the answer until the app is done, so that the row exists before the client has its
   answer (a test, or an operator, reading ``GET /audit`` right after sees it);
3. names the caller: the principal ``require_token`` found (``request.state.principal``), else
   the one the bearer token stands for, else ``anonymous``;
4. writes the row (``storage/access.record_audit``, which keeps the newest
   ``SPARKPOINT_AUDIT_RETENTION`` rows), then lets the answer go. A row that cannot be written
   is logged; the call it describes has happened and keeps its answer.

The body is summarised, never stored as sent: JSON only, values of keys that look secret
(``token``, ``secret``, ``password``, ``key``) replaced, at most ``SUMMARY_CHARS`` characters.
The answer is never recorded, except the ``request-id`` of the operation it started (a
created token's secret is in an answer, never in a request).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any
from urllib.parse import unquote

from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sparkpoint.clock import SystemClock
from sparkpoint_server.api.auth import (
    ANONYMOUS,
    MUTATING_METHODS,
    Principal,
    Unauthenticated,
    identify,
)
from sparkpoint_server.api.errors import database_cause
from sparkpoint_server.storage import access

log = logging.getLogger(__name__)

CAPTURE = 4096  # bytes of a request body looked at
SUMMARY_CHARS = 500
MAX_ANSWER = 65_536  # an answer longer than this is not searched for a request id
REDACTED = "<redacted>"
_SECRET_KEY = re.compile(r"token|secret|password|key", re.IGNORECASE)
_JOB_PATH = re.compile(r"^/jobs/([^/]+)")


def summarize_body(captured: bytes, size: int) -> str | None:
    """A bounded, secret-free summary of a request body (``size`` bytes, ``captured`` their
    start): compact JSON with secret-looking values redacted, cut at ``SUMMARY_CHARS``."""
    if size == 0:
        return None
    if size > len(captured):
        return f"<{size} bytes, not recorded>"
    try:
        value = json.loads(captured)
    except ValueError:
        return f"<{size} bytes, not JSON>"
    text = json.dumps(redact(value), separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def redact(value: Any) -> Any:
    """``value`` with the values of secret-looking keys, at any depth, replaced."""
    if isinstance(value, dict):
        return {k: REDACTED if _SECRET_KEY.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def job_of(path: str) -> str | None:
    """The job id a ``/jobs/{job_id}...`` path names (at most 64 characters)."""
    match = _JOB_PATH.match(path)
    return unquote(match.group(1))[:64] if match else None


def request_id_of(answer: bytes) -> str | None:
    """The ``request-id`` of an answer that started an operation (202), else ``None``."""
    if len(answer) > MAX_ANSWER:
        return None
    try:
        value = json.loads(answer)
    except ValueError:
        return None
    rid = value.get("request-id") if isinstance(value, dict) else None
    return rid[:36] if isinstance(rid, str) else None


class AuditTrail:
    """The ASGI middleware of this module's docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in MUTATING_METHODS:
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        captured = bytearray()
        size = 0

        # Step 1
        async def tee() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                size += len(chunk)
                captured.extend(chunk[: max(0, CAPTURE - len(captured))])
            return message

        # Step 2
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        try:
            await self.app(scope, tee, hold)
        except Exception:
            await self._record(scope, state, bytes(captured), size, 500, None)
            raise
        status = next((m["status"] for m in held if m["type"] == "http.response.start"), 500)
        answer = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
        request_id = request_id_of(answer) if status == 202 else None
        await self._record(scope, state, bytes(captured), size, status, request_id)
        for message in held:
            await send(message)

    async def _record(
        self,
        scope: Scope,
        state: dict[str, Any],
        captured: bytes,
        size: int,
        status: int,
        request_id: str | None,
    ) -> None:
        app = scope["app"]
        sessions = getattr(app.state, "session_factory", None)
        if sessions is None:
            return
        try:
            await run_in_threadpool(
                self._write, app, scope, state, captured, size, status, request_id
            )
        except (OperationalError, InterfaceError) as err:  # the database is away
            cause = database_cause(err)
            log.warning("audit: cannot record %s %s: %s", scope["method"], scope["path"], cause)
        except Exception:
            log.exception("audit: cannot record %s %s", scope["method"], scope["path"])

    @staticmethod
    def _write(
        app: Any,
        scope: Scope,
        state: dict[str, Any],
        captured: bytes,
        size: int,
        status: int,
        request_id: str | None,
    ) -> None:
        settings = app.state.settings
        sessions = app.state.session_factory
        clock = getattr(app.state, "clock", None) or SystemClock()
        now = clock.now_ms()
        # Step 3
        principal: Principal | None = state.get("principal")
        if principal is None:
            principal = _principal_of(scope, settings, sessions, now)
        entry = {
            "timestamp": now,
            "token_id": principal.token_id,
            "token_name": principal.name[:100],
            "role": principal.role.label if principal.role is not None else None,
            "method": scope["method"],
            "path": scope["path"][:500],
            "job_id": job_of(scope["path"]),
            "request_body": summarize_body(captured, size),
            "status_code": status,
            "request_id": request_id,
        }
        # Step 4
        with sessions() as session:
            access.record_audit(session, entry, settings.audit_retention)
            session.commit()


def _principal_of(scope: Scope, settings: Any, sessions: Any, now_ms: int) -> Principal:
    """Who a call's bearer token stands for, when no route asked (an unknown path, an app
    without a token)."""
    header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return Principal(ANONYMOUS)
    try:
        return identify(secret.strip(), "this call", settings, sessions, now_ms)
    except Unauthenticated as err:
        return err.principal
