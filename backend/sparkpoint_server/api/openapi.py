"""The OpenAPI document as the server behaves: 400 for invalid input, the token where needed.

FastAPI documents a 422 ``HTTPValidationError`` on every route with parameters, and the
bearer token on every route that depends on ``require_token``. Neither is what the server
does, so :func:`install_openapi` rewrites FastAPI's document once, on first use, from the
app's settings:

1. Invalid input answers 400 with ``{"errors": [...]}`` (``api/errors.py``): FastAPI's 422 is
   removed, and every operation with a parameter or a body documents that 400. A 422 a
   route documents itself (a corrupt checkpoint to restore) stays. Every operation documents
   the 503 of a database that is away.
2. The token and its role (``auth.required_role``): mutating operations on jobs need an
   operator's, ``/tokens`` and ``/audit`` an admin's, reads a viewer's only when
   ``SPARKPOINT_PROTECT_READS`` is set, ``/healthz`` none, and nothing when the app has no
   token (one built without ``sparkpoint server``). An operation that needs one declares the
   ``HTTPBearer`` security requirement, its 401, the role in ``x-required-role`` and its
   description, and a 403 when a valid token can lack the role (operator, admin); the others
   declare none of it.
3. The bearer scheme's description says which of the above this server does.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from sparkpoint_server.api.auth import Role, required_role
from sparkpoint_server.api.responses import ERROR_STATUSES, Errors
from sparkpoint_server.config import Settings

BEARER = "HTTPBearer"
_FASTAPI_422 = "#/components/schemas/HTTPValidationError"
_ERRORS_REF = {"$ref": f"#/components/schemas/{Errors.__name__}"}


ROLE_EXTENSION = "x-required-role"


def _error(status: int) -> dict[str, Any]:
    return {
        "description": ERROR_STATUSES[status],
        "content": {"application/json": {"schema": _ERRORS_REF}},
    }


def _is_fastapis_422(response: dict[str, Any]) -> bool:
    schema = response.get("content", {}).get("application/json", {}).get("schema", {})
    return bool(schema.get("$ref") == _FASTAPI_422)


def bearer_description(settings: Settings) -> str:
    if settings.api_token is None:
        return (
            "No token is configured (an app built without `sparkpoint server`, which always "
            "has one): no operation asks for it."
        )
    reads = (
        "reads need it too (`SPARKPOINT_PROTECT_READS` is set)"
        if settings.protect_reads
        else "reads are open (set `SPARKPOINT_PROTECT_READS` to protect them)"
    )
    return (
        "`Authorization: Bearer <token>`: the bootstrap admin token (`SPARKPOINT_API_TOKEN` "
        "or the generated `api-token` file) or a token of `POST /tokens`. Roles, each "
        "including the ones before it: `viewer` (reads), `operator` (every mutating call on "
        "jobs), `admin` (`/tokens`, `/audit`). Each operation names the role it needs in "
        f"`{ROLE_EXTENSION}`; {reads}. `/healthz` never needs a token. A missing, unknown, "
        "revoked or expired token answers 401; a valid one of a lower role, 403."
    )


def shape_openapi(document: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Steps 1-3 of the module docstring, applied to FastAPI's ``document`` in place."""
    # Step 1
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            if "422" in responses and _is_fastapis_422(responses["422"]):
                del responses["422"]
            if operation.get("parameters") or "requestBody" in operation:
                responses.setdefault("400", _error(400))
            responses.setdefault("503", _error(503))  # the database may be away
            # Step 2
            if "security" not in operation:
                continue
            role = required_role(method, path, settings)
            if role is None:
                del operation["security"]
                continue
            operation["security"] = [{BEARER: []}]
            operation[ROLE_EXTENSION] = role.label
            needs = f"Needs a token with the role `{role.label}` (or higher)."
            operation["description"] = f"{operation.get('description', '')}\n\n{needs}".strip()
            responses.setdefault("401", _error(401))
            if role > Role.VIEWER:
                responses.setdefault("403", _error(403))
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas.setdefault(Errors.__name__, Errors.model_json_schema())
    # Step 3
    scheme = components.get("securitySchemes", {}).get(BEARER)
    if scheme is not None:
        scheme["description"] = bearer_description(settings)
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`shape_openapi` of FastAPI's document as ``app.openapi()``."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = FastAPI.openapi(app)
            app.openapi_schema = shape_openapi(document, app.state.settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
