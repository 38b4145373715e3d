"""The lease that lets one driver at a time run a connected job, on the real Redis."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from sparkpoint.runtime.driver_lease import (
    MIN_TTL_MS,
    AnotherDriverError,
    DriverLease,
    lease_key,
    lease_ttl_ms,
)

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(REDIS_URL)
    yield c
    c.close()


@pytest.fixture
def key(client: redis.Redis) -> Iterator[str]:
    k = lease_key(f"lease-{uuid.uuid4().hex[:8]}", "job-1")
    yield k
    client.delete(k)


def _lease(client: redis.Redis, key: str, run: str, ttl_ms: int = 10_000) -> DriverLease:
    return DriverLease(client, key, run, ttl_ms)


def test_a_free_lease_is_taken_and_released(client: redis.Redis, key: str) -> None:
    lease = _lease(client, key, "run-a")
    lease.acquire("job-1", 1000, pytest.fail)
    run, _host, pid, since = client.get(key).decode().split(" ")
    assert run == "run-a" and pid.isdigit() and int(since) <= time.time() * 1000
    assert 9_000 < client.pttl(key) <= 10_000
    lease.release()
    assert client.get(key) is None


def test_another_run_waits_and_is_refused_naming_the_holder(client: redis.Redis, key: str) -> None:
    holder = _lease(client, key, "run-a")
    holder.acquire("job-1", 1000, pytest.fail)
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(AnotherDriverError) as err:
        _lease(client, key, "run-b").acquire("job-1", 1200, said.append)
    assert 1.1 < time.monotonic() - started < 3
    assert str(err.value).startswith("job job-1 is running with another driver (pid ")
    assert str(err.value).endswith(
        "a job runs one driver at a time. Stop that one first (sparkpoint cancel job-1, or end "
        "its process), or run this one with another --job-id"
    )
    assert len(said) == 1 and said[0].startswith("job job-1 runs with another driver (pid ")
    assert "waiting for it to end (0 s of 1.2 s; its lease ends in 10 s" in said[0]
    # Nothing of the holder's changed; releasing what it does not hold deletes nothing.
    assert client.get(key).decode() == holder.value
    _lease(client, key, "run-b").release()
    assert client.get(key).decode() == holder.value


def test_a_driver_of_the_same_run_takes_it_over_at_once(client: redis.Redis, key: str) -> None:
    """``sparkpoint run`` starts its next driver only after the previous one ended."""
    _lease(client, key, "run-a").acquire("job-1", 1000, pytest.fail)
    successor = _lease(client, key, "run-a")
    successor.acquire("job-1", 0, pytest.fail)
    assert client.get(key).decode() == successor.value


def test_a_lease_not_renewed_expires_and_another_run_takes_it(
    client: redis.Redis, key: str
) -> None:
    """A driver that died without releasing it (kill -9), restarted by no supervisor."""
    _lease(client, key, "run-a", ttl_ms=400).acquire("job-1", 1000, pytest.fail)
    said: list[str] = []
    other = _lease(client, key, "run-b")
    other.acquire("job-1", 5000, said.append)
    assert client.get(key).decode() == other.value and len(said) == 1


def test_renewals_keep_it_and_a_lease_taken_meanwhile_is_said_once(
    client: redis.Redis, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    lease = _lease(client, key, "run-a", ttl_ms=500)
    lease.acquire("job-1", 1000, pytest.fail)
    for _ in range(4):
        time.sleep(0.25)
        lease.renew()
    assert client.get(key).decode() == lease.value
    client.delete(key)  # its renewals stopped for longer than the lease: another took it
    other = _lease(client, key, "run-b")
    other.acquire("job-1", 0, pytest.fail)
    with caplog.at_level(logging.WARNING, logger="sparkpoint.runtime.driver_lease"):
        lease.renew()
        lease.renew()
    [warning] = [r.getMessage() for r in caplog.records]
    assert "another driver (pid " in warning and "took this job's lease" in warning
    assert client.get(key).decode() == other.value


def test_the_lease_outlives_missed_renewals() -> None:
    assert lease_ttl_ms(10_000) == 30_000
    assert lease_ttl_ms(100) == MIN_TTL_MS
