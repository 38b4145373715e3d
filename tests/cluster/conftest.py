"""The ``standalone_cluster`` fixture: one Spark standalone master and two workers for the
tests of this package, torn down for sure (see :mod:`.standalone`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .standalone import StandaloneCluster


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def cluster(standalone_cluster: StandaloneCluster) -> StandaloneCluster:
    """The module's cluster with both workers alive (a test before may have killed one)."""
    standalone_cluster.replace_dead_workers()
    return standalone_cluster
