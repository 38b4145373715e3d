"""API tokens (admin only): create one of a role (its secret answered once), list, revoke.

Only the SHA-256 of a secret is stored (``storage/access.py``); a revoked or expired token
answers 401 from then on. The bootstrap admin token of the settings is not listed and cannot
be revoked here: change ``SPARKPOINT_API_TOKEN`` (or delete the ``api-token`` file) instead.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sparkpoint_server.api.auth import ANONYMOUS, Principal
from sparkpoint_server.api.deps import ClockDep, SessionsDep, json_response, require_token
from sparkpoint_server.api.responses import answer, errors
from sparkpoint_server.errors import ControlPlaneError
from sparkpoint_server.storage import access

router = APIRouter(tags=["tokens"], dependencies=[Depends(require_token)])

MAX_EXPIRES_IN = 10 * 366 * 86_400  # ten years, in seconds
TOKEN_ID_PATTERN = "^[0-9a-f]{16}$"
RoleName = Literal["viewer", "operator", "admin"]

TokenId = Annotated[
    str, Path(description="The token's id (`GET /tokens`).", pattern=TOKEN_ID_PATTERN)
]


class TokenNotFoundError(ControlPlaneError):
    status_code = 404

    def __init__(self, token_id: str) -> None:
        super().__init__(f"token {token_id} not found")


class CreateTokenRequest(BaseModel):
    """``POST /tokens``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=100,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="What the token is for (shown in the token list and the audit log).",
    )
    role: RoleName = Field(description="viewer, operator or admin.")
    expires_in: int | None = Field(
        default=None,
        ge=1,
        le=MAX_EXPIRES_IN,
        strict=True,
        description="Seconds until the token expires (default: never).",
    )


class Token(BaseModel):
    """A token (never its secret). Times in milliseconds since the epoch."""

    model_config = ConfigDict(populate_by_name=True)

    id: str = Field(pattern=TOKEN_ID_PATTERN)
    name: str
    role: RoleName
    created: int
    created_by: str = Field(alias="created-by")
    expires: int | None = Field(description="When it expires; null: never.")
    revoked: int | None = Field(description="When it was revoked; null: it is not.")
    revoked_by: str | None = Field(alias="revoked-by")


class TokenList(BaseModel):
    """Every token, newest first, revoked and expired ones too."""

    tokens: list[Token]


class CreatedToken(Token):
    """The new token and its `secret`: shown this once, never stored (only its SHA-256)."""

    secret: str = Field(description="`Authorization: Bearer <secret>`.")


def _caller(request: Request) -> str:
    principal: Principal | None = getattr(request.state, "principal", None)
    return principal.label if principal is not None else ANONYMOUS


@router.post(
    "/tokens",
    summary="Create a token",
    description="A token of `role` named `name`, expiring after `expires_in` seconds if "
    "given. Answers 201 with its `secret`, shown this once: only its SHA-256 is stored.",
    status_code=201,
    response_model=None,
    responses={**answer(CreatedToken, 201), **errors(400)},
)
def create_token(
    body: CreateTokenRequest, request: Request, sessions: SessionsDep, clock: ClockDep
) -> JSONResponse:
    now = clock.now_ms()
    expires_at = now + body.expires_in * 1000 if body.expires_in is not None else None
    with sessions() as session:
        created = access.create_token(
            session, body.name, body.role, _caller(request), now, expires_at
        )
        session.commit()
    return json_response({**created.token, "secret": created.secret}, 201)


@router.get(
    "/tokens",
    summary="List tokens",
    description="Every token of the database, newest first, without secrets (the bootstrap "
    "admin token of the settings is not one of them).",
    response_model=None,
    responses={
        **answer(TokenList),
    },
)
def list_tokens(sessions: SessionsDep) -> JSONResponse:
    with sessions() as session:
        return json_response({"tokens": access.list_tokens(session)})


@router.delete(
    "/tokens/{token_id}",
    summary="Revoke a token",
    description="From now on the token answers 401. Revoking a revoked token changes "
    "nothing. Answers the token.",
    response_model=None,
    responses={**answer(Token), **errors(404)},
)
def revoke_token(
    token_id: TokenId, request: Request, sessions: SessionsDep, clock: ClockDep
) -> JSONResponse:
    with sessions() as session:
        try:
            token = access.revoke_token(session, token_id, _caller(request), clock.now_ms())
        except KeyError as err:
            raise TokenNotFoundError(token_id) from err
        session.commit()
    return json_response(token)
