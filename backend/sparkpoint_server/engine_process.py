"""The REST API in one process, the coordination in another (``SPARKPOINT_API_PROCESS``,
on by default).

In one process, the ingest, the completions and the timers share Python's interpreter lock
with the API: at 200 jobs that process runs at ~100 % of a core and a REST request waits its
turn (p99 107-230 ms against 7 ms with no load; ``tests/benchmarks/results/load.md``). So
``sparkpoint server`` starts the coordination (the :class:`~sparkpoint_server.app.
Runner`: Redis, migrations, the control plane, the ingest, the timers) in a child process, the
*engine*, and serves the API in its own process:

- reads go to the database directly (SQLite in WAL mode lets them read while the engine
  writes; PostgreSQL as it is);
- the API's commands (:class:`~sparkpoint_server.api.deps.ControlPlaneCommands`), the
  ingest's counters and the engine's garbage-collector pauses go to the engine over a local
  socket (``multiprocessing`` connections, authenticated with a random key); a refused
  command comes back as the same status and message;
- a job's key is derived in the API process from the server secret in the data directory.

The engine dies with the API process (``PR_SET_PDEATHSIG`` on Linux; elsewhere it sees within
a second that its parent is gone and stops), so a killed server never leaves a coordinating
orphan behind. When the engine dies, the API process starts it again (it recovers as any
restarted control plane does; meanwhile the API answers reads, commands with 503, and
``/metrics`` with ``sparkpoint_engine_up 0``), up to
:data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW_S`; the next death stops the server
(non-zero), for whatever supervises it to act.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Client,
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from typing import Any

from sparkpoint.signing import job_key, load_or_create_secret
from sparkpoint_server import gc_pauses
from sparkpoint_server.config import Settings
from sparkpoint_server.errors import ControlPlaneError, StartupError
from sparkpoint_server.storage.db import create_db_engine, session_factory

log = logging.getLogger(__name__)

#: The commands the API sends to the engine (``ControlPlaneCommands``).
COMMANDS = (
    "trigger_checkpoint",
    "trigger_savepoint",
    "stop_with_savepoint",
    "restore",
    "cancel",
    "dispose_savepoint",
    "update_checkpoint_config",
    "set_restart_strategy",
)
#: How long the API process waits for the engine to be ready (migrations, recovery).
START_TIMEOUT_S = 300.0
#: How often the engine checks that the API process is still its parent (where no death
#: signal tells it: not Linux).
PARENT_CHECK_S = 1.0
#: A dead engine is started again after RESTART_DELAY_S, at most MAX_RESTARTS times within
#: RESTART_WINDOW_S seconds; the next death within that window stops the server.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
RESTART_DELAY_S = 1.0


class EngineCommandError(ControlPlaneError):
    """A command the engine refused: its status and message, as the engine raised them."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


class EngineUnavailableError(ControlPlaneError):
    """The engine did not answer: it died and is being started again (or the server stops)."""

    status_code = 503


# ----------------------------------------------------------------------------- the engine


def engine_main(settings: Settings, ready: Connection, authkey: bytes, parent: int) -> None:
    """The engine process: start the runner, answer the API's calls until told to stop or
    until the API process (``parent``) is gone."""
    from sparkpoint.supervisor import die_with_parent
    from sparkpoint_server.app import Runner

    die_with_parent(signal.SIGKILL)  # as if the server was killed whole
    if os.getppid() != parent:  # it died before that took effect
        os._exit(1)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s"
    )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    # Ctrl-C reaches the whole process group: the API process stops the engine (SIGTERM)
    # once the API is down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runner = Runner(settings)
    try:
        runner.start()
    except StartupError as err:  # Redis or the database: the API process tells it in a line
        ready.send(("failed", str(err)))
        sys.exit(1)
    except BaseException as err:
        ready.send(("failed", f"{type(err).__name__}: {err}"))
        raise
    # No authkey here: the handshake runs in each connection's thread (_serve), so a client
    # that fails it, or never answers, holds up no one else.
    listener = Listener(("127.0.0.1", 0))
    ready.send(("ready", listener.address, runner.redis_url))
    threading.Thread(target=_accept, args=(listener, runner, authkey), daemon=True).start()
    while not stopped.wait(PARENT_CHECK_S):
        if os.getppid() != parent:  # the API process is gone and no death signal came
            log.warning("engine: the API process (pid %d) is gone; stopping", parent)
            break
    runner.stop()


def _accept(listener: Listener, runner: Any, authkey: bytes) -> None:
    while True:
        try:
            conn = listener.accept()
        except OSError:
            log.exception("engine: accepting a connection failed")
            continue
        threading.Thread(target=_serve, args=(conn, runner, authkey), daemon=True).start()


def _serve(conn: Connection, runner: Any, authkey: bytes) -> None:
    """Answer one API connection's calls, in order: ``(name, args)`` → ``("ok", result)`` or
    ``("refused", status, message)``; first both sides prove they hold ``authkey`` (nothing
    is unpickled from a connection before that)."""
    try:
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
    except (AuthenticationError, EOFError, OSError) as err:
        log.warning("engine: refused a connection: %s", err)
        conn.close()
        return
    calls: dict[str, Callable[..., Any]] = {
        name: getattr(runner.control_plane, name) for name in COMMANDS
    }
    calls["ingest_stats"] = runner.stats.snapshot
    calls["gc_pauses"] = gc_pauses.PAUSES.snapshot
    with conn:
        while True:
            try:
                name, args = conn.recv()
            except (EOFError, OSError):
                return
            try:
                answer: tuple[Any, ...] = ("ok", calls[name](*args))
            except ControlPlaneError as err:
                answer = ("refused", err.status_code, str(err))
            except Exception as err:  # the API answers 500, as it would in one process
                log.exception("engine call %s failed", name)
                answer = ("failed", f"{type(err).__name__}: {err}")
            conn.send(answer)


# ----------------------------------------------------------------------------- the API side


class _Calls:
    """Calls to the engine over one connection per API thread; :meth:`retarget` points them
    at a restarted engine (each thread reconnects at its next call)."""

    def __init__(self, address: Any, authkey: bytes) -> None:
        self._target = (address, authkey, 0)  # and its generation
        self._local = threading.local()

    def retarget(self, address: Any, authkey: bytes) -> None:
        self._target = (address, authkey, self._target[2] + 1)

    def __call__(self, name: str, *args: Any) -> Any:
        address, authkey, generation = self._target
        conn = getattr(self._local, "conn", None)
        try:
            if conn is None or self._local.generation != generation:
                if conn is not None:
                    conn.close()
                self._local.conn = None
                conn = Client(address, authkey=authkey)
                self._local.conn, self._local.generation = conn, generation
            conn.send((name, args))
            answer = conn.recv()
        except (EOFError, OSError, AuthenticationError) as err:
            self._local.conn = None
            raise EngineUnavailableError(
                f"the control plane's engine did not answer {name} ({type(err).__name__}); "
                "it is being started again: retry in a few seconds"
            ) from err
        if answer[0] == "ok":
            return answer[1]
        if answer[0] == "refused":
            raise EngineCommandError(answer[1], answer[2])
        raise RuntimeError(f"the engine failed on {name}: {answer[1]}")


class RemoteControlPlane:
    """What the API needs of the control plane, with the engine doing the work."""

    def __init__(self, calls: _Calls, settings: Settings) -> None:
        self._calls = calls
        self.engine = create_db_engine(settings.effective_database_url)
        self.sessions = session_factory(self.engine)
        secret = load_or_create_secret(settings.data_dir)  # the engine made it at start
        self.key_of: Callable[[str], bytes] = lambda job_id: job_key(secret, job_id)
        for name in COMMANDS:
            setattr(self, name, self._command(name))

    def _command(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            return self._calls(name, *args)

        call.__name__ = name
        return call


class RemoteStats:
    """The engine's ingest counters (``/metrics``), all of them in one call."""

    def __init__(self, calls: _Calls) -> None:
        self._calls = calls

    def snapshot(self) -> dict[str, Any]:
        return dict(self._calls("ingest_stats"))


class RemoteGcPauses:
    """The engine's garbage-collector pauses (``/metrics``: the process under load)."""

    def __init__(self, calls: _Calls) -> None:
        self._calls = calls

    def snapshot(self) -> list[tuple[int, int, float, float]]:
        return [tuple(row) for row in self._calls("gc_pauses")]


class EngineRunner:
    """The API process's runner: starts the engine, hands the API its proxies, starts the
    engine again when it dies (the API answers meanwhile, commands with 503), stops it."""

    def __init__(self, settings: Settings, on_engine_exit: Callable[[int | None], None]) -> None:
        self.settings = settings
        self.on_engine_exit = on_engine_exit  # the engine died once too often: the end
        self.control_plane: RemoteControlPlane | None = None
        self.stats: RemoteStats | None = None
        self.gc_pauses: RemoteGcPauses | None = None
        self.redis_url = ""
        self.restarts = 0
        self._calls: _Calls | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._stopping = threading.Event()
        self._up = threading.Event()  # an engine answers (not between a death and its restart)

    @property
    def started(self) -> bool:
        return self.control_plane is not None

    def engine_up(self) -> bool:
        """Whether an engine is running and ready (``GET /healthz``)."""
        return self._up.is_set()

    def start(self) -> None:
        """Start the engine and wait until it is ready.

        Raises:
            StartupError: the engine failed to start (its error: Redis or the database cannot
                be used, or another, whose traceback the engine printed).
            RuntimeError: the engine died or did not get ready within :data:`START_TIMEOUT_S`.
        """
        address, authkey = self._spawn()
        self._calls = calls = _Calls(address, authkey)
        self.control_plane = RemoteControlPlane(calls, self.settings)
        self.stats = RemoteStats(calls)
        self.gc_pauses = RemoteGcPauses(calls)
        self._up.set()
        threading.Thread(target=self._watch, name="sparkpoint-engine-watch", daemon=True).start()

    def _spawn(self) -> tuple[Any, bytes]:
        """Start an engine process (``self._process``) and wait for it: its address and key."""
        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        authkey = secrets.token_bytes(32)
        self._process = process = context.Process(
            target=engine_main,
            args=(self.settings, send, authkey, os.getpid()),
            name="sparkpoint-engine",
            daemon=False,
        )
        process.start()
        send.close()
        if not receive.poll(START_TIMEOUT_S):
            process.kill()
            raise RuntimeError(f"the engine was not ready within {START_TIMEOUT_S:g} s")
        try:
            message = receive.recv()
        except EOFError:
            process.join(5)
            raise RuntimeError(
                f"the engine exited while starting (exit code {process.exitcode})"
            ) from None
        if message[0] != "ready":
            process.join(5)
            raise StartupError(message[1])
        _, address, self.redis_url = message
        log.info("engine process %d ready", process.pid)
        return address, authkey

    def _watch(self) -> None:
        """Start the engine again each time it dies, until it died more than
        :data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW_S`: then the server stops.
        An engine that fails to start counts as one more death."""
        assert self._calls is not None
        deaths: list[float] = []
        process = self._process
        while True:
            if process is not None:
                process.join()
            self._up.clear()
            if self._stopping.is_set():
                return
            code = process.exitcode if process is not None else None
            now = time.monotonic()
            deaths = [t for t in deaths if now - t < RESTART_WINDOW_S] + [now]
            if len(deaths) > MAX_RESTARTS:
                log.error(
                    "the engine process exited (exit code %s), %d times within %g s: stopping",
                    code,
                    len(deaths),
                    RESTART_WINDOW_S,
                )
                self.on_engine_exit(code)
                return
            log.error(
                "the engine process exited (exit code %s); starting it again in %g s",
                code,
                RESTART_DELAY_S,
            )
            if self._stopping.wait(RESTART_DELAY_S):
                return
            try:
                self._calls.retarget(*self._spawn())
            except Exception as err:
                if isinstance(err, StartupError):
                    log.error("starting the engine again failed: %s", err)
                else:
                    log.exception("starting the engine again failed")
                if self._process is not None and self._process.is_alive():
                    self._process.kill()
                    self._process.join(5)
                process = None
                continue
            process = self._process
            self.restarts += 1
            self._up.set()
            if self._stopping.is_set() and process is not None:
                self._terminate(process)  # stop() ran meanwhile and missed this one

    def stop(self) -> None:
        self._stopping.set()
        if self.control_plane is not None:
            self.control_plane.engine.dispose()
        if self._process is not None:
            self._terminate(self._process)

    @staticmethod
    def _terminate(process: multiprocessing.process.BaseProcess) -> None:
        if process.pid is None:
            return
        if process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
            process.join(30)
        if process.is_alive():
            process.kill()
            process.join(5)
