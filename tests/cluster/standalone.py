"""A Spark standalone cluster on 127.0.0.1, started from the installed PySpark: one master,
N workers, each a JVM of its own (``spark-class org.apache.spark.deploy.master.Master`` /
``...worker.Worker``), as an operator starts one by hand.

Every port is a free one, every worker is small (one core, 1 GB), work and log directories
live under the test's tmp directory, and :meth:`StandaloneCluster.stop` kills each daemon's
whole process group (the worker's executor JVMs with it), so nothing outlives the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
HOST = "127.0.0.1"
START_TIMEOUT_S = 90.0


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Daemon:
    """One JVM of the cluster: the master or a worker."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ui_port: int

    def freeze(self) -> None:
        """SIGSTOP the daemon's process group: its executors hold their tasks, answer nothing."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL the daemon's process group: a worker's executors die with it, as when
        its machine is lost."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@dataclass
class StandaloneCluster:
    """A standalone master and its workers; :meth:`start` returns once every worker is ALIVE
    in the master's view."""

    base: Path
    workers: int = 2
    worker_memory: str = "1g"
    master_port: int = field(default_factory=free_port)
    daemons: list[Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The master URL a driver passes as ``--master``."""
        return f"spark://{HOST}:{self.master_port}"

    @property
    def master(self) -> Daemon:
        return self.daemons[0]

    @property
    def worker_daemons(self) -> list[Daemon]:
        return self.daemons[1:]

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; wait until all workers are ALIVE."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.daemons.append(
            self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", HOST, "--port", str(self.master_port)],
            )
        )
        self.daemons.extend(self._spawn_worker(i) for i in range(1, self.workers + 1))
        self.wait_for_workers(self.workers)
        return self

    def _spawn_worker(self, i: int) -> Daemon:
        work = self.base / f"worker-{i}"
        work.mkdir(exist_ok=True)
        return self._spawn(
            f"worker-{i}",
            "org.apache.spark.deploy.worker.Worker",
            [
                self.url,
                "--host",
                HOST,
                "--port",
                str(free_port()),
                "--cores",
                "1",
                "--memory",
                self.worker_memory,
                "--work-dir",
                str(work),
            ],
        )

    def replace_dead_workers(self) -> None:
        """Start a new worker for each one that was killed; wait until all are ALIVE."""
        for i, d in enumerate(self.daemons[1:], start=1):
            if d.proc.poll() is not None:
                self.daemons[i] = self._spawn_worker(i)
        self.wait_for_workers(self.workers)

    def _spawn(self, name: str, main_class: str, args: list[str]) -> Daemon:
        ui_port = free_port()
        log = self.base / f"{name}.log"
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_LOG_DIR": str(self.base / "logs"),
            "SPARK_DAEMON_MEMORY": "256m",
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(SPARK_CLASS), main_class, *args, "--webui-port", str(ui_port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() kills it whole
            )
        return Daemon(name, proc, log, ui_port)

    def state(self) -> dict[str, object]:
        """The master's JSON view (``/json/``): workers, applications."""
        with urllib.request.urlopen(f"http://{HOST}:{self.master.ui_port}/json/", timeout=5) as r:
            return dict(json.load(r))

    def alive_workers(self) -> int:
        workers = self.state().get("workers", [])
        assert isinstance(workers, list)
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def wait_for_workers(self, n: int) -> None:
        """Wait until ``n`` workers are ALIVE; raise with the daemons' logs otherwise."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for d in self.daemons:
                if d.proc.poll() is not None:
                    raise RuntimeError(f"{d.name} exited: {d.log.read_text()[-3000:]}")
            try:
                if self.alive_workers() >= n:
                    return
            except (OSError, ValueError):
                # The master's UI is not up yet, or answers its HTML page while it starts:
                # JSON that does not parse (json.JSONDecodeError is a ValueError).
                pass
            time.sleep(0.5)
        logs = "\n".join(f"{d.name}: {d.log.read_text()[-1500:]}" for d in self.daemons)
        raise RuntimeError(f"the cluster did not start {n} workers in {START_TIMEOUT_S} s\n{logs}")

    def stop(self) -> None:
        """Kill every daemon (and its executors); safe to call twice."""
        for d in reversed(self.daemons):
            d.kill()
