"""Where the job-level failure matrices run their jobs."""

from __future__ import annotations

from typing import Any

import pytest

from .pv_harness import IN_PROCESS


@pytest.fixture(
    params=[
        pytest.param(IN_PROCESS, id="in-process"),
        pytest.param("spark", id="spark", marks=[pytest.mark.spark, pytest.mark.spark_matrix]),
    ]
)
def engine(request: pytest.FixtureRequest) -> Any:
    """Each failure point twice: in this process (the same task code, without Spark: ``make
    test``) and on Spark (``make test-spark-matrix``, outside CI's 30 minutes), while ``make
    test`` keeps a module's failure-free run on Spark and the Spark failure tests of
    ``test_exactly_once``, ``test_operator_state``, region failover and broadcast state."""
    if request.param == IN_PROCESS:
        return IN_PROCESS
    return request.getfixturevalue("spark")
