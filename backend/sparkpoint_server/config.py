"""The control plane's settings, read from the environment by :func:`load_settings`."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sparkpoint.locations import is_relative
from sparkpoint.redis_retry import RETRY_FOR_S
from sparkpoint_server.errors import SettingsError


class Settings(BaseSettings):
    """``SPARKPOINT_*`` variables, plus ``REDIS_URL`` and ``DATABASE_URL`` as they are."""

    model_config = SettingsConfigDict(env_prefix="SPARKPOINT_", extra="ignore")

    data_dir: Path = Field(default=Path(".sparkpoint/server"))
    api_token: str | None = None
    protect_reads: bool = False  # reads need a token (of any role) too
    # The audit log of mutating calls keeps about this many of its newest rows (api/audit.py).
    audit_retention: int = Field(default=100_000, ge=1, le=100_000_000)
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    embedded_redis_port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free port
    stream_prefix: str = Field(default="sparkpoint", pattern=r"^[A-Za-z0-9_.-]+$")
    consumer_name: str = "control-plane"
    ingest_batch: int = Field(default=1000, ge=1, le=100_000)
    # Redis retention: about how many dead letters are kept; how often (seconds) acknowledged
    # events are trimmed and ended jobs' command streams deleted; how long (seconds) an
    # unacknowledged command of an ended job is kept (ingest/command_streams.py).
    dead_letter_maxlen: int = Field(default=100_000, ge=100, le=100_000_000)
    stream_trim_interval: float = Field(default=1.0, gt=0, le=3600)
    command_stream_grace: float = Field(default=300.0, ge=0, le=86_400 * 30)
    # Seconds the control plane keeps the commands Redis does not take (down, failing over)
    # before it gives them up (service/batch.py); the drivers of `sparkpoint run` read the
    # same variable, SPARKPOINT_REDIS_RETRY_WINDOW, for how long they wait an outage out.
    redis_retry_window: float = Field(default=RETRY_FOR_S, gt=0, le=86_400)
    tick_ms: int = Field(default=50, ge=5, le=10_000)  # timers: triggers, timeouts, restarts
    default_history: int = Field(default=100, ge=1, le=10_000)
    # Flink's heartbeat.timeout, in seconds: a connected job whose driver sent no heartbeat
    # for this long fails over (its driver process is gone).
    heartbeat_timeout: float = Field(default=50.0, gt=0, le=86_400)
    # Checkpoint storage: seconds one storage call may take, and where the control plane may
    # read and write (comma-separated URLs or paths; unset: see service/storage_io.py).
    storage_timeout: float = Field(default=30.0, gt=0, le=3600)
    storage_roots: str | None = None
    # The REST API in a process of its own, the coordination in a child (engine_process.py);
    # false: both in one process.
    api_process: bool = True

    @field_validator("storage_roots")
    @classmethod
    def _storage_roots(cls, value: str | None) -> str | None:
        for root in (r.strip() for r in (value or "").split(",")):
            if root and is_relative(root):
                raise ValueError(f"{root!r} is neither an absolute path nor a URL")
            if root.startswith("memory://"):
                raise ValueError(f"{root!r} is in the control plane's memory: no job can read it")
        return value

    @property
    def heartbeat_timeout_ms(self) -> int:
        return max(1, round(self.heartbeat_timeout * 1000))

    @property
    def effective_database_url(self) -> str:
        """``DATABASE_URL``, else a SQLite file under the data directory."""
        if self.database_url:
            return normalize_database_url(self.database_url)
        return f"sqlite:///{(self.data_dir / 'sparkpoint.db').resolve()}"

    @property
    def checkpoint_dir(self) -> Path:
        """Where checkpoints live when a job names no directory of its own."""
        return (self.data_dir / "checkpoints").resolve()

    @property
    def savepoint_dir(self) -> Path:
        """Where savepoints go when a request names no target directory."""
        return (self.data_dir / "savepoints").resolve()


def normalize_database_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` use the psycopg 3 driver that Sparkpoint installs."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def load_settings(**overrides: object) -> Settings:
    """The settings from the environment, with ``overrides`` (tests) on top.

    Raises:
        SettingsError: naming the variable that is invalid.
    """
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        # The variable the user set: a field's alias (REDIS_URL) as it is, else SPARKPOINT_*.
        variable = where if where.isupper() else f"SPARKPOINT_{where.upper()}"
        raise SettingsError(f"invalid setting {variable}: {first['msg']}") from err
    try:
        os.makedirs(settings.data_dir, exist_ok=True)
    except OSError as err:
        raise SettingsError(
            f"invalid setting SPARKPOINT_DATA_DIR: cannot create {settings.data_dir}: "
            f"{err.strerror or err}"
        ) from err
    return settings
