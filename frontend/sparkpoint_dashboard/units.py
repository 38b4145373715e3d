"""How the dashboard writes numbers: durations, sizes, rates, times and ages, always with a unit."""

from __future__ import annotations

import math
from datetime import datetime, timezone

KIB = 1024
_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
DASH = "\u2013"  # an en dash: no value


def _missing(value: float | int | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_ms(ms: float | int | None) -> str:
    """A duration in ms: ``"842 ms"``, ``"1.24 s"``, ``"2 min 05 s"``, ``"3 h 02 min"``."""
    if _missing(ms):
        return DASH
    assert ms is not None
    if ms < 0:
        return "-" + fmt_ms(-ms)
    if ms < 1000:
        return f"{ms:.0f} ms" if ms >= 10 or float(ms).is_integer() else f"{ms:.1f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours:02d} h"


def fmt_bytes(size: float | int | None) -> str:
    """A size in bytes with binary units: ``"512 B"``, ``"1.5 KiB"``, ``"12.0 MiB"``."""
    if _missing(size):
        return DASH
    assert size is not None
    value = float(size)
    for unit in _SIZE_UNITS:
        if abs(value) < KIB or unit == _SIZE_UNITS[-1]:
            if unit == "B":
                return f"{value:.0f} B"
            return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"
        value /= KIB
    raise AssertionError("unreachable")


def size_unit(max_bytes: float | int | None) -> tuple[str, int]:
    """The unit and divisor an axis of sizes up to ``max_bytes`` reads best in."""
    divisor = 1
    for unit in _SIZE_UNITS:
        if max_bytes is None or max_bytes < KIB * divisor or unit == _SIZE_UNITS[-1]:
            return unit, divisor
        divisor *= KIB
    raise AssertionError("unreachable")


def fmt_rate(per_second: float | int | None, what: str = "records") -> str:
    """A rate: ``"950 records/s"``, ``"12.3 k records/s"``, ``"1.20 M records/s"``."""
    if _missing(per_second):
        return DASH
    assert per_second is not None
    if per_second >= 1e6:
        return f"{per_second / 1e6:.2f} M {what}/s"
    if per_second >= 1e4:
        return f"{per_second / 1e3:.1f} k {what}/s"
    return f"{per_second:,.0f} {what}/s"


def fmt_count(n: int | None) -> str:
    """An integer with thousands separators."""
    return DASH if n is None else f"{n:,}"


def fmt_time(ms: int | None) -> str:
    """A timestamp (ms since the epoch) as UTC wall-clock time: ``"2026-11-26 02:17:04.123"``."""
    if ms is None or ms <= 0:
        return DASH
    when = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{when.microsecond // 1000:03d}"


def fmt_age(now_ms: int, ms: int | None) -> str:
    """How long ago ``ms`` was: ``"4.2 s ago"``, ``"3 min 10 s ago"``; ``"just now"`` under 1 s."""
    if ms is None or ms <= 0:
        return DASH
    age = now_ms - ms
    if age < 1000:
        return "just now"
    return f"{fmt_ms(age)} ago"


def to_datetime(ms: int | None) -> datetime | None:
    """A timestamp (ms since the epoch) as an aware UTC datetime, for chart axes."""
    if ms is None or ms <= 0:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
