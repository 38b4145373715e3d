"""The generator source's pacing: what exists after a while, with and without a backlog."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.errors import ConfigurationError

RATE = 20_000.0
BACKLOG = 2_000_000


def test_a_backlog_exists_when_the_job_starts_and_arrivals_add_to_it() -> None:
    paced = GeneratorSource(events=None, rate=RATE, splits=2)
    behind = GeneratorSource(events=None, rate=RATE, splits=2, backlog=BACKLOG)
    assert [paced.available(i, 0.0) for i in range(2)] == [0, 0]
    assert [behind.available(i, 0.0) for i in range(2)] == [1_000_000, 1_000_000]
    assert [behind.available(i, 1.5) for i in range(2)] == [1_015_000, 1_015_000]
    # As if the source had started backlog / rate = 100 s earlier.
    for elapsed in (0.0, 0.25, 7.0, 61.5):
        assert behind.available(1, elapsed) == paced.available(1, elapsed + BACKLOG / RATE)


def test_a_backlog_is_split_over_the_splits() -> None:
    behind = GeneratorSource(events=None, rate=1_000.0, splits=3, backlog=3_000)
    assert [behind.available(i, 0.0) for i in range(3)] == [1_000, 1_000, 1_000]
    assert [behind.available(i, 0.003) for i in range(3)] == [1_001, 1_001, 1_001]


def test_an_unpaced_source_has_everything_with_or_without_a_backlog() -> None:
    source = GeneratorSource(events=100, rate=0, backlog=50)
    assert [source.available(i, 0.0) for i in range(2)] == [None, None]


def test_a_backlog_changes_when_records_exist_not_what_they_are() -> None:
    """Replay stays deterministic and event times are not shifted: the backlog's first event
    has ``start_time_ms``, as without a backlog."""
    paced = GeneratorSource(events=None, apps=7, rate=RATE, splits=2)
    behind = GeneratorSource(events=None, apps=7, rate=RATE, splits=2, backlog=BACKLOG)
    for split, start, end in ((0, 0, 500), (1, 999_900, 1_000_100)):
        a, b = paced.read(split, start, end), behind.read(split, start, end)
        for column in ("app_id", "event_id", "event_time"):
            assert np.array_equal(a.column(column), b.column(column)), column
    first = behind.read(0, 0, 1).column("event_time")
    assert first.tolist() == [behind.start_time_ms]
    # Event 2,000,000 (split 0, offset 1,000,000) is the first to arrive after the job starts.
    assert behind.read(0, 1_000_000, 1_000_001).column("event_time").tolist() == [
        behind.start_time_ms + 100_000
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backlog": -1}, "--backlog must be >= 0 events, got -1"),
        ({"rate": -5.0}, "--rate must be >= 0 events/s, got -5.0"),
    ],
)
def test_a_wrong_pacing_option_is_refused_by_name(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        GeneratorSource(events=None, **kwargs)
