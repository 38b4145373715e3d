"""Where the job-level failure matrices run their jobs."""

from __future__ import annotations

from typing import Any

import pytest

from .pv_harness import IN_PROCESS


@pytest.fixture(
    params=[
        pytest.param(IN_PROCESS, id="in-process"),
        pytest.param("spark", id="spark", marks=[pytest.mark.spark, pytest.mark.slow]),
    ]
)
def engine(request: pytest.FixtureRequest) -> Any:
    """Each failure point twice: in this process (the same task code, without Spark: ``make
    test``) and on Spark (``make test-slow``), so that CI proves every one on Spark while
    ``make test`` keeps one Spark run per behaviour (a module's failure-free baseline)."""
    if request.param == IN_PROCESS:
        return IN_PROCESS
    return request.getfixturevalue("spark")
