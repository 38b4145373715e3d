"""Polling until a condition holds, for tests that wait on another thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float = 120.0, every_s: float = 0.25
) -> Any:
    """Poll ``check()`` every ``every_s`` until it returns something truthy, and return that;
    fail naming ``what`` (and the last answer) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")
