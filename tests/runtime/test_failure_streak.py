"""A step that fails at every try is logged once (with its traceback, or in one line), then
once in each interval while it goes on, then its end (``sparkpoint.failure_streak``)."""

from __future__ import annotations

import logging
import threading

import pytest

from sparkpoint.failure_streak import FailureStreak

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


def test_an_expected_error_of_a_step_that_logs_tracebacks_is_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The server's timer tick: a bug gets its traceback, the database away one line.
    streak = FailureStreak("timer tick", LOG, every_s=0, expected=(ConnectionError,))
    caplog.set_level(logging.INFO, logger=LOG.name)
    for err in (ConnectionError("connection refused\nsecond line"), KeyError("job-1")):
        try:
            raise err
        except Exception:
            streak.failed()
        streak.ended()
    said = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert said == [
        (
            "WARNING",
            "timer tick failed (retried; one line every 0 s while it fails): connection refused",
            False,
        ),
        ("INFO", "timer tick runs again after 1 failure(s)", False),
        ("ERROR", "timer tick failed (retried; one line every 0 s while it fails)", True),
        ("INFO", "timer tick runs again after 1 failure(s)", False),
    ]


def test_the_first_line_says_the_interval_and_what_follows_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    streak = FailureStreak(
        "durable copies",
        LOG,
        traceback=False,
        every_s=10.0,
        then="kept here only",
        again="are written again",
        error_type=True,
        clock=lambda: now[0],
    )
    caplog.set_level(logging.INFO, logger=LOG.name)
    for at in (0.0, 9.9, 10.0, 12.0):
        now[0] = at
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            streak.failed(f"the copy at {at:g}")
    streak.ended()

    assert [r.getMessage() for r in caplog.records] == [
        "the copy at 0 failed (kept here only; one line every 10 s while it fails): "
        "OSError: [Errno 28] No space left on device",
        "the copy at 10 failed 3 times in a row (kept here only): "
        "OSError: [Errno 28] No space left on device",
        "durable copies are written again after 4 failure(s)",
    ]


@pytest.mark.parametrize(
    ("every_s", "said"),
    [
        (60.0, "one line a minute"),
        (10.0, "one line every 10 s"),
        (0.5, "one line every 0.5 s"),
        (300.0, "one line every 5 minutes"),
    ],
)
def test_the_interval_is_said_as_configured(
    caplog: pytest.LogCaptureFixture, every_s: float, said: str
) -> None:
    streak = FailureStreak("the sweep", LOG, traceback=False, every_s=every_s)
    caplog.set_level(logging.INFO, logger=LOG.name)
    try:
        raise ConnectionError("connection refused")
    except ConnectionError:
        streak.failed()
    assert caplog.records[0].getMessage() == (
        f"the sweep failed (retried; {said} while it fails): connection refused"
    )


def test_threads_failing_together_tell_the_streak_once_and_count_every_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    streak = FailureStreak("copies", LOG, traceback=False, every_s=10.0, clock=lambda: 0.0)
    caplog.set_level(logging.INFO, logger=LOG.name)
    start = threading.Barrier(8)

    def fail_often() -> None:
        start.wait()
        for _ in range(500):
            try:
                raise OSError("full")
            except OSError:
                streak.failed()

    threads = [threading.Thread(target=fail_often) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    streak.ended()

    assert [r.getMessage() for r in caplog.records] == [
        "copies failed (retried; one line every 10 s while it fails): full",
        "copies runs again after 4000 failure(s)",
    ]


def _play(streak: FailureStreak, now: list[float], script: list[tuple[float, bool]]) -> None:
    """At each time of ``script``, a failure (``OSError("full at <time>")``) or a success."""
    for at, fails in script:
        now[0] = at
        if not fails:
            streak.ended()
            continue
        try:
            raise OSError(f"full at {at:g}")
        except OSError:
            streak.failed()


def test_a_step_that_flaps_is_told_at_most_once_an_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    streak = FailureStreak("copies", LOG, traceback=False, every_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger=LOG.name)
    _play(streak, now, [(0, True), (1, False), (5, True), (6, False), (12, True), (13, False)])

    assert [r.getMessage() for r in caplog.records] == [
        "copies failed (retried; one line every 10 s while it fails): full at 0",
        "copies runs again after 1 failure(s)",
        "copies failed (retried; one line every 10 s while it fails): full at 12",
        "copies runs again after 1 failure(s)",
    ]


def test_a_streak_that_began_in_the_quiet_time_is_told_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    streak = FailureStreak("copies", LOG, traceback=True, every_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger=LOG.name)
    # Told at 0; works at 1; fails again at 4 and 7 (in the quiet time), and at 11.
    _play(streak, now, [(0, True), (1, False), (4, True), (7, True), (11, True)])

    said = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert said == [
        ("copies failed (retried; one line every 10 s while it fails)", True),
        ("copies runs again after 1 failure(s)", False),
        ("copies failed 3 times in a row: full at 11", False),
    ]
