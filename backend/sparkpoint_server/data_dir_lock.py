"""One control plane per data directory: an exclusive lock held for the server's life.

Two ``sparkpoint server`` processes on one data directory would share its SQLite file, its
embedded Redis and its ``redis.url``: the second would stop the first one's Redis as an
orphan and delete the URL its jobs read. The server that starts first holds an exclusive
``fcntl`` lock on ``<data dir>/server.lock``, with its pid in the file, until it ends; the
kernel releases the lock when the process ends however it ends (SIGKILL too), so a killed
server leaves no stale lock behind. A second server finds the lock taken and stops before
touching anything.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from sparkpoint_server.errors import ControlPlaneError

LOCK_FILE = "server.lock"


class DataDirectoryInUseError(ControlPlaneError):
    """Another control plane holds the data directory's lock."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        owner = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(
            f"data directory {data_dir} is in use by another sparkpoint server ({owner}); "
            "stop that one, or give this one another SPARKPOINT_DATA_DIR"
        )
        self.data_dir = data_dir
        self.pid = pid


class DataDirectoryLock:
    """The lock of one data directory (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.path = self.data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write this process's pid into the lock file.

        Raises:
            DataDirectoryInUseError: another process holds it (the file is left as it is).
        """
        # Not truncated before the lock is ours: the owner's pid stays readable. The
        # descriptor is not inherited (PEP 446): a child (the embedded Redis) never holds it.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            owner = _read_pid(fd)
            os.close(fd)
            raise DataDirectoryInUseError(self.data_dir, owner) from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up (the process's end does it too)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> DataDirectoryLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    raw = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(raw) if raw.isdigit() else None
