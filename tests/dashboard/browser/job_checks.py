"""What the dashboard's browser test modules share about the one job each runs against: its
page's path, its checkpoints as the API answers, the RUNNING badge, a screenshot's size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from sparkpoint_dashboard import ids

from .conftest import Job
from .dashboard_page import HEIGHT, WIDTH


def job_path(job: Job) -> str:
    return f"/jobs/{job.id}"


def checkpoints_answer(api: httpx.Client, job: Job) -> dict[str, Any]:
    answer = api.get(f"/jobs/{job.id}/checkpoints", params={"limit": 1000})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def running_badge() -> str:
    """The job header's status badge while the job is RUNNING."""
    return f"#{ids.JOB_STATUS_BADGE} .badge[data-status='RUNNING']"


def assert_screenshot(path: Path) -> None:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    assert (width, height) == (WIDTH, HEIGHT), path
