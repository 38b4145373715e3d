"""Fixtures of the REST API tests: an app with ``install_api`` on the test database.

The app is built here as ``sparkpoint_server.app`` builds it (state: settings, session
factory, control plane, ingest stats, clock), without Redis or the ingest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint.clock import ManualClock
from sparkpoint_server.api import install_api
from sparkpoint_server.config import Settings

from .builders import T0

NOW = T0 + 60_000  # the ManualClock's time: one minute after the jobs start


@dataclass
class IngestStats:
    """What the ingest counts (the app reads these attributes)."""

    events_ingested: int = 0
    dead_letters: int = 0
    stale_messages: int = 0
    batches: int = 0
    handler_errors: int = 0
    redis_errors: int = 0


def build_app(
    sessions: sessionmaker[Session] | None,
    *,
    api_token: str | None = None,
    protect_reads: bool = False,
    default_history: int = 100,
    control_plane: Any = None,
    ingest_stats: Any = None,
) -> FastAPI:
    """A FastAPI app with the REST API installed and its state set."""
    app = FastAPI(title="Sparkpoint control plane (test)")
    app.state.settings = Settings(
        api_token=api_token, protect_reads=protect_reads, default_history=default_history
    )
    app.state.session_factory = sessions
    app.state.control_plane = control_plane
    app.state.ingest_stats = ingest_stats if ingest_stats is not None else IngestStats()
    app.state.clock = ManualClock(NOW)
    install_api(app)
    return app


AppFactory = Callable[..., TestClient]


@pytest.fixture
def make_client(sessions: sessionmaker[Session]) -> Iterator[AppFactory]:
    """Build a TestClient on the test database; keyword arguments go to :func:`build_app`."""
    clients: list[TestClient] = []

    def make(**kwargs: Any) -> TestClient:
        client = TestClient(build_app(sessions, **kwargs), raise_server_exceptions=False)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: AppFactory) -> TestClient:
    """A client of an app without a token (reads and writes open) and without a service."""
    return make_client()
