"""A job's end-to-end guarantee: registered by its driver, stored, served by the REST API.

The registrations go through a real control plane (each database, the real Redis) and the
answers come from the REST API on the same database.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from service_harness import VERTICES, Harness
from sqlalchemy import create_engine, text

from sparkpoint import protocol as p
from sparkpoint_server.storage.db import migrate

from .conftest import AppFactory

WAL_REASON = (
    "sink 'audit' writes a completed checkpoint's records from a write-ahead log to a target "
    "without transactions: a failure while it writes them writes them again"
)


def register(h: Harness, incarnation: str, guarantee: p.GuaranteeModel | None) -> None:
    """``job_registered`` of driver process ``incarnation`` reporting ``guarantee``."""
    config: dict[str, Any] = {
        "mode": "exactly_once",
        "interval_ms": 1000,
        "checkpoint_storage": "filesystem",
        "checkpoint_dir": h.checkpoint_dir,
    }
    event = p.JobRegistered(
        job_name="pv",
        vertices=VERTICES,
        edges=[("source", "pv")],
        config=config,
        incarnation=incarnation,
        guarantee=guarantee,
    )
    h.send(0, event)


def listed(client: TestClient, job_id: str) -> Any:
    [job] = [j for j in client.get("/jobs").json()["jobs"] if j["id"] == job_id]
    return job["guarantee"]


def test_the_registered_guarantee_is_served_with_its_reason(
    harness: Harness, make_client: AppFactory
) -> None:
    register(harness, "driver-1", p.GuaranteeModel(level="at_least_once", reason=WAL_REASON))
    client = make_client()

    answer = client.get(f"/jobs/{harness.job_id}")

    assert answer.status_code == 200
    assert answer.json()["guarantee"] == {"level": "at_least_once", "reason": WAL_REASON}
    assert listed(client, harness.job_id) == {"level": "at_least_once", "reason": WAL_REASON}


def test_exactly_once_without_caveat_has_a_null_reason(
    harness: Harness, make_client: AppFactory
) -> None:
    register(harness, "driver-1", p.GuaranteeModel(level="exactly_once"))

    answer = make_client().get(f"/jobs/{harness.job_id}").json()

    assert answer["guarantee"] == {"level": "exactly_once", "reason": None}


def test_a_driver_that_reports_none_has_an_unknown_guarantee(
    harness: Harness, make_client: AppFactory
) -> None:
    register(harness, "driver-1", None)
    client = make_client()

    assert client.get(f"/jobs/{harness.job_id}").json()["guarantee"] is None
    assert listed(client, harness.job_id) is None


def test_a_restarted_driver_replaces_the_guarantee(
    harness: Harness, make_client: AppFactory
) -> None:
    """The new driver process may run a changed job: its registration is the one that counts."""
    register(harness, "driver-1", p.GuaranteeModel(level="exactly_once"))
    register(harness, "driver-2", p.GuaranteeModel(level="at_most_once", reason="socket"))

    answer = make_client().get(f"/jobs/{harness.job_id}").json()

    assert answer["guarantee"] == {"level": "at_most_once", "reason": "socket"}
    assert answer["attempt"] == 2  # the same job, failed over to its next attempt


def test_0007_leaves_existing_jobs_without_a_guarantee(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate(url, "0006")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (job_id, name, status, attempt, created_at, updated_at, "
                "start_time, graph, config, checkpoint_config, restart_strategy, "
                "next_checkpoint_id, continuous_failures, restarts, restored_is_savepoint, "
                "records, records_per_second, source_lag) VALUES ('old', 'old', 'RUNNING', 1, "
                "0, 0, 0, '{}', '{}', '{}', '{}', 1, 0, 0, 0, 0, 0.0, 0)"
            )
        )

    migrate(url)

    with engine.connect() as conn:
        row = conn.execute(text("SELECT guarantee_level, guarantee_reason FROM jobs")).one()
    engine.dispose()
    assert tuple(row) == (None, None)
