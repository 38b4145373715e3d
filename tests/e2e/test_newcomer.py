"""The README's tour, as a newcomer takes it: a fresh clone, ``make demo``, the CLI, Ctrl-C.

Clone this repository into a temporary folder; run ``make demo`` there with no Sparkpoint,
Redis or database variable set; wait for the first completed checkpoint through the API; take
a savepoint with the CLI using only the two ``export`` lines ``make demo`` printed; restore
checkpoint N; then Ctrl-C (SIGINT to the terminal's foreground process group) — and nothing of
the demo is left running.

Two things differ from a new machine, to keep CI short: the clone uses this checkout's virtual
environment (``VENV=``; CI itself proves the install from a fresh clone), and the demo gets free
ports (``DEMO_PORT=``, ``DEMO_DASHBOARD_PORT=`` on make's command line) so that it cannot meet
another process on 8081 or 8050.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from ..support.waiting import wait_for
from .control_plane import ROOT, free_port

pytestmark = pytest.mark.spark

VENV = ROOT / ".venv"


def _clean_env() -> dict[str, str]:
    """The environment of a shell that never heard of Sparkpoint."""
    prefixes = ("SPARKPOINT_", "REDIS_", "DATABASE_", "PYSPARK_", "SPARK_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def _left_running(clone: Path) -> list[str]:
    """Processes whose command line or working directory is inside the clone."""
    left = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            cwd = proc.info["cwd"] or ""
        except psutil.Error:
            continue
        if str(clone) in cmdline or cwd.startswith(str(clone)):
            left.append(f"{proc.info['pid']}: {cmdline[:200]}")
    return left


@pytest.mark.skipif(not (VENV / "bin" / "sparkpoint").exists(), reason="needs make's .venv")
def test_a_newcomer_runs_the_demo_saves_restores_and_stops_it(tmp_path: Path) -> None:
    clone = tmp_path / "sparkpoint"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    # The checkout's environment is up to date for this pyproject.toml: make must not reinstall.
    installed = (VENV / ".installed").stat().st_mtime
    os.utime(clone / "pyproject.toml", (installed - 60, installed - 60))
    api_port, dashboard_port = free_port(), free_port()
    log = tmp_path / "make-demo.log"
    with log.open("w") as out:
        make = subprocess.Popen(
            [
                "make",
                "demo",
                f"VENV={VENV}",
                f"DEMO_PORT={api_port}",
                f"DEMO_DASHBOARD_PORT={dashboard_port}",
            ],
            cwd=clone,
            env=_clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
    try:
        # 1. What make demo prints: the URLs, the token and the two lines to paste.
        # Both lines, not the first one written: make's output reaches the log as it is printed.
        def both_exports() -> dict[str, str] | None:
            found = dict(re.findall(r"export (SPARKPOINT_API_\w+)=(\S+)\n", log.read_text()))
            return found if len(found) == 2 else None

        exports = wait_for("the export lines", both_exports, 180)
        assert set(exports) == {"SPARKPOINT_API_URL", "SPARKPOINT_API_TOKEN"}, log.read_text()
        api = exports["SPARKPOINT_API_URL"]
        assert api == f"http://127.0.0.1:{api_port}"
        assert f"http://127.0.0.1:{dashboard_port}" in log.read_text()
        # 2. The first completed checkpoint, through the API.
        jobs = wait_for("the demo job", lambda: httpx.get(f"{api}/jobs").json()["jobs"], 120)
        job = jobs[0]["id"]

        def completed() -> int | None:
            latest = httpx.get(f"{api}/jobs/{job}/checkpoints").json()["latest"]["completed"]
            return latest["id"] if latest else None

        wait_for("a completed checkpoint", completed, 180)
        # 3. A savepoint with the CLI and only what make demo printed.
        cli_env = {**_clean_env(), **exports}
        cli = str(VENV / "bin" / "sparkpoint")
        saved = subprocess.run(
            [cli, "savepoint", job], env=cli_env, capture_output=True, text=True, timeout=120
        )
        assert saved.returncode == 0, saved.stderr
        assert f"savepoint of job {job} completed: file://" in saved.stdout
        # 4. Restore checkpoint N, a retained one picked as a user would, a little later.
        n = completed()
        time.sleep(2)
        restored = subprocess.run(
            [cli, "restore", job, "--checkpoint", str(n)],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert restored.returncode == 0, restored.stderr
        assert f"chk-{n}" in restored.stdout
        wait_for(
            "attempt 2 running",
            lambda: (
                (j := httpx.get(f"{api}/jobs/{job}").json())["attempt"] == 2
                and j["state"] == "RUNNING"
            ),
            120,
        )
        # 5. Ctrl-C.
        os.killpg(make.pid, signal.SIGINT)
        make.wait(timeout=90)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
    text = log.read_text()
    assert f"job {job} canceled by SIGINT" in text, text[-3000:]
    assert "Traceback" not in text, text[-5000:]
    deadline = time.monotonic() + 30
    while _left_running(clone) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _left_running(clone) == []
