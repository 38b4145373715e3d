"""Commands wait for a Redis that is away outside the coordination lock, and go in order."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from service_harness import Harness
from sqlalchemy.orm import Session, sessionmaker
from tests.support.own_redis import OwnRedis
from tests.support.ports import free_port

from sparkpoint import protocol as p
from sparkpoint.transport import Streams, redis_client
from sparkpoint_server.config import load_settings


def test_commands_wait_for_redis_outside_the_lock_and_go_in_the_order_decided(
    own_redis: OwnRedis, tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    with own_redis.client() as client:
        harness = Harness(tmp_path, sessions, client, Streams(prefix=f"t-{uuid.uuid4().hex[:8]}"))
        harness.start()
        first = harness.trigger_periodic()
        harness.ack_all(1, first)
        harness.commands()
        own_redis.kill()

        harness.tick(1000)  # a trigger that Redis cannot take: the unit ends all the same
        assert not harness.plane.sender.wait_idle(0)  # it waits, outside the lock
        with harness.plane.lock:  # which the next unit takes
            second = harness.plane.jobs[harness.job_id].coordinator.next_checkpoint_id - 1
        harness.ack_all(1, second)  # its completion's notification queues behind it
        own_redis.start()  # Redis back within the 30 s the commands wait

        assert harness.plane.sender.wait_idle(60)
        got = [(type(c), c.checkpoint_id) for _, c in harness.commands()]
        assert got == [(p.TriggerCheckpoint, second), (p.NotifyCheckpointComplete, second)]
        harness.plane.close()


def test_commands_wait_for_redis_as_long_as_the_redis_retry_window_says(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SPARKPOINT_REDIS_RETRY_WINDOW`` (the drivers' variable too) sets how long commands
    that Redis does not take wait for it: 30 s by default, here 0.2 s."""
    assert harness.plane.sender.retry_for_s == 30.0
    monkeypatch.setenv("SPARKPOINT_REDIS_RETRY_WINDOW", "0.2")
    harness.settings = load_settings(data_dir=str(harness.tmp / "data"))
    harness.new_control_plane()
    harness.start()
    sender = harness.plane.sender
    assert sender.retry_for_s == 0.2
    sender.client = redis_client(f"redis://127.0.0.1:{free_port()}/0")  # Redis away
    harness.tick(1000)  # the periodic trigger waits for Redis
    assert not sender.wait_idle(0)
    assert sender.wait_idle(10)  # given up once the window passed (the default: 30 s)
