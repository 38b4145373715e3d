"""Fixtures shared by the whole suite: one SparkSession per test run; the real Redis."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sparkpoint.transport import Streams

from .support.own_redis import OwnRedis
from .support.redis_server import redis_connection, streams_of_one_test
from .support.serial import alone_if_serial

# Spark's Python workers import what the tests pickle by reference (a function of a test
# module, and the modules it imports, such as the example jobs under jobs/examples): pytest's
# `pythonpath` reaches this process only, so the workers get it from PYTHONPATH, which the
# Spark JVM (started later, whichever test starts it) passes on to them.
_JOBS = str(Path(__file__).resolve().parents[1] / "jobs")
if _JOBS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_JOBS, os.environ.get("PYTHONPATH")) if p
    )


# Whole directories of `make test-slow`: processes, clusters and services started per test.
SLOW_DIRECTORIES = ("e2e", "chaos", "cluster")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``slow`` what ``make test`` leaves to ``make test-slow``: the slow directories
    and every browser and chaos test (other modules mark themselves)."""
    tests = Path(__file__).resolve().parent
    for item in items:
        top = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        browser_or_chaos = item.get_closest_marker("browser") or item.get_closest_marker("chaos")
        if top in SLOW_DIRECTORIES or browser_or_chaos:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """A test marked ``serial`` runs while no other test runs (see ``support/serial.py``)."""
    with alone_if_serial(item):
        return (yield)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession with two cores, Spark's retries off (as the runtime requires)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from sparkpoint.runtime.spark import spark_session

    session = spark_session("local[2]", "sparkpoint-tests")
    yield session
    session.stop()


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    """A client of the tests' real Redis (``REDIS_TEST_URL``)."""
    with redis_connection() as conn:
        yield conn


@pytest.fixture
def streams(client: redis.Redis) -> Iterator[Streams]:
    """Stream names of this test only; their keys are deleted afterwards."""
    with streams_of_one_test(client) as names:
        yield names


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A ``redis-server`` of this test's own, to kill, restart or make refuse writes (the
    tests' shared Redis is never used for faults)."""
    server = OwnRedis(tmp_path / "redis")
    server.start()
    yield server
    server.kill()
