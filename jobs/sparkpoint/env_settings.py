"""Settings a job's processes read from their environment (``SPARKPOINT_...`` variables)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from sparkpoint.errors import ConfigurationError


def positive_seconds(environ: Mapping[str, str], name: str, context: str = "") -> float | None:
    """The variable ``name`` as a positive, finite number of seconds; None when unset or blank.

    Raises:
        ConfigurationError: anything else, naming the variable and its value (after
            ``context``, e.g. ``"job pv: "``).
    """
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigurationError(
            f"{context}{name} must be a positive number of seconds, got {raw!r}"
        )
    return seconds
