"""A job's source lag while a source's system does not answer: the driver's heartbeat names
the splits it could not count, and ``GET /jobs/{id}`` and its throughput history say the lag
is unknown (null) instead of the 0 that the other splits add up to."""

from __future__ import annotations

from fastapi.testclient import TestClient
from service_harness import Harness

from .conftest import AppFactory


def heartbeat(h: Harness, epoch: int, lag: int, unanswered: list[str] | None) -> None:
    h.epoch_ended(1, epoch, source_lag=lag, unanswered_splits=unanswered)


def test_a_lag_the_driver_could_not_count_is_null_and_names_the_splits(
    harness: Harness, make_client: AppFactory
) -> None:
    harness.register()
    harness.running(1)
    heartbeat(harness, 0, 1200, [])
    heartbeat(harness, 1, 0, ["redis:ev#0/2", "redis:ev#1/2"])  # its Redis went down
    client: TestClient = make_client()

    throughput = client.get(f"/jobs/{harness.job_id}").json()["throughput"]
    assert (throughput["source-lag"], throughput["unanswered-splits"]) == (
        None,
        ["redis:ev#0/2", "redis:ev#1/2"],
    )

    heartbeat(harness, 2, 900, None)  # a driver that does not report them: its lag counts
    throughput = client.get(f"/jobs/{harness.job_id}").json()["throughput"]
    assert (throughput["source-lag"], throughput["unanswered-splits"]) == (900, [])

    history = client.get(f"/jobs/{harness.job_id}/metrics/throughput").json()
    assert [(s["source-lag"], s["unanswered-splits"]) for s in history] == [
        (1200, []),
        (None, ["redis:ev#0/2", "redis:ev#1/2"]),
        (900, []),
    ]


def test_the_latest_epochs_bound_by_the_checkpoint_timeout_is_the_jobs(
    harness: Harness, make_client: AppFactory
) -> None:
    harness.register()
    harness.running(1)
    client: TestClient = make_client()
    harness.epoch_ended(1, 0, epoch_bound_ms=1200.0)  # held back while it catches up
    assert client.get(f"/jobs/{harness.job_id}").json()["throughput"]["epoch-bound"] == 1200.0
    harness.epoch_ended(1, 1)  # caught up: not held back
    assert client.get(f"/jobs/{harness.job_id}").json()["throughput"]["epoch-bound"] is None


def test_whether_the_attempts_first_epoch_ended_is_the_drivers(
    harness: Harness, make_client: AppFactory
) -> None:
    """Periodic checkpoints wait for it: the API says why none was triggered yet."""
    harness.register(first_epoch_heartbeat=True)
    harness.running(1)
    client: TestClient = make_client()

    def ended() -> bool | None:
        return client.get(f"/jobs/{harness.job_id}").json()["driver"]["first-epoch-ended"]

    assert ended() is False
    harness.epoch_ended(1, 0)
    assert ended() is True
