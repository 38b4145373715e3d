"""The services of docker/compose.yaml run as processes here, as Compose would run them.

Each Sparkpoint service's ``command`` and ``environment`` are taken from the compose file, with
what only Docker provides mapped to this machine: service names resolve to 127.0.0.1, each port
to a free one, the volumes' mount points to directories of the test, Redis and PostgreSQL to
the tests' own (a fresh database). The health checks are the compose file's own commands,
mapped the same way; a service starts once the services it depends on pass theirs.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.docker.compose_file import command_list, service_environment

HOST = "127.0.0.1"
#: Every port a service of compose.yaml listens on (unique across its services).
COMPOSE_PORTS = ("8081", "8050", "7077", "8080", "8082")
COMPOSE_HOSTS = ("redis", "postgres", "control-plane", "spark-master", "spark-worker", "pv-job")
#: The mount points of compose.yaml's volumes, and the container-local directories it names.
COMPOSE_PATHS = ("/data", "/shared", "/tmp/spark-work", "/tmp/sparkpoint-local")
#: What docker/Dockerfile sets with ENV (PYSPARK_PYTHON: the interpreter with Sparkpoint).
IMAGE_ENV = {"PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
HEALTH_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Localization:
    """How names of the compose file map to this machine."""

    root: Path
    redis_url: str
    database_url: str
    ports: dict[str, str] = field(
        default_factory=lambda: {p: str(free_port()) for p in COMPOSE_PORTS}
    )

    def __post_init__(self) -> None:
        paths = sorted(COMPOSE_PATHS, key=len, reverse=True)
        self._path = re.compile(
            r"(?<![\w.])(?:file://)?(" + "|".join(map(re.escape, paths)) + r")(?![\w-])"
        )
        self._url_host = re.compile(r"(?<=://)(" + "|".join(COMPOSE_HOSTS) + r")(?=[:/])")
        self._url_port = re.compile(r"(?<=:)(" + "|".join(COMPOSE_PORTS) + r")\b")

    def path(self, container_path: str) -> Path:
        """Where a container path lives here."""
        return self.root / container_path.strip("/").replace("/", "-")

    def value(self, text: str) -> str:
        """``text`` (an argument, a variable's value, a health check) mapped to this machine."""
        if text.startswith("redis://redis:"):
            return self.redis_url
        if text.startswith("postgresql://") and "@postgres:" in text:
            return self.database_url
        if text in COMPOSE_HOSTS:
            return HOST
        if text in self.ports:
            return self.ports[text]

        def local_path(m: re.Match[str]) -> str:
            prefix = "file://" if m.group(0).startswith("file://") else ""
            return prefix + str(self.path(m.group(1)))

        text = self._path.sub(local_path, text)
        text = self._url_host.sub(HOST, text)
        return self._url_port.sub(lambda m: self.ports[m.group(1)], text)


@dataclass
class LocalService:
    """One compose service running as a process group of its own."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    healthcheck: list[str] | None
    env: dict[str, str]

    def healthy(self) -> bool:
        """The compose file's health check, run here: exit status 0."""
        assert self.healthcheck is not None
        done = subprocess.run(self.healthcheck, env=self.env, capture_output=True, timeout=30)
        return done.returncode == 0

    def wait_healthy(self) -> None:
        """Poll the health check, as Compose does, until it passes; fail with the log."""
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
            if self.healthy():
                return
            time.sleep(0.5)
        raise AssertionError(f"{self.name} not healthy in time: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM the service's process group, then SIGKILL what is left of it."""
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 20)):
            if self.proc.poll() is not None:
                return
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue


def base_environment() -> dict[str, str]:
    """This process's environment without the settings a service must get from compose.yaml."""
    own = ("SPARKPOINT_", "SPARK_", "PYSPARK_")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(own) and k not in ("REDIS_URL", "DATABASE_URL")
    }
    # `sparkpoint`, `spark-class` and `python3` are the installed ones, as in the image.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def start_service(
    name: str, service: dict[str, Any], where: Localization, extra_env: dict[str, str]
) -> LocalService:
    """Start ``service``'s command, mapped to this machine, with its environment on top of the
    image's and ``extra_env`` (what the test adds: a stream prefix of its own, ...)."""
    env = {
        **base_environment(),
        **IMAGE_ENV,
        **{k: where.value(v) for k, v in service_environment(service).items()},
        **extra_env,
    }
    command = [where.value(arg) for arg in command_list(service)]
    health = service.get("healthcheck", {}).get("test")
    healthcheck = [where.value(arg) for arg in health[1:]] if health else None
    log = where.root / f"{name}.log"
    cwd = Path(__file__).resolve().parents[2]  # the image's WORKDIR: the repository's root
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own: stop() ends it whole
        )
    return LocalService(name, proc, log, healthcheck, env)
