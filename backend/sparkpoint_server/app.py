"""The control plane application: ``create_app`` builds it, its lifespan runs it.

Start: (1) Redis: ``REDIS_URL`` or an embedded, supervised child process, (2) the database
migrated to the latest schema, (3) the coordination service rebuilt from the database,
(4) the ingest thread (events from Redis) and the timer thread (triggers, timeouts, restarts),
(5) the REST API. Stop in reverse order.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from fastapi import FastAPI
from sqlalchemy import make_url
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from sparkpoint.clock import Clock, SystemClock
from sparkpoint.errors import ConfigurationError
from sparkpoint.failure_streak import FailureStreak
from sparkpoint.transport import Streams, client_url, redis_client
from sparkpoint_server import gc_pauses
from sparkpoint_server.api import install_api
from sparkpoint_server.config import Settings
from sparkpoint_server.engine_process import EngineRunner
from sparkpoint_server.errors import StartupError
from sparkpoint_server.ingest.command_streams import CommandStreamRetention, ended_jobs_in
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats
from sparkpoint_server.ingest.embedded_redis import EmbeddedRedis, EmbeddedRedisError
from sparkpoint_server.service.control_plane import ControlPlane
from sparkpoint_server.storage.db import create_db_engine, migrate, session_factory

log = logging.getLogger(__name__)

# The ingest allocates many short-lived objects; Python's default (700, 10, 10) runs the cyclic
# GC so often that it took a quarter of the ingest time (tests/benchmarks/bench_ingest.py).
GC_THRESHOLDS = (50_000, 20, 100)


@dataclass
class Runner:
    """The control plane's moving parts, started and stopped together."""

    settings: Settings
    streams: Streams = field(default_factory=Streams)
    clock: Clock = field(default_factory=SystemClock)
    embedded: EmbeddedRedis | None = None
    control_plane: ControlPlane | None = None
    consumer: EventConsumer | None = None
    stats: IngestStats = field(default_factory=IngestStats)
    gc_pauses: gc_pauses.GcPauses = field(default_factory=lambda: gc_pauses.PAUSES)
    redis_url: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _engine: Any = None

    @property
    def started(self) -> bool:
        return self.control_plane is not None

    def start(self, *, background: bool = True) -> None:
        """Steps (1)-(4) of the module docstring; what had started is stopped when one fails.

        Raises:
            StartupError: Redis or the database cannot be used (a bad URL, not reachable,
                refusing): the message names which, where and why.
        """
        try:
            self._start(background)
        except BaseException as err:
            self.stop()
            self.control_plane = None
            database = self.settings.database_url or self.settings.effective_database_url
            cause = _startup_cause(err, self.redis_url, database)
            if cause is None:
                raise
            raise StartupError(cause) from err

    def _start(self, background: bool) -> None:
        s = self.settings
        self.streams = Streams(prefix=s.stream_prefix)
        # Step 1
        if s.redis_url:
            self.redis_url = s.redis_url
        else:
            self.embedded = EmbeddedRedis(s.data_dir, port=s.embedded_redis_port)
            self.embedded.start()
            self.redis_url = self.embedded.url
        client = redis_client(self.redis_url)
        # Step 2
        url = s.effective_database_url
        migrate(url)
        self._engine = create_db_engine(url)
        sessions = session_factory(self._engine)
        # Step 3
        self.control_plane = ControlPlane(
            s, sessions, client, streams=self.streams, clock=self.clock, stats=self.stats
        )
        self.control_plane.recover()
        # Step 4
        self.consumer = EventConsumer(
            client,
            self.control_plane.handle_batch,
            self.stats,
            streams=self.streams,
            consumer=s.consumer_name,
            batch_size=s.ingest_batch,
            on_health=self.control_plane.ingest_health,
            dead_letter_maxlen=s.dead_letter_maxlen,
            trim_interval_ms=round(s.stream_trim_interval * 1000),
            verifier=self.control_plane.verify_event,
            clock=self.control_plane.clock,
            on_read_through=self.control_plane.ingest_read_through,
        )
        self.control_plane.track_ingest()
        self.consumer.ensure_group()
        retention = CommandStreamRetention(
            client,
            ended_jobs_in(sessions),
            streams=self.streams,
            grace_ms=round(s.command_stream_grace * 1000),
        )
        if background:
            gc.freeze()  # what start-up allocated lives as long as the process
            gc.set_threshold(*GC_THRESHOLDS)
            self.gc_pauses = gc_pauses.install()  # GET /metrics: sparkpoint_gc_*
            self._spawn("sparkpoint-ingest", self.consumer.run, self._stop)
            self._spawn("sparkpoint-retention", retention.run, self._stop, s.stream_trim_interval)
            self._spawn("sparkpoint-timers", self._timers)

    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _timers(self) -> None:
        assert self.control_plane is not None
        # The database away (or hanging) is told in one line, as the ingest and the API tell it.
        away = (OperationalError, InterfaceError, PoolTimeoutError)
        failures = FailureStreak("timer tick", log, expected=away)
        while not self._stop.wait(self.settings.tick_ms / 1000):
            try:
                self.control_plane.tick()
            except Exception:  # a tick that fails is retried at the next one
                failures.failed()
            else:
                failures.ended()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        if self.control_plane is not None:
            self.control_plane.close()
        if self._engine is not None:
            self._engine.dispose()
        if self.embedded is not None:
            self.embedded.stop()


def _startup_cause(err: BaseException, redis_url: str, database_url: str) -> str | None:
    """Why the control plane cannot start, in one line, when ``err`` is a reason of Redis or
    the database (None: another error, left as it is)."""
    if isinstance(err, (ConfigurationError, EmbeddedRedisError)):  # their messages say it all
        return str(err)
    if isinstance(err, redis.RedisError):
        where = client_url(redis_client(redis_url)) if redis_url else "the embedded Redis"
        return f"cannot use Redis at {where}: {err}"
    if isinstance(err, SQLAlchemyError):
        why = " ".join(str(getattr(err, "orig", None) or err).split())
        where = make_url(database_url).render_as_string(hide_password=True)
        return f"cannot use the database at {where}: {why}"
    return None


def create_app(settings: Settings, *, runner: Runner | EngineRunner | None = None) -> FastAPI:
    """The FastAPI application of the control plane (started by its lifespan)."""
    runner = runner or Runner(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not runner.started:  # `sparkpoint server` starts it first, to tell a failure in a line
            runner.start()
        assert runner.control_plane is not None
        app.state.control_plane = runner.control_plane
        app.state.session_factory = runner.control_plane.sessions
        app.state.ingest_stats = runner.stats
        # The process under load: the engine's, when the API runs in a process of its own.
        app.state.gc_pauses = runner.gc_pauses
        app.state.redis_url = runner.redis_url
        # Two processes: the engine, whether it runs (GET /healthz, /metrics); one: none.
        app.state.engine = runner if isinstance(runner, EngineRunner) else None
        log.info(
            "control plane ready; jobs connect to Redis at %s",
            client_url(redis_client(runner.redis_url)),  # the URL without its password
        )
        try:
            yield
        finally:
            runner.stop()

    app = FastAPI(
        title="Sparkpoint control plane",
        description=(
            "Checkpoints of PySpark streaming jobs, coordinated the way Apache Flink does it. "
            "Paths and field names follow Flink's REST API. Errors answer "
            '`{"errors": ["<field>: <what is wrong>"]}`: 400 for invalid input (never 422), '
            "401 without a valid token, 403 when its role is below the operation's, 404 for an "
            "unknown job, checkpoint or request, 409 when the job's status does not allow the "
            "request. Calls carry `Authorization: Bearer <token>` of a role: `viewer` (reads, "
            "which need a token only when `SPARKPOINT_PROTECT_READS` is set), `operator` "
            "(mutating calls on jobs), `admin` (`/tokens`, `/audit`; `SPARKPOINT_API_TOKEN` is "
            "the bootstrap admin). Each operation declares the role it needs "
            "(`x-required-role`). Every mutating call is recorded in the audit log."
        ),
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.runner = runner
    install_api(app)
    return app
