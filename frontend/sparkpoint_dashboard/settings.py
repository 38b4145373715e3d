"""The dashboard's settings, from the environment (``SPARKPOINT_API_URL`` and friends)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_API_URL = "http://127.0.0.1:8081"


class DashboardSettings(BaseSettings):
    """Where the control plane's REST API is and how often pages refresh."""

    model_config = SettingsConfigDict(env_prefix="SPARKPOINT_", extra="ignore")

    api_url: str = Field(
        default=DEFAULT_API_URL, description="The control plane's REST API (SPARKPOINT_API_URL)."
    )
    dashboard_refresh_ms: int = Field(
        default=2000, ge=250, le=600_000, description="How often pages refresh while open."
    )
    dashboard_api_timeout_s: float = Field(
        default=5.0, gt=0, le=120, description="Timeout of one call to the REST API."
    )
    dashboard_spark_ui_hosts: str = Field(
        default="",
        description="Comma-separated hosts besides loopback whose Spark UI the dashboard's "
        "server may ask (a job reports its Spark UI's address itself).",
    )

    @property
    def spark_ui_hosts(self) -> list[str]:
        """``dashboard_spark_ui_hosts`` as a list."""
        return [h.strip() for h in self.dashboard_spark_ui_hosts.split(",") if h.strip()]

    @field_validator("api_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value


def load_settings(**overrides: object) -> DashboardSettings:
    """The settings from the environment, with ``overrides`` (for the CLI and tests)."""
    return DashboardSettings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
