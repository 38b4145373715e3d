"""The control plane's settings, read from the environment by :func:`load_settings`."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from sparkpoint_server.errors import SettingsError


class Settings(BaseSettings):
    """``SPARKPOINT_*`` variables, plus ``REDIS_URL`` and ``DATABASE_URL`` as they are."""

    model_config = SettingsConfigDict(env_prefix="SPARKPOINT_", extra="ignore")

    data_dir: Path = Field(default=Path(".sparkpoint/server"))
    api_token: str | None = None
    protect_reads: bool = False  # reads need the token too
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    embedded_redis_port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free port
    stream_prefix: str = Field(default="sparkpoint", pattern=r"^[A-Za-z0-9_.-]+$")
    consumer_name: str = "control-plane"
    ingest_batch: int = Field(default=1000, ge=1, le=100_000)
    tick_ms: int = Field(default=50, ge=5, le=10_000)  # timers: triggers, timeouts, restarts
    default_history: int = Field(default=100, ge=1, le=10_000)

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
        raise SettingsError(f"invalid setting {where}: {first['msg']}") from err
    os.makedirs(settings.data_dir, exist_ok=True)
    return settings
