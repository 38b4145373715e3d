"""``SPARKPOINT_API_PROCESS`` (on by default): the REST API in the server process, the
coordination in its engine child (``sparkpoint_server/engine_process.py``); off, one process.

A connected PV job fails, is restored by the engine and commits exactly what a run without
the failure commits; the API answers reads from the database and the engine's refusals with
their status and message; the engine dies with the server; a dead engine is started again
(commands answer 503 meanwhile), and the server stops when its engine keeps dying.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path

import numpy as np
import psutil
import pytest

from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.signing import job_key, read_secret
from sparkpoint.testing import line_counts
from sparkpoint_server.engine_process import MAX_RESTARTS

from ..support.waiting import wait_for
from .control_plane import REDIS_URL, ROOT, ServerProcess, running

EVENTS, APPS = 6_000, 4


class SplitServer(ServerProcess):
    def env(self) -> dict[str, str]:
        return {**super().env(), "SPARKPOINT_API_PROCESS": "1"}

    def engines(self) -> list[psutil.Process]:
        """The live engine processes (a killed one is a zombie until the server reaps it)."""
        assert self.proc is not None
        found = []
        for child in psutil.Process(self.proc.pid).children():
            try:
                if "spawn_main" in " ".join(child.cmdline()):
                    found.append(child)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
        return found

    def engine(self) -> psutil.Process:
        [engine] = self.engines()
        return engine


class DefaultServer(SplitServer):
    """The server as it starts when ``SPARKPOINT_API_PROCESS`` is not set, or set to ``mode``."""

    def __init__(self, data_dir: Path, mode: str | None) -> None:
        super().__init__(data_dir)
        self.mode = mode

    def env(self) -> dict[str, str]:
        env = ServerProcess.env(self)
        env.pop("SPARKPOINT_API_PROCESS", None)
        if self.mode is not None:
            env["SPARKPOINT_API_PROCESS"] = self.mode
        return env


@pytest.fixture
def split(tmp_path: Path) -> Iterator[SplitServer]:
    yield from running(SplitServer(tmp_path / "data"))


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_api_answers_from_the_database_and_relays_the_engines_refusals(
    split: SplitServer,
) -> None:
    with split.api() as api:
        refused = api.post("/jobs/no-such-job/checkpoints")
        assert refused.status_code == 404
        assert refused.json() == {"errors": ["job no-such-job not found"]}
        assert api.get("/jobs").json() == {"jobs": [], "total": 0}
        key = api.post("/jobs/some-job/key").json()["key"]
        scraped = api.get("/metrics")
        assert scraped.status_code == 200
        metrics = scraped.text
    secret = read_secret(split.data_dir)
    assert secret is not None
    assert key == job_key(secret, "some-job").hex()  # derived in the API process
    assert "sparkpoint_events_ingested_total 0" in metrics.splitlines()  # from the engine
    # The garbage collector's pauses come from the engine too (a call over the socket).
    gc_lines = [line for line in metrics.splitlines() if line.startswith("sparkpoint_gc_")]
    assert len(gc_lines) == 9 and all(float(line.split()[-1]) >= 0 for line in gc_lines)


@pytest.mark.spark
def test_a_connected_job_fails_over_through_the_engine_and_commits_exactly_once(
    split: SplitServer, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("sparkpoint")),
            *("run", "jobs/examples/pv_count.py", "--job-id", "split-pv"),
            *("--redis-url", REDIS_URL, "--stream-prefix", split.prefix),
            *("--checkpoint-dir", f"file://{tmp_path}/chk", "--checkpoint-interval", "0.5"),
            *("--fail-after", "1500", "--"),
            *("--events", str(EVENTS), "--apps", str(APPS), "--rate", "1500"),
            *("--emit", "every", "--output", str(out)),
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "SPARKPOINT_DATA_DIR": str(split.data_dir),  # the event secret
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    source = GeneratorSource(events=EVENTS, apps=APPS, rate=0)
    per_app: Counter[str] = Counter()
    for i in range(len(source.split_ids())):
        ids = np.asarray(source.read(i, 0, source.total(i) or 0).column("app_id"))
        per_app.update(ids.tolist())
    expected = Counter(
        f'{{"app_id": "{app}", "pv": {n}}}'
        for app, total in per_app.items()
        for n in range(1, total + 1)
    )
    assert line_counts(str(out)) == expected
    with split.api() as api:
        job = api.get("/jobs/split-pv").json()
        counts = api.get("/jobs/split-pv/checkpoints").json()["counts"]
    assert job["restarts"] >= 1
    assert counts["completed"] >= 1 and counts["restored"] >= 1


@pytest.mark.timeout(60)  # a handshake that blocks the engine's accept hangs this test
def test_a_connection_without_the_engines_key_is_refused_and_blocks_no_one(
    split: SplitServer,
) -> None:
    [address] = [
        c.laddr
        for c in split.engine().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    silent = socket.create_connection(tuple(address))  # connects, never answers the challenge
    try:
        with pytest.raises(AuthenticationError):
            Client(tuple(address), authkey=b"not the engine's key")
        with split.api() as api:  # the API's own calls still go through
            refused = api.post("/jobs/no-such-job/checkpoints")
        assert refused.status_code == 404
    finally:
        silent.close()


def test_the_engine_dies_with_the_server(split: SplitServer) -> None:
    engine = split.engine()
    split.kill()  # SIGKILL: no shutdown runs
    wait_for("the engine to die with the server", lambda: _gone(engine), timeout_s=10)


def _new_engine(server: SplitServer, old: psutil.Process) -> psutil.Process:
    """The engine that replaced ``old``, once it answers."""

    def replaced() -> bool:
        engines = server.engines()
        return len(engines) == 1 and engines[0].pid != old.pid and _answers(server)

    wait_for("the engine to be started again", replaced, timeout_s=60)
    return server.engine()


def _answers(server: SplitServer) -> bool:
    with server.api() as api:  # /metrics reads the engine's ingest counters
        return "sparkpoint_engine_up 1" in api.get("/metrics").text.splitlines()


def test_a_dead_engine_is_started_again_while_the_api_answers(split: SplitServer) -> None:
    split.register_running_job("job-split")
    with split.api() as api:
        wait_for(
            "the job to run",
            lambda: api.get("/jobs/job-split").json().get("state") == "RUNNING",
            timeout_s=30,
        )
        engine = split.engine()
        engine.send_signal(signal.SIGKILL)
        meanwhile = api.post("/jobs/job-split/checkpoints")
        health = api.get("/healthz")
        scraped = api.get("/metrics")
        alone = not split.engines()  # no engine had started again when they answered
        assert api.get("/jobs/job-split").status_code == 200  # reads: from the database
    # While no engine runs, a command is refused as unavailable, naming the engine (never a
    # 500), and the health check says so.
    if alone:
        assert meanwhile.status_code == 503, meanwhile.text
        assert "engine did not answer trigger_checkpoint" in meanwhile.json()["errors"][0]
        assert health.status_code == 503, health.text
        assert "engine is not running" in health.json()["errors"][0]
        # The database's families still, none of the engine's, and that it is down.
        lines = scraped.text.splitlines()
        assert "sparkpoint_engine_up 0" in lines, scraped.text
        assert any(line.startswith("sparkpoint_job_status{") for line in lines)
        assert not any(line.startswith("sparkpoint_events_ingested_total ") for line in lines)
    else:
        assert meanwhile.status_code in (503, 202), meanwhile.text
    _new_engine(split, engine)
    with split.api() as api:
        assert api.post("/jobs/job-split/checkpoints").status_code == 202
        health = api.get("/healthz").json()
        # The new engine's ingest has read (or is about to): its progress comes from it.
        assert health["status"] == "ok" and set(health["ingest"]) == {"read-through", "behind-ms"}
        lines = api.get("/metrics").text.splitlines()
    assert "sparkpoint_engine_up 1" in lines and "sparkpoint_engine_restarts_total 1" in lines
    assert split.proc is not None and split.proc.poll() is None


def test_the_server_stops_when_its_engine_keeps_dying(split: SplitServer) -> None:
    assert split.proc is not None
    engine = split.engine()
    for _ in range(MAX_RESTARTS):
        engine.send_signal(signal.SIGKILL)
        engine = _new_engine(split, engine)
    engine.send_signal(signal.SIGKILL)  # one death more than the server restarts
    deadline = time.monotonic() + 30
    while split.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert split.proc.returncode not in (None, 0)


def test_an_engine_that_cannot_start_again_stops_the_server(split: SplitServer) -> None:
    assert split.proc is not None
    engine = split.engine()
    engine.send_signal(signal.SIGKILL)
    # What the next engines start from is gone bad: each start fails, and counts as a death.
    for name in ("sparkpoint.db", "sparkpoint.db-wal", "sparkpoint.db-shm"):
        (split.data_dir / name).unlink(missing_ok=True)
    (split.data_dir / "sparkpoint.db").write_bytes(b"not a database" * 100)
    deadline = time.monotonic() + 60
    while split.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert split.proc.returncode not in (None, 0)
    log = (split.data_dir.parent / f"server-{split.port}.log").read_text()
    assert log.count("starting the engine again failed") == MAX_RESTARTS, log[-3000:]


def test_an_interrupted_server_stops_its_engine(split: SplitServer) -> None:
    assert split.proc is not None
    engine = split.engine()
    split.proc.send_signal(signal.SIGINT)
    assert split.proc.wait(timeout=60) == 0
    wait_for("the engine to stop", lambda: _gone(engine), timeout_s=10)


@pytest.fixture(params=[(None, 1), ("false", 0)], ids=["unset", "false"])
def default_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DefaultServer]:
    yield from running(DefaultServer(tmp_path / "data", request.param[0]))


def test_the_server_runs_an_engine_unless_told_to_run_in_one_process(
    request: pytest.FixtureRequest, default_server: DefaultServer
) -> None:
    _mode, engines = request.node.callspec.params["default_server"]
    assert len(default_server.engines()) == engines
    with default_server.api() as api:
        answer = api.post("/jobs/no-such-job/checkpoints")
    assert answer.status_code == 404, answer.text
    assert "no-such-job" in answer.json()["errors"][0]
