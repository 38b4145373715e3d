"""The browser tests' world, one per module: a real control plane, a real PV job connected to
it, the dashboard as a process, and headless Chromium driving it.

Without Chromium or ChromeDriver the browser tests are skipped with the command that installs
them (outside CI; CI installs them in ``.ci/run`` and a missing browser fails there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from selenium import webdriver

from sparkpoint.transport import redis_client
from tests.e2e.control_plane import REDIS_URL, ROOT, ServerProcess, free_port
from tests.support.waiting import wait_for

from .dashboard_page import DashboardPage, browser_missing, start_chrome

SCREENSHOTS = ROOT / "docs" / "screenshots"
SPARKPOINT = Path(sys.executable).with_name("sparkpoint")

# The job: 1,000 events/s, a checkpoint a second, 5 retained. Its input lasts 15 minutes at
# least (longer on a busy machine), far more than the module needs: the restore, the last
# action, needs a job that still runs. Teardown kills it.
EVENTS, APPS, RATE = 900_000, 5, 1_000


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = browser_missing()
    if reason is None or os.environ.get("CI"):
        return  # in CI a missing browser is an error (the chrome fixture fails)
    skip = pytest.mark.skip(reason=f"dashboard browser tests need Chromium: {reason}")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@dataclass
class Job:
    """The PV job run by ``sparkpoint run``, in a process group of its own."""

    id: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """SIGKILL the whole group: the supervisor, the driver and its JVM."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-browser")


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(workdir / "data")
    srv.data_dir.mkdir()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        client = redis_client(REDIS_URL)
        for key in client.scan_iter(f"{srv.prefix}:*"):
            client.delete(key)


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.api() as client:
        yield client


@pytest.fixture(scope="module")
def job(server: ServerProcess, api: httpx.Client, workdir: Path) -> Iterator[Job]:
    """The PV job, RUNNING with two completed checkpoints."""
    job_id = uuid.uuid4().hex
    log = workdir / "job.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                str(SPARKPOINT),
                "run",
                "jobs/examples/pv_count.py",
                "--job-id",
                job_id,
                "--redis-url",
                REDIS_URL,
                "--stream-prefix",
                server.prefix,
                "--checkpoint-dir",
                f"file://{workdir / 'chk'}",
                "--checkpoint-interval",
                "1",
                "--retained",
                "5",
                "--epoch-target-ms",
                "250",
                "--local-dir",
                str(workdir / "local"),
                "--events",
                str(EVENTS),
                "--apps",
                str(APPS),
                "--rate",
                str(RATE),
                "--output",
                str(workdir / "out"),
            ],
            cwd=ROOT,
            env=server.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: teardown kills the JVM too
        )
    running = Job(job_id, proc, log)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the job exited ({proc.returncode}); see {log}")
            answer = api.get(f"/jobs/{job_id}/checkpoints")
            if answer.status_code != 200:
                return False
            return bool(answer.json()["counts"]["completed"] >= 2)

        wait_for("the job to run with two completed checkpoints", ready, timeout_s=180)
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def dashboard(server: ServerProcess, workdir: Path) -> Iterator[str]:
    """``sparkpoint dashboard`` on a free port, refreshing every second; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = workdir / "dashboard.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(SPARKPOINT), "dashboard", "--port", str(port), "--api", server.url],
            cwd=ROOT,
            env={**os.environ, "SPARKPOINT_DASHBOARD_REFRESH_MS": "1000"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the dashboard exited ({proc.returncode}); see {log}")
            try:
                return httpx.get(url + "/", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for("the dashboard to answer", up, timeout_s=60)
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def chrome(workdir: Path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium with a fresh profile (see :func:`start_chrome`)."""
    reason = browser_missing()
    if reason is not None:  # only in CI: elsewhere the tests were skipped
        pytest.fail(f"{reason}; .ci/run should have installed them")
    driver = start_chrome(workdir / "chromium-profile")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def page(chrome: webdriver.Chrome, dashboard: str) -> DashboardPage:
    return DashboardPage(chrome, dashboard, SCREENSHOTS)
