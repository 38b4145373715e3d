"""A real ``sparkpoint server`` process for end-to-end tests, and a REST client for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from sparkpoint import protocol as p
from sparkpoint.signing import Signer, job_key, read_secret
from sparkpoint.transport import RedisEventSink, Streams, redis_client

from ..support.ports import free_port as free_port
from ..support.redis_server import REDIS_URL
from ..support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "e2e-token-0123456789"  # at least 16 characters, as the server requires


@dataclass
class ServerProcess:
    """``sparkpoint server`` on a free port, a data directory and a stream prefix of its own."""

    data_dir: Path
    prefix: str = field(default_factory=lambda: f"e2e-{uuid.uuid4().hex[:8]}")
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARKPOINT_DATA_DIR": str(self.data_dir),
            "SPARKPOINT_STREAM_PREFIX": self.prefix,
            "SPARKPOINT_API_TOKEN": TOKEN,
            "SPARKPOINT_TICK_MS": "20",
            # Jobs' checkpoints and the savepoints tests ask for live beside the data directory.
            "SPARKPOINT_STORAGE_ROOTS": str(self.data_dir.parent),
            "REDIS_URL": REDIS_URL,
            "PYSPARK_PYTHON": sys.executable,
        }

    def signer(self) -> Signer:
        """Signs events as a driver of this server's jobs would (from its data directory's
        secret, which the server creates at start)."""
        secret = read_secret(self.data_dir)
        assert secret is not None, f"no event secret in {self.data_dir}: start the server first"
        return Signer(lambda job_id: job_key(secret, job_id), f"test-{uuid.uuid4().hex[:8]}")

    def start(self) -> None:
        exe = Path(sys.executable).with_name("sparkpoint")
        log = open(self.data_dir.parent / f"server-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [str(exe), "server", "--port", str(self.port)],
            cwd=ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"sparkpoint server did not start; see {log.name}")

    def kill(self) -> None:
        """SIGKILL: nothing is flushed, nothing is said goodbye."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )

    def register_running_job(self, job_id: str, name: str = "pv") -> None:
        """Send, signed as its driver would, a one-vertex job's registration and RUNNING."""
        sink = RedisEventSink(
            redis_client(REDIS_URL), Streams(prefix=self.prefix), signer=self.signer()
        )
        vertex = p.VertexModel(id="source", name="source", parallelism=1, operators=["source"])
        registered = p.JobRegistered(
            job_name=name, vertices=[vertex], edges=[], config={}, incarnation="d1"
        )
        sink.publish(
            [
                p.envelope(job_id, 0, 0, registered),
                p.envelope(job_id, 1, 0, p.JobStatusChanged(status=p.JobStatus.RUNNING)),
            ]
        )


def first_job(api: httpx.Client) -> str:
    """The id of the first job the control plane lists, once one registered."""
    jobs = wait_for(
        "the job to register", lambda: [j["id"] for j in api.get("/jobs").json()["jobs"]]
    )
    return str(jobs[0])


def completed_checkpoints(api: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    """The job's completed checkpoints in its history, newest first."""
    history = api.get(f"/jobs/{job_id}/checkpoints?limit=1000").json()["history"]
    return [h for h in history if h["status"] == "COMPLETED"]


S = TypeVar("S", bound=ServerProcess)


def running(srv: S) -> Iterator[S]:
    """A fixture's body: start ``srv`` in its data directory (created), yield it, stop it and
    delete its streams."""
    srv.data_dir.mkdir()
    srv.start()
    yield srv
    srv.stop()
    client = redis_client(REDIS_URL)
    for key in client.scan_iter(f"{srv.prefix}:*"):
        client.delete(key)
    client.close()
