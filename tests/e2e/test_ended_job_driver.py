"""A driver that ``sparkpoint run`` restarts after its job had ended (it died while shutting
down) is told how the job ended and ends so, through the real control plane: the job is not
run again, and its output stays as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkpoint.testing import line_counts

from ..runtime.pv_harness import EVENTS, expected_every_lines
from .control_plane import ServerProcess
from .test_origin_failover import _finished, _pv

pytestmark = pytest.mark.spark


def test_a_driver_restarted_after_its_job_finished_ends_without_running_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    run = ("--job-id", "done", "--checkpoint-interval", "0.5")
    _finished(_pv(server, tmp_path, "first", *run))
    out = str(tmp_path / "out")
    assert line_counts(out) == expected_every_lines(EVENTS)
    # As `sparkpoint run` starts a driver after the previous one died (here: once the job
    # had finished): the supervisor's variables, the same command line.
    os.environ["SPARKPOINT_SUPERVISED"] = "1"
    os.environ["SPARKPOINT_PREVIOUS_DRIVER_FAILURE"] = "killed by SIGKILL"
    try:
        again = _pv(server, tmp_path, "again", *run)
    finally:
        del os.environ["SPARKPOINT_SUPERVISED"], os.environ["SPARKPOINT_PREVIOUS_DRIVER_FAILURE"]
    output = _finished(again)

    assert "had ended FINISHED before its driver died (killed by SIGKILL): nothing to " in output
    with server.api() as api:
        job = api.get("/jobs/done").json()
        assert (job["state"], job["attempt"]) == ("FINISHED", 1)
    assert line_counts(out) == expected_every_lines(EVENTS)
