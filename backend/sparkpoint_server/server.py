"""``sparkpoint server``: run the control plane with uvicorn."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import sys

import uvicorn

from sparkpoint_server.app import Runner, create_app
from sparkpoint_server.config import Settings, load_settings
from sparkpoint_server.data_dir_lock import DataDirectoryInUseError, DataDirectoryLock
from sparkpoint_server.engine_process import MAX_RESTARTS, RESTART_WINDOW_S, EngineRunner
from sparkpoint_server.errors import SettingsError, StartupError

TOKEN_FILE = "api-token"
#: The shortest API token the server accepts (from ``SPARKPOINT_API_TOKEN`` or the token file):
#: an empty or short token would leave the API open or guessable.
MIN_API_TOKEN_LENGTH = 16


def ensure_token(settings: Settings) -> tuple[Settings, bool]:
    """The settings with an API token: ``SPARKPOINT_API_TOKEN``, else the one generated
    earlier for this data directory, else a new one (written there, mode 0600).

    Returns:
        The settings and whether the token was generated here (to print it).

    Raises:
        SettingsError: the variable (even set to an empty value) or the file holds a token
            shorter than ``MIN_API_TOKEN_LENGTH``: the server never runs with an open API.
    """
    if settings.api_token is not None:
        check_api_token(settings.api_token, "SPARKPOINT_API_TOKEN")
        return settings, False
    path = settings.data_dir / TOKEN_FILE
    if path.is_file():
        token = check_api_token(path.read_text().strip(), str(path))
        generated = False
    else:
        token = secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        generated = True
    return settings.model_copy(update={"api_token": token}), generated


def check_api_token(token: str, source: str) -> str:
    """``token`` when it is long enough to protect the API.

    Args:
        token: The token.
        source: Where it came from, for the message (the variable or the file).

    Raises:
        SettingsError: naming ``source`` when the token, without surrounding whitespace, is
            empty or shorter than :data:`MIN_API_TOKEN_LENGTH`.
    """
    length = len(token.strip())
    if length < MIN_API_TOKEN_LENGTH:
        what = "empty" if not length else f"{length} characters long"
        raise SettingsError(
            f"the API token in {source} is {what}; it needs at least {MIN_API_TOKEN_LENGTH} "
            "characters (unset SPARKPOINT_API_TOKEN and delete the token file to have one "
            "generated)"
        )
    return token


def serve(host: str, port: int) -> int:
    """Run the control plane until interrupted; returns the exit status (2: bad settings, an
    API token that is empty or too short, or another server holds the data directory)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        given = load_settings()
    except SettingsError as err:
        print(f"sparkpoint server: {err}", file=sys.stderr)
        return 2
    lock = DataDirectoryLock(given.data_dir)
    try:
        lock.acquire()  # before anything in the data directory is touched
    except DataDirectoryInUseError as err:
        print(f"sparkpoint server: {err}", file=sys.stderr)
        return 2
    try:
        return _serve_locked(host, port, given)
    finally:
        lock.release()


def _serve_locked(host: str, port: int, given: Settings) -> int:
    try:
        settings, _generated = ensure_token(given)
    except SettingsError as err:
        print(f"sparkpoint server: {err}", file=sys.stderr)
        return 2
    token = (
        "from SPARKPOINT_API_TOKEN"  # the operator's own secret is not echoed into logs
        if given.api_token is not None
        else f"{settings.api_token} (kept in {settings.data_dir / TOKEN_FILE})"
    )
    print(
        f"sparkpoint server: REST API on http://{host}:{port} (OpenAPI at /docs); "
        f"data in {settings.data_dir.resolve()}\n"
        f"sparkpoint server: API token (Authorization: Bearer ...): {token}",
        flush=True,
    )
    if not settings.api_process:
        return _run(host, port, settings, Runner(settings))

    def on_engine_exit(code: int | None) -> None:
        print(
            f"sparkpoint server: the engine process exited (code {code}): "
            f"{MAX_RESTARTS + 1} deaths within {RESTART_WINDOW_S:g} s; stopping the API",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts the API down, then ends by it

    return _run(host, port, settings, EngineRunner(settings, on_engine_exit))


def _run(host: str, port: int, settings: Settings, runner: Runner | EngineRunner) -> int:
    """Take the port, start the control plane, then serve the API until interrupted (1: the
    port is taken or the control plane could not start, told in one line)."""
    try:
        sock = _listen(host, port)
    except OSError as err:
        print(f"sparkpoint server: cannot listen on {host}:{port}: {err}", file=sys.stderr)
        return 1
    with sock:
        try:
            runner.start()
        except StartupError as err:
            print(f"sparkpoint server: cannot start: {err}", file=sys.stderr)
            return 1
        app = create_app(settings, runner=runner)
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises Ctrl-C again once down
            uvicorn.Server(uvicorn.Config(app, log_level="info")).run(sockets=[sock])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (before anything starts, so that a port in use costs
    no start of Redis, the database and the engine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
