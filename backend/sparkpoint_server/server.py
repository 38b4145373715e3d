"""``sparkpoint server``: run the control plane with uvicorn."""

from __future__ import annotations

import logging
import os
import secrets
import sys

import uvicorn

from sparkpoint_server.app import create_app
from sparkpoint_server.config import Settings, load_settings
from sparkpoint_server.errors import SettingsError

TOKEN_FILE = "api-token"


def ensure_token(settings: Settings) -> tuple[Settings, bool]:
    """The settings with an API token: ``SPARKPOINT_API_TOKEN``, else the one generated
    earlier for this data directory, else a new one (written there, mode 0600).

    Returns:
        The settings and whether the token was generated here (to print it).
    """
    if settings.api_token:
        return settings, False
    path = settings.data_dir / TOKEN_FILE
    if path.is_file():
        token = path.read_text().strip()
        generated = False
    else:
        token = secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        generated = True
    return settings.model_copy(update={"api_token": token}), generated


def serve(host: str, port: int) -> int:
    """Run the control plane until interrupted; returns the exit status."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        given = load_settings()
        settings, _generated = ensure_token(given)
    except SettingsError as err:
        print(f"sparkpoint server: {err}", file=sys.stderr)
        return 2
    token = (
        "from SPARKPOINT_API_TOKEN"  # the operator's own secret is not echoed into logs
        if given.api_token
        else f"{settings.api_token} (kept in {settings.data_dir / TOKEN_FILE})"
    )
    print(
        f"sparkpoint server: REST API on http://{host}:{port} (OpenAPI at /docs); "
        f"data in {settings.data_dir.resolve()}\n"
        f"sparkpoint server: API token (Authorization: Bearer ...): {token}",
        flush=True,
    )
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
    return 0
