"""The lease that lets one driver at a time run a connected job, on the real Redis. The
waiting driver's clock is a manual one: its sleeps advance it, and where a holder's lease is
to run out meanwhile, the test makes Redis expire it."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sparkpoint import protocol as p
from sparkpoint.clock import ManualClock
from sparkpoint.runtime.driver_lease import (
    MIN_TTL_MS,
    AnotherDriverError,
    DriverLease,
    DriverSupersededError,
    lease_key,
    lease_ttl_ms,
)
from sparkpoint.runtime.epoch_commands import EpochCommandReader
from sparkpoint.runtime.heartbeats import DriverHeartbeats
from sparkpoint.transport import (
    CommandChannel,
    RedisEventSink,
    Streams,
    TransportError,
    send_command,
)


@pytest.fixture
def key(client: redis.Redis) -> Iterator[str]:
    k = lease_key(f"lease-{uuid.uuid4().hex[:8]}", "job-1")
    yield k
    client.delete(k)


def _lease(
    client: redis.Redis,
    key: str,
    run: str,
    ttl_ms: int = 10_000,
    *,
    on_sleep: Callable[[float], None] = lambda _: None,
) -> tuple[DriverLease, ManualClock]:
    clock = ManualClock()

    def sleep(seconds: float) -> None:
        clock.advance(seconds * 1000)
        on_sleep(clock.monotonic_ms())

    return DriverLease(client, key, run, ttl_ms, clock=clock, sleep=sleep), clock


def test_a_free_lease_is_taken_and_released(client: redis.Redis, key: str) -> None:
    lease, clock = _lease(client, key, "run-a")
    assert lease.acquire("job-1", 1000, pytest.fail)
    run, _host, pid, since = client.get(key).decode().split(" ")
    assert (run, since) == ("run-a", str(clock.now_ms())) and pid.isdigit()
    assert 9_000 < client.pttl(key) <= 10_000
    lease.release()
    assert client.get(key) is None
    lease.renew()  # a heartbeat after the release takes nothing again
    assert client.get(key) is None


def test_another_run_waits_and_is_refused_naming_the_holder(client: redis.Redis, key: str) -> None:
    holder, _ = _lease(client, key, "run-a", ttl_ms=1000)
    holder.acquire("job-1", 1000, pytest.fail)
    said: list[str] = []
    waiting, clock = _lease(client, key, "run-b", ttl_ms=1000, on_sleep=lambda _: holder.renew())
    with pytest.raises(AnotherDriverError) as err:
        waiting.acquire("job-1", 6000, said.append)
    # Up to its timeout (6 s: longer than either lease lives), a sleep of 0.5 s at a time.
    assert clock.monotonic_ms() - ManualClock().monotonic_ms() == 6000
    assert str(err.value).startswith("job job-1 is running with another driver (pid ")
    assert str(err.value).endswith(
        "a job runs one driver at a time. Stop that one first (sparkpoint cancel job-1, or end "
        "its process), or run this one with another --job-id"
    )
    assert [s.split(": waiting for it to end ")[1][:12] for s in said] == [
        "(0 s of 6 s;",
        "(5 s of 6 s;",
    ]
    assert said[0].startswith("job job-1 runs with another driver (pid ")
    # Nothing of the holder's changed; releasing what it does not hold deletes nothing.
    assert client.get(key).decode() == holder.value
    waiting.release()
    assert client.get(key).decode() == holder.value


def test_a_driver_of_the_same_run_takes_it_over_at_once(client: redis.Redis, key: str) -> None:
    """``sparkpoint run`` starts its next driver only after the previous one ended."""
    _lease(client, key, "run-a")[0].acquire("job-1", 1000, pytest.fail)
    successor, _ = _lease(client, key, "run-a")
    assert successor.acquire("job-1", 0, pytest.fail)
    assert client.get(key).decode() == successor.value


def test_a_holder_that_died_is_outlived_even_with_a_short_timeout(
    client: redis.Redis, key: str
) -> None:
    """A driver killed without releasing its lease (kill -9), started again by a cluster
    manager with a short ``--control-plane-timeout``: the wait lasts until the dead holder's
    lease ran out (20 s here, longer than the new one's own 3 s), and takes it then."""
    _lease(client, key, "run-a", ttl_ms=20_000)[0].acquire("job-1", 0, pytest.fail)
    start = ManualClock().monotonic_ms()

    def expire_at_20_s(now: float) -> None:
        if now - start >= 20_000:
            client.delete(key)  # its lease ran out

    other, clock = _lease(client, key, "run-b", ttl_ms=MIN_TTL_MS, on_sleep=expire_at_20_s)
    said: list[str] = []
    assert other.acquire("job-1", 100, said.append)
    assert client.get(key).decode() == other.value
    assert clock.monotonic_ms() - start == 20_000
    assert re.search(r"\(0 s of 21 s; its lease ends in (19|20) s unless it renews it\)$", said[0])


def test_a_cancel_while_waiting_ends_the_wait_without_the_lease(
    client: redis.Redis, key: str
) -> None:
    holder, _ = _lease(client, key, "run-a")
    holder.acquire("job-1", 0, pytest.fail)
    canceled = iter([False, False, True])
    waiting, _ = _lease(client, key, "run-b")
    assert not waiting.acquire("job-1", 60_000, lambda _: None, lambda: next(canceled))
    assert client.get(key).decode() == holder.value
    # Canceled just as it took the lease: given back at once.
    holder.release()
    late = iter([False, True])
    assert not waiting.acquire("job-1", 60_000, pytest.fail, lambda: next(late))
    assert client.get(key) is None


def test_renewals_keep_it_and_a_lease_taken_meanwhile_is_said_once(
    client: redis.Redis, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    lease, _ = _lease(client, key, "run-a", ttl_ms=5000)
    lease.acquire("job-1", 1000, pytest.fail)
    client.pexpire(key, 100)
    lease.renew()
    assert 4000 < client.pttl(key) <= 5000
    client.delete(key)  # its renewals stopped for longer than the lease: another took it
    other, _ = _lease(client, key, "run-b")
    other.acquire("job-1", 0, pytest.fail)
    with caplog.at_level(logging.WARNING, logger="sparkpoint.runtime.driver_lease"):
        lease.renew()
        lease.renew()
    [warning] = [r.getMessage() for r in caplog.records]
    assert "another driver (pid " in warning and "took this job's lease" in warning
    assert client.get(key).decode() == other.value


def test_an_unreachable_redis_is_a_transport_error_not_a_crash(key: str) -> None:
    unreachable = redis.Redis(
        host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    lease = DriverLease(unreachable, key, "run-a", 10_000)
    with pytest.raises(TransportError, match=r"could not take the lease .* unreachable"):
        lease.try_take()
    lease.renew()  # logged; the next heartbeat tries again
    lease.release()


def test_the_lease_outlives_missed_renewals() -> None:
    assert lease_ttl_ms(10_000) == 30_000
    assert lease_ttl_ms(100) == MIN_TTL_MS


def _taken_over(client: redis.Redis, key: str) -> tuple[DriverLease, ManualClock, DriverLease]:
    """A driver holding the lease, paused longer than its time to live, and the driver of
    another run that took the lease meanwhile."""
    lease, clock = _lease(client, key, "run-a", ttl_ms=3000)
    lease.acquire("job-1", 1000, pytest.fail)
    clock.advance(3000)
    client.delete(key)  # Redis let it expire
    other, _ = _lease(client, key, "run-b")
    other.acquire("job-1", 0, pytest.fail)
    return lease, clock, other


def test_a_driver_whose_lease_was_taken_over_is_fenced_off(client: redis.Redis, key: str) -> None:
    lease, _, other = _taken_over(client, key)
    with pytest.raises(DriverSupersededError) as err:
        lease.check("job-1")
    assert str(err.value).startswith("job job-1 was taken over by another driver (pid ")
    assert "this driver held its lease for no more than 3 s (it was paused" in str(err.value)
    assert lease.lost
    lease.renew()  # no heartbeat takes it back
    with pytest.raises(DriverSupersededError):
        lease.check("job-1")
    lease.release()
    assert client.get(key).decode() == other.value


def test_a_late_check_renews_a_lease_nobody_took(client: redis.Redis, key: str) -> None:
    lease, clock = _lease(client, key, "run-a", ttl_ms=3000)
    lease.acquire("job-1", 1000, pytest.fail)
    client.pexpire(key, 1)  # its heartbeats were held up: it is about to expire
    clock.advance(1999)
    lease.check("job-1")  # renewals came in time as far as it knows: no call to Redis
    assert client.pttl(key) <= 1
    clock.advance(1)
    lease.check("job-1")  # two thirds of the time to live without a renewal: renewed now
    assert 2000 < client.pttl(key) <= 3000 and not lease.lost


def test_a_fenced_off_driver_reads_no_command_and_sends_no_heartbeat(
    client: redis.Redis, key: str, streams: Streams
) -> None:
    lease, clock, _ = _taken_over(client, key)
    fenced = CommandChannel(
        client, "job-1", "driver-a", streams, fence=lambda: lease.check("job-1")
    )
    fenced.open()
    new = CommandChannel(client, "job-1", "driver-b", streams)
    sent = send_command(client, streams, "job-1", 2, 1, p.CancelJob(cause="user"))
    with pytest.raises(DriverSupersededError):
        fenced.read()
    assert [m.entry_id for m in new.read()] == [sent]  # the new driver's, as it should be
    beats = DriverHeartbeats(
        RedisEventSink(client, streams), "job-1", "incarnation-a", 1, lease=lease
    )
    beats.start(lambda: 1, clock)
    beats.stop()
    assert client.xlen(streams.events) == 0


class _OneEpoch:
    """An epoch runner whose epoch ends at once (the Spark job ran; its reports are these)."""

    def __init__(self) -> None:
        self.ran = 0

    def run(self, plan: object) -> list[str]:
        self.ran += 1
        return ["report"]


def test_a_driver_taken_over_while_its_epoch_ran_does_not_accept_the_epoch(
    client: redis.Redis, key: str, streams: Streams
) -> None:
    lease, _, _ = _taken_over(client, key)
    fenced = CommandChannel(
        client, "job-1", "driver-a", streams, fence=lambda: lease.check("job-1")
    )
    runner = _OneEpoch()
    reading = EpochCommandReader(fenced, lambda _: True).around(runner)  # type: ignore[arg-type]
    with pytest.raises(DriverSupersededError):
        reading.run(None)  # type: ignore[arg-type]
    assert runner.ran == 1  # its Spark job ended; the driver takes none of its reports
