"""The faults of the chaos suite: real kills and pauses of real processes, a full disk, a
locked database.

Each fault acts on the processes of one chaos run (:class:`ChaosTargets`): the supervisor
(``sparkpoint run``), its driver (the Python process: killed, or paused with SIGSTOP as a long
garbage collection or a suspended VM would, longer than its heartbeat timeout at times), the
driver's Spark JVM and the Python workers under it, the control plane (``sparkpoint server``:
killed, or paused with its engine), its engine (the child that coordinates, unless the server
runs in one process) and its embedded Redis; on the checkpoint
storage (a small tmpfs that can be filled to ``ENOSPC``), on the control plane's data
directory (a tmpfs too: its SQLite database and its Redis' append-only file on a full disk)
and on its SQLite database (held under an exclusive lock). A fault that finds nothing to act
on (no Python worker alive at that instant) says so and is counted as skipped, never as run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

#: Fault kinds, in the order the report lists them.
KINDS = (
    "python-worker",
    "driver-jvm",
    "driver",
    "driver-paused",
    "control-plane",
    "control-plane-paused",
    "engine",
    "redis",
    "storage-full",
    "control-plane-disk-full",
    "database-locked",
)
#: Faults that end the driver: the next fault comes soon, to hit start-up, warm-up, restore.
DRIVER_KINDS = frozenset({"driver-jvm", "driver"})


@dataclass(frozen=True)
class FaultResult:
    kind: str
    ran: bool
    detail: str


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _engines(server_pid: int) -> list[psutil.Process]:
    """The live engine processes of the server (its spawned Python children)."""
    return [p for p in _descendants(server_pid) if "spawn_main" in _cmdline(p)]


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _pause(procs: list[psutil.Process], seconds: float) -> bool:
    """SIGSTOP ``procs`` for ``seconds``, then SIGCONT; whether one of them was paused."""
    paused = []
    try:
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGSTOP)
                paused.append(proc)
        time.sleep(seconds)
    finally:
        for proc in paused:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)
    return bool(paused)


def _kill(proc: psutil.Process) -> bool:
    try:
        proc.send_signal(signal.SIGKILL)
        return True
    except psutil.NoSuchProcess:
        return False


@dataclass
class ChaosTargets:
    """What the faults act on. ``restart_control_plane`` starts a new server process."""

    supervisor_pid: int
    server_pid: Callable[[], int | None]
    restart_control_plane: Callable[[], None]
    redis_pid_file: Path
    database: Path
    storage: Path | None  # a tmpfs mount of its own, or None when mounting is not possible
    server_disk: Path | None  # the control plane's data directory, a tmpfs mount, or None
    rng: random.Random

    # ------------------------------------------------------------------ the job's processes
    def driver(self) -> psutil.Process | None:
        for proc in _descendants(self.supervisor_pid):
            line = _cmdline(proc)
            if "sparkpoint.cli" in line and " run " in f" {line} ":
                return proc
        return None

    def jvm(self) -> psutil.Process | None:
        driver = self.driver()
        if driver is None:
            return None
        for proc in _descendants(driver.pid):
            if "org.apache.spark.deploy.SparkSubmit" in _cmdline(proc):
                return proc
        return None

    def python_workers(self) -> list[psutil.Process]:
        jvm = self.jvm()
        if jvm is None:
            return []
        return [p for p in _descendants(jvm.pid) if "pyspark" in _cmdline(p)]

    # ------------------------------------------------------------------ faults
    def inject(self, kind: str) -> FaultResult:
        return getattr(self, "_" + kind.replace("-", "_"))()  # type: ignore[no-any-return]

    def _python_worker(self) -> FaultResult:
        workers = self.python_workers()
        if not workers:
            return FaultResult("python-worker", False, "no Python worker alive")
        victim = self.rng.choice(workers)
        line = _cmdline(victim)
        ran = _kill(victim)
        return FaultResult("python-worker", ran, f"SIGKILL pid {victim.pid} ({line[-40:]})")

    def _driver_jvm(self) -> FaultResult:
        jvm = self.jvm()
        if jvm is None:
            return FaultResult("driver-jvm", False, "no driver JVM alive")
        return FaultResult("driver-jvm", _kill(jvm), f"SIGKILL JVM pid {jvm.pid}")

    def _driver(self) -> FaultResult:
        driver = self.driver()
        if driver is None:
            return FaultResult("driver", False, "no driver process alive")
        # Only the Python process: its Spark JVM notices (stdin closes) and exits by itself.
        return FaultResult("driver", _kill(driver), f"SIGKILL driver pid {driver.pid}")

    def _driver_paused(self) -> FaultResult:
        driver = self.driver()
        if driver is None:
            return FaultResult("driver-paused", False, "no driver process alive")
        held = self.rng.uniform(2.0, 12.0)  # its lease lives 3 s, its heartbeat timeout 6 s
        ran = _pause([driver], held)
        return FaultResult("driver-paused", ran, f"SIGSTOP driver pid {driver.pid}, {held:.1f} s")

    def _control_plane_paused(self) -> FaultResult:
        """The control plane and its engine paused (not its Redis: the job's events queue)."""
        pid = self.server_pid()
        if pid is None:
            return FaultResult("control-plane-paused", False, "no control plane alive")
        held = self.rng.uniform(2.0, 10.0)
        with contextlib.suppress(psutil.NoSuchProcess):
            ran = _pause([psutil.Process(pid), *_engines(pid)], held)
            return FaultResult("control-plane-paused", ran, f"SIGSTOP pid {pid}, {held:.1f} s")
        return FaultResult("control-plane-paused", False, f"pid {pid} ended before its pause")

    def _control_plane(self) -> FaultResult:
        pid = self.server_pid()
        if pid is None:
            return FaultResult("control-plane", False, "no control plane alive")
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        down = self.rng.uniform(1.0, 4.0)
        time.sleep(down)
        self.restart_control_plane()
        return FaultResult("control-plane", True, f"SIGKILL pid {pid}, down {down:.1f} s")

    def _engine(self) -> FaultResult:
        """SIGKILL of the engine alone: the server starts it again, or, when its engine died
        too often, stops (non-zero) and is started again, as its supervisor would."""
        pid = self.server_pid()
        if pid is None:
            return FaultResult("engine", False, "no control plane alive")
        engines = _engines(pid)
        if not engines:
            return FaultResult("engine", False, "the control plane runs in one process")
        victim = engines[0]
        _kill(victim)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if _ended(pid):
                with contextlib.suppress(ChildProcessError):
                    _, status = os.waitpid(pid, 0)
                    if os.waitstatus_to_exitcode(status) == 0:
                        raise AssertionError("the server ended with status 0 when its engine died")
                self.restart_control_plane()
                detail = "the server stopped (its engine died too often) and was started again"
                return FaultResult("engine", True, f"SIGKILL engine pid {victim.pid}: {detail}")
            started = [e for e in _engines(pid) if e.pid != victim.pid]
            if started:
                detail = f"the server started engine pid {started[0].pid}"
                return FaultResult("engine", True, f"SIGKILL engine pid {victim.pid}: {detail}")
            time.sleep(0.1)
        raise AssertionError(f"no engine again within 60 s after killing pid {victim.pid}")

    def _redis(self) -> FaultResult:
        try:
            pid = int(self.redis_pid_file.read_text().strip())
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError) as err:
            return FaultResult("redis", False, f"no embedded Redis to kill: {err}")
        return FaultResult("redis", True, f"SIGKILL embedded Redis pid {pid}")

    def _storage_full(self) -> FaultResult:
        if self.storage is None:
            return FaultResult("storage-full", False, "checkpoint storage is not a tmpfs here")
        held = self.rng.uniform(4.0, 8.0)
        written = _fill_for(self.storage, held)
        return FaultResult(
            "storage-full", True, f"checkpoint storage full ({written >> 20} MiB) for {held:.1f} s"
        )

    def _control_plane_disk_full(self) -> FaultResult:
        """The control plane's disk full: its database cannot commit and its Redis refuses
        every write (MISCONF: its append-only file cannot grow), drivers' events included."""
        if self.server_disk is None:
            return FaultResult(
                "control-plane-disk-full", False, "the data directory is not a tmpfs here"
            )
        held = self.rng.uniform(4.0, 10.0)
        written = _fill_for(self.server_disk, held)
        detail = f"data directory full ({written >> 20} MiB) for {held:.1f} s"
        return FaultResult("control-plane-disk-full", True, detail)

    def _database_locked(self) -> FaultResult:
        conn = sqlite3.connect(self.database, timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(10)
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        return FaultResult("database-locked", True, f"{self.database.name} locked for 10 s")


def _fill_for(directory: Path, seconds: float) -> int:
    """Fill ``directory``'s file system to ``ENOSPC``, hold it full ``seconds``, free it; the
    bytes written."""
    ballast = directory / ".chaos-ballast"
    written = 0
    chunk = b"\0" * (1 << 20)
    try:
        try:
            with open(ballast, "wb") as fh:
                while True:
                    fh.write(chunk)
                    fh.flush()
                    written += len(chunk)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
        time.sleep(seconds)
    finally:  # whatever happened, the disk is freed
        ballast.unlink(missing_ok=True)
    return written


def mount_tmpfs(path: Path, size_mb: int) -> bool:
    """Mount a tmpfs of ``size_mb`` at ``path`` (root only); False when that is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "chaos-storage", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


class FaultSchedule:
    """Which fault comes next and when: every kind in turn (shuffled each round), a gap of
    ``gap_s`` seconds between faults, shorter after a driver fault (to hit the next start)."""

    def __init__(
        self, rng: random.Random, gap_s: tuple[float, float], kinds: tuple[str, ...] = KINDS
    ) -> None:
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; the kinds are {list(KINDS)}")
        self.rng = rng
        self.gap_s = gap_s
        self.kinds = kinds
        self._round: list[str] = []
        self._tried: set[str] = set()

    def next_kind(self) -> str:
        if not self._round:
            self._round = list(self.kinds)
            self.rng.shuffle(self._round)
        kind = self._round.pop()
        self._tried.add(kind)
        return kind

    @property
    def every_kind_tried(self) -> bool:
        return self._tried == set(self.kinds)

    def gap_after(self, kind: str | None) -> float:
        if kind in DRIVER_KINDS and self.rng.random() < 0.5:
            return self.rng.uniform(1.0, 6.0)  # start-up, warm-up or restore of the next driver
        return self.rng.uniform(*self.gap_s)
