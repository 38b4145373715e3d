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

from .builders import T0, add_checkpoint, add_job, add_operation

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
    read_through_ms: int = 0


def build_app(
    sessions: sessionmaker[Session] | None,
    *,
    api_token: str | None = None,
    protect_reads: bool = False,
    default_history: int = 100,
    audit_retention: int = 100_000,
    control_plane: Any = None,
    ingest_stats: Any = None,
) -> FastAPI:
    """A FastAPI app with the REST API installed and its state set."""
    app = FastAPI(title="Sparkpoint control plane (test)")
    app.state.settings = Settings(
        api_token=api_token,
        protect_reads=protect_reads,
        default_history=default_history,
        audit_retention=audit_retention,
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


@pytest.fixture
def history(sessions: sessionmaker[Session]) -> None:
    """Job ``job-1``: checkpoints 1, 2, 5 completed, savepoint 4, 3 failed, 6 in progress.

    Attempt 2 restored checkpoint 2 and carried 5 and 6 (epochs 11 and 13); checkpoint 3
    expired before any source injected its barrier (no epoch).
    """
    with sessions() as s:
        add_job(
            s,
            restarts=1,
            restored_checkpoint_id=2,
            restored_at=T0 + 5000,
            restored_path="file:///tmp/chk/job-1/chk-2",
            restored_is_savepoint=False,
            restored_state_ms=120.5,
            restored_first_record=T0 + 5900,
        )
        s.flush()
        sizes = {1: (10.0, 100, 50, 0), 2: (20.0, 200, 100, 10), 5: (30.0, 300, 150, 20)}
        carried = {1: (1, 2), 2: (1, 4), 5: (2, 11)}  # checkpoint: (attempt, epoch)
        for cid, (e2e, state, checkpointed, buffered) in sizes.items():
            attempt, epoch = carried[cid]
            add_checkpoint(
                s,
                cid,
                attempt=attempt,
                epoch=epoch,
                end_to_end_duration=e2e,
                state_size=state,
                checkpointed_size=checkpointed,
                alignment_buffered=buffered,
            )
        add_checkpoint(
            s,
            3,
            status="FAILED",
            failure_reason="CHECKPOINT_EXPIRED",
            failure_message="checkpoint 3 expired before completing",
            discarded=True,
        )
        add_checkpoint(
            s,
            4,
            kind="savepoint",
            epoch=7,
            end_to_end_duration=40.0,
            state_size=400,
            checkpointed_size=200,
            alignment_buffered=30,
            external_path="file:///tmp/sp/savepoint-job-1-4",
        )
        add_checkpoint(s, 6, status="IN_PROGRESS", num_acknowledged_subtasks=4, attempt=2, epoch=13)
        add_operation(s, "r-restore-ok", "restore", status="COMPLETED", checkpoint_id=2)
        add_operation(s, "r-restore-bad", "restore", status="FAILED", failure_cause="gone")
        s.commit()
