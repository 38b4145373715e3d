"""The REST API's error answers, in Flink's shape ``{"errors": ["<message>"]}``.

:func:`install_error_handlers` maps:

- a :class:`~sparkpoint_server.errors.ControlPlaneError` to its ``status_code``;
- invalid input (body, query or path) to 400, one ``"<field>: <what is wrong>"`` per problem
  (never FastAPI's 422 dump);
- an unknown route to 404 ``"Not found: <path>"``, a wrong method to 405 with ``Allow``
  naming every method of the path;
- the database away to 503 ``"the control plane's database is unavailable: <the driver's
  first line, without host, port or user>; retry"`` with ``Retry-After``, logged in one line
  (with them): SQLAlchemy's
  ``OperationalError`` or ``InterfaceError`` (no connection, a full disk, a lock held too
  long) and its pool's ``TimeoutError`` (no connection free in time);
- anything else to 500 ``"internal error: <ExceptionType>"``, logged with its stack trace,
  which never reaches the body.
"""

from __future__ import annotations

import logging
import re
import typing
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route, compile_path

from sparkpoint_server.errors import ControlPlaneError, NotAuthenticatedError

logger = logging.getLogger(__name__)

DATABASE_RETRY_AFTER_S = 5


class InvalidConfigurationError(ControlPlaneError):
    """Options that do not make a valid configuration; the message names the option."""

    status_code = 400


class ControlPlaneUnavailableError(ControlPlaneError):
    """The coordination service is not running in this process (yet)."""

    status_code = 503


def error_response(status_code: int, *messages: str, **headers: str) -> JSONResponse:
    """Flink's error body with ``messages``."""
    return JSONResponse({"errors": list(messages)}, status_code=status_code, headers=headers)


def validation_messages(errors: Sequence[Any], body_fields: Sequence[str] = ()) -> list[str]:
    """One ``"<field>: <what is wrong>"`` per pydantic/FastAPI validation error.

    The field is the error's location without its source (``body``, ``query``, ``path``,
    ``header``); a problem with the whole body is reported as ``body``. ``body_fields``: the
    names a JSON body may have, listed after a name it may not (a misspelling says what
    was meant).
    """
    messages = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        where = loc[1:] if len(loc) > 1 and loc[0] in {"body", "query", "path", "header"} else loc
        if error.get("type") == "json_invalid":
            where = ["body"]
        field = ".".join(where) or "body"
        message = str(error.get("msg", "invalid"))
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        detail = (error.get("ctx") or {}).get("error")
        if error.get("type") == "json_invalid" and detail:
            message = f"{message} ({detail})"
        top_level = len(loc) == 2 and loc[0] == "body"
        if error.get("type") == "extra_forbidden" and body_fields and top_level:
            message = f"{message}; the fields are {', '.join(body_fields)}"
        messages.append(f"{field}: {message}")
    return messages


async def _control_plane_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ControlPlaneError)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, NotAuthenticatedError) else {}
    return error_response(exc.status_code, str(exc), **headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, *validation_messages(exc.errors(), _body_fields(request)))


def _body_fields(request: Request) -> list[str]:
    """The field names (as the JSON spells them) of the body model of the request's route
    (also of an optional body), or none when it has no body model."""
    body = getattr(request.scope.get("route"), "body_field", None)
    annotation = getattr(getattr(body, "field_info", None), "annotation", None)
    for model in (annotation, *typing.get_args(annotation)):
        if isinstance(model, type) and issubclass(model, BaseModel):
            return [info.alias or name for name, info in model.model_fields.items()]
    return []


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        return error_response(404, f"Not found: {request.url.path}", **headers)
    if exc.status_code == 405:
        message = f"Method not allowed: {request.method} {request.url.path}"
        headers["Allow"] = ", ".join(allowed_methods(request))
        return error_response(405, message, **headers)
    return error_response(exc.status_code, str(exc.detail), **headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method the request's path has (Starlette's 405 names only its first route's):
    the operations the OpenAPI document lists at the path itself when it lists the path
    (``/jobs/overview`` is a resource of its own, not the job ``overview``), else at every
    path template that matches it and the app's own routes (``/openapi.json``, ``/docs``);
    and HEAD wherever GET is."""
    paths: dict[str, Any] = request.app.openapi().get("paths", {})
    methods: set[str] = set()
    if request.url.path in paths:
        methods = {method.upper() for method in paths[request.url.path]}
    else:
        scope = {key: request.scope[key] for key in ("type", "path", "root_path", "method")}
        for route in request.app.router.routes:
            if isinstance(route, Route) and route.matches(scope)[0] is not Match.NONE:
                methods |= route.methods or set()
        for path, operations in paths.items():
            if compile_path(path)[0].match(request.url.path):
                methods |= {method.upper() for method in operations}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


# What a database driver's message may name that an API caller need not learn: quoted names
# (host, user, database), IPv4 addresses, ports and connection-string fields.
_PRIVATE = (
    (re.compile(r'"[^"]*"'), '"…"'),
    (re.compile(r"'[^']*'"), "'…'"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "…"),
    (re.compile(r"\bport \d+"), "port …"),
    (re.compile(r"\b(host|hostaddr|user|dbname|password)=\S+"), r"\1=…"),
)


def public_cause(cause: str) -> str:
    """``cause`` without the database's host, port, user or database name: what an answer
    says (the log keeps them for the operator)."""
    for pattern, replacement in _PRIVATE:
        cause = pattern.sub(replacement, cause)
    return cause


def database_cause(exc: DBAPIError) -> str:
    """The first line of the database driver's own message (not SQLAlchemy's, which carries
    the statement and its values)."""
    return (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0][:300]


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, DBAPIError):
        cause = database_cause(exc)
    else:  # every pooled connection taken, none back in time: the database hangs
        cause = "no connection free in the pool in time"
    logger.warning("%s %s: database unavailable: %s", request.method, request.url.path, cause)
    message = f"the control plane's database is unavailable: {public_cause(cause)}; retry"
    return error_response(503, message, **{"Retry-After": str(DATABASE_RETRY_AFTER_S)})


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers described in this module's docstring on ``app``."""
    app.add_exception_handler(ControlPlaneError, _control_plane_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(InterfaceError, _database_unavailable)
    app.add_exception_handler(PoolTimeoutError, _database_unavailable)
    app.add_exception_handler(Exception, _internal_error)
