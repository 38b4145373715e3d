"""Commands wait for a Redis that is away outside the coordination lock, and go in order."""

from __future__ import annotations

import uuid
from pathlib import Path

from service_harness import Harness
from sqlalchemy.orm import Session, sessionmaker
from tests.support.own_redis import OwnRedis

from sparkpoint import protocol as p
from sparkpoint.transport import Streams


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
