"""`sparkpoint run --standalone --savepoint-on-finish DIR`: SIGTERM stops the job with a
savepoint (Flink's ``stop``), and a run restored from it commits the rest exactly once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from sparkpoint.testing import line_counts

from ..runtime.pv_harness import expected_every_lines
from ..support.waiting import wait_for
from .test_supervisor_spark import _completed, _events, _run, _start

pytestmark = pytest.mark.spark


def test_sigterm_stops_with_a_savepoint_that_a_restore_finishes(tmp_path: Path) -> None:
    target = tmp_path / "savepoints"
    sup = _start(tmp_path, "--rate", "1000", "--savepoint-on-finish", str(target))
    try:
        wait_for("a completed checkpoint", lambda: _completed(tmp_path), 60, 0.05)
        sup.send_signal(signal.SIGTERM)
        _, err = sup.communicate(timeout=60)
    finally:
        sup.kill()
    assert sup.returncode == 0, err[-3000:]
    statuses = [e["payload"]["status"] for e in _events(tmp_path, "job_status")]
    assert statuses[-2:] == ["RUNNING", "FINISHED"]
    (savepoint,) = target.iterdir()
    completed = _events(tmp_path, "checkpoint_completed")[-1]["payload"]
    assert completed["kind"] == "savepoint"
    assert completed["external_path"] == f"file://{savepoint}"
    out = str(tmp_path / "out")
    stopped = line_counts(out)
    assert 0 < sum(stopped.values()) < 12_000  # stopped early: not drained
    done = _run(tmp_path, "--from-checkpoint", str(savepoint))
    assert done.returncode == 0, done.stderr[-3000:]
    assert line_counts(out) == expected_every_lines()
