"""Fixtures shared by the whole suite: one SparkSession per test run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession with two cores, Spark's retries off (as the runtime requires)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from sparkpoint.runtime.spark import spark_session

    session = spark_session("local[2]", "sparkpoint-tests")
    yield session
    session.stop()
