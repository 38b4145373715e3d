"""A step that fails at every try is logged once with its traceback, then once a minute."""

from __future__ import annotations

import logging

import pytest

from sparkpoint_server.failure_streak import FailureStreak

LOG = logging.getLogger("sparkpoint_server.test")


def test_a_failing_step_is_told_once_then_once_a_minute_then_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0]  # ms
    streak = FailureStreak("timer tick", LOG, clock=lambda: now[0] / 1000)
    caplog.set_level(logging.INFO, logger=LOG.name)

    for _ in range(1201):  # a minute of ticks every 50 ms, and one more
        try:
            raise OSError("database or disk is full\nsecond line")
        except OSError:
            streak.failed()
        now[0] += 50
    streak.ended()
    streak.ended()  # a success after a success says nothing

    said = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert said == [
        ("ERROR", "timer tick failed (retried; one line a minute while it fails)", True),
        ("WARNING", "timer tick failed 1201 times in a row: database or disk is full", False),
        ("INFO", "timer tick runs again after 1201 failure(s)", False),
    ]


def test_an_expected_failure_is_told_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    streak = FailureStreak("the sweep", LOG, traceback=False)
    caplog.set_level(logging.INFO, logger=LOG.name)
    try:
        raise ConnectionError("connection refused")
    except ConnectionError:
        streak.failed()
    [record] = caplog.records
    assert record.levelname == "WARNING" and record.exc_info is None
    assert record.getMessage().endswith("while it fails): connection refused")
