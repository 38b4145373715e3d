"""Units: every number the dashboard shows carries one, and reads at a glance."""

from __future__ import annotations

import math

import pytest

from sparkpoint_dashboard.units import (
    DASH,
    fmt_age,
    fmt_bytes,
    fmt_count,
    fmt_ms,
    fmt_rate,
    fmt_time,
    size_unit,
)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (0.25, "0.2 ms"),
        (7, "7 ms"),
        (842.4, "842 ms"),
        (1000, "1.00 s"),
        (1240, "1.24 s"),
        (12_345, "12.3 s"),
        (125_000, "2 min 05 s"),
        (3 * 3_600_000 + 2 * 60_000, "3 h 02 min"),
        (3 * 86_400_000 + 3_600_000, "3 d 01 h"),
        (-1500, "-1.50 s"),
        (None, DASH),
        (math.nan, DASH),
    ],
)
def test_durations(ms: float | None, text: str) -> None:
    assert fmt_ms(ms) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (443, "443 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (200 * 1024, "200 KiB"),
        (12 * 1024**2, "12.0 MiB"),
        (3 * 1024**3, "3.0 GiB"),
        (None, DASH),
    ],
)
def test_sizes(size: int | None, text: str) -> None:
    assert fmt_bytes(size) == text


def test_an_axis_of_sizes_takes_the_unit_of_its_largest_value() -> None:
    assert size_unit(500) == ("B", 1)
    assert size_unit(5000) == ("KiB", 1024)
    assert size_unit(5 * 1024**2) == ("MiB", 1024**2)
    assert size_unit(None) == ("B", 1)


def test_rates_counts_times_and_ages() -> None:
    assert fmt_rate(950.4) == "950 records/s"
    assert fmt_rate(12_345) == "12.3 k records/s"
    assert fmt_rate(1_200_000) == "1.20 M records/s"
    assert fmt_rate(None) == DASH
    assert fmt_count(1234567) == "1,234,567"
    assert fmt_time(1_700_000_000_123) == "2023-11-14 22:13:20.123"
    assert fmt_time(-1) == DASH
    assert fmt_age(1_700_000_004_200, 1_700_000_000_000) == "4.20 s ago"
    assert fmt_age(1_700_000_000_500, 1_700_000_000_000) == "just now"
    assert fmt_age(1_700_000_000_000, None) == DASH
