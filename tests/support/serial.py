"""Tests that measure speed run alone, also when ``pytest -n`` runs the suite in workers.

A test marked ``serial`` (a throughput floor, say) holds an exclusive lock for its setup, call
and teardown; every other test holds the same lock shared, so a serial test waits for the
tests running in other workers and they wait for it. A second lock, the gate, keeps the
serial test from waiting for ever: once it holds the gate, no other test starts. Without
xdist there is one process and nothing to lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

#: xdist's id of the run, the same in all its workers; unset without xdist.
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID")


def _lock_file(item: pytest.Item, name: str) -> Path:
    """A file of the run's temporary directory (xdist gives each worker a directory in it)."""
    return Path(item.config.option.basetemp).parent / f"serial-{name}.lock"


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as file:
        fcntl.flock(file, mode)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@contextmanager
def alone_if_serial(item: pytest.Item) -> Iterator[None]:
    """Run ``item`` alone if it is marked ``serial``, else beside the other non-serial tests."""
    if RUN_ID is None:
        yield
        return
    if item.get_closest_marker("serial") is None:
        with _flock(_lock_file(item, "gate"), fcntl.LOCK_EX):
            pass  # a serial test waiting for its turn holds the gate: wait until it is done
        with _flock(_lock_file(item, "tests"), fcntl.LOCK_SH):
            yield
        return
    with (
        _flock(_lock_file(item, "gate"), fcntl.LOCK_EX),
        _flock(_lock_file(item, "tests"), fcntl.LOCK_EX),
    ):
        yield
