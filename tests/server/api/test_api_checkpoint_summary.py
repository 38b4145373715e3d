"""Percentiles as Flink estimates them, and the summary cache staying equal to a fresh read."""

from __future__ import annotations

import random
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, update
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_server.storage.checkpoint_summary import quantile, stats_summary
from sparkpoint_server.storage.models import Checkpoint

from .builders import add_checkpoint, add_job
from .conftest import AppFactory


def test_quantiles_follow_commons_maths_legacy_estimate() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10

    # position q * (n + 1): 0.5 -> 5.5 (between 5 and 6), 0.9 -> 9.9, beyond n -> the maximum
    assert quantile(values, 0.5) == 5.5
    assert quantile(values, 0.9) == pytest.approx(9.9)
    assert quantile(values, 0.99) == 10.0
    assert quantile(values, 0.05) == 1.0  # position 0.55 < 1 -> the minimum
    assert quantile([7.0], 0.999) == 7.0


def test_a_summary_ignores_missing_values() -> None:
    assert stats_summary([None, 3, 1, None, 2]) == {
        "min": 1,
        "max": 3,
        "avg": 2.0,
        "p50": 2.0,
        "p90": 3.0,
        "p95": 3.0,
        "p99": 3.0,
        "p999": 3.0,
    }


def _fresh(client: TestClient) -> dict[str, Any]:
    """What a fresh app (empty cache) answers: the reference."""
    return client.get("/jobs/job-1/checkpoints").json()


def test_the_cached_summary_follows_every_change(
    make_client: AppFactory, sessions: sessionmaker[Session]
) -> None:
    rng = random.Random(3)
    with sessions() as s:
        add_job(s)
        s.flush()
        for cid in range(1, 41):
            status = "FAILED" if cid % 7 == 0 else "COMPLETED"
            add_checkpoint(
                s,
                cid,
                status=status,
                end_to_end_duration=rng.uniform(1, 100),
                state_size=rng.randint(0, 10_000),
            )
        add_checkpoint(s, 41, status="IN_PROGRESS")
        s.commit()
    cached = make_client()
    first = cached.get("/jobs/job-1/checkpoints").json()
    assert first == _fresh(make_client())
    assert first["counts"]["completed"] == 35

    def change(*statements: Any, add: list[int] | None = None) -> None:
        with sessions() as s:
            for statement in statements:
                s.execute(statement)
            for cid in add or []:
                add_checkpoint(
                    s,
                    cid,
                    end_to_end_duration=rng.uniform(1, 100),
                    state_size=rng.randint(0, 10_000),
                )
            s.commit()
        assert cached.get("/jobs/job-1/checkpoints").json() == _fresh(make_client())

    # Newer checkpoints completed: read incrementally.
    change(add=[42, 43])
    # Checkpoint 41 completed late (out of order) while 44 completed.
    done = {"status": "COMPLETED", "end_to_end_duration": 500.0, "state_size": 1}
    change(update(Checkpoint).where(Checkpoint.checkpoint_id == 41).values(**done), add=[44])
    with sessions() as s:
        add_checkpoint(s, 45, kind="savepoint", end_to_end_duration=0.5)
        s.commit()
    assert cached.get("/jobs/job-1/checkpoints").json() == _fresh(make_client())
    # Retention deleted the oldest rows.
    change(delete(Checkpoint).where(Checkpoint.checkpoint_id <= 5))
    # Everything deleted.
    change(delete(Checkpoint))
    assert cached.get("/jobs/job-1/checkpoints").json()["summary"]["state_size"]["max"] is None
