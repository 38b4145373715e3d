"""A job started from a checkpoint (``--from-checkpoint``) fails over to that checkpoint until
it has one of its own, as Flink's job started from a savepoint does: restarting from the
beginning would drop the state it started with and read its input again."""

from __future__ import annotations

import os
from pathlib import Path

from service_harness import Harness

from sparkpoint import protocol as p

NO_DELAY = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": 5,
    "restart-strategy.fixed-delay.delay": "0 s",
}


def _restores(h: Harness) -> list[p.RestoreJob]:
    return [c for _, c in h.commands() if isinstance(c, p.RestoreJob)]


def _started_from_a_checkpoint(harness: Harness, tmp_path: Path) -> tuple[Harness, int, str]:
    """Job A completes a checkpoint; job B registers from it and runs. (B, its id, its URL)"""
    harness.start()
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid)
    url = "file://" + os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    other = Harness(tmp_path / "other", harness.sessions, harness.client, harness.streams)
    other.register(incarnation="driver-9", from_checkpoint=url, restart_strategy=NO_DELAY)
    [first] = _restores(other)
    assert (first.new_attempt, first.checkpoint_id, first.external_path) == (1, cid, url)
    other.running(1)
    return other, cid, url


def test_a_failure_before_its_first_checkpoint_restores_the_one_it_started_from(
    harness: Harness, tmp_path: Path
) -> None:
    other, cid, url = _started_from_a_checkpoint(harness, tmp_path)
    other.send(1, p.TaskFailed(epoch=1, cause="boom"))
    other.tick(1)
    [again] = _restores(other)
    assert (again.new_attempt, again.checkpoint_id, again.external_path) == (2, cid, url)
    assert again.savepoint_path == url
    # Its own checkpoint then comes first; the one it started from stays where it is.
    other.running(2)
    own = other.trigger_periodic()
    other.ack_all(2, own)
    other.commands()
    other.send(2, p.TaskFailed(epoch=3, cause="boom again"))
    other.tick(1)
    [latest] = _restores(other)
    assert (latest.new_attempt, latest.checkpoint_id) == (3, own)
    assert latest.external_path is not None and other.job_id in latest.external_path
    assert os.path.isfile(url.removeprefix("file://") + "/_metadata")


def test_a_restarted_control_plane_still_restores_the_one_it_started_from(
    harness: Harness, tmp_path: Path
) -> None:
    other, cid, url = _started_from_a_checkpoint(harness, tmp_path)
    other.new_control_plane()
    other.commands()
    other.send(1, p.TaskFailed(epoch=1, cause="boom"))
    other.tick(1)
    [again] = _restores(other)
    assert (again.new_attempt, again.checkpoint_id, again.external_path) == (2, cid, url)
    # A driver that registers again for the running attempt gets the same start again.
    other.new_control_plane()
    other.commands()
    other.register(incarnation="driver-9", from_checkpoint=url, restart_strategy=NO_DELAY)
    [same] = _restores(other)
    assert (same.new_attempt, same.checkpoint_id, same.external_path) == (2, cid, url)
