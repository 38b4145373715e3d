"""A small client of the control plane's REST API, for the ``sparkpoint`` command line.

``sparkpoint list | checkpoint | savepoint | restore | stop | cancel`` mirror Flink's CLI. The
API's address comes from ``--api`` or ``SPARKPOINT_API_URL`` (default
``http://127.0.0.1:8081``, Flink's REST port); the token from ``SPARKPOINT_API_TOKEN`` or the
file the server generated in its data directory.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from sparkpoint.errors import SparkpointError

DEFAULT_API_URL = "http://127.0.0.1:8081"


class ApiError(SparkpointError):
    """The control plane answered with an error, or could not be reached."""


def api_token(data_dir: str | None = None) -> str | None:
    """``SPARKPOINT_API_TOKEN``, else the token ``sparkpoint server`` generated."""
    token = os.environ.get("SPARKPOINT_API_TOKEN")
    if token:
        return token
    path = Path(data_dir or os.environ.get("SPARKPOINT_DATA_DIR", ".sparkpoint/server"))
    token_file = path / "api-token"
    return token_file.read_text().strip() if token_file.is_file() else None


class ControlPlaneClient:
    """Calls the REST API; every error becomes an :class:`ApiError` with the API's message."""

    def __init__(
        self, base_url: str | None = None, token: str | None = None, timeout_s: float = 10.0
    ) -> None:
        self.base_url = (
            base_url or os.environ.get("SPARKPOINT_API_URL") or DEFAULT_API_URL
        ).rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise ApiError(f"cannot reach the control plane at {self.base_url}: {err}") from err
        if response.status_code >= 400:
            try:
                message = "; ".join(response.json().get("errors", [])) or response.text
            except ValueError:
                message = response.text
            raise ApiError(f"{method} {path}: HTTP {response.status_code}: {message}")
        return response.json() if response.content else None

    def wait(self, path: str, timeout_s: float = 120.0) -> dict[str, Any]:
        """Poll an asynchronous operation until it is no longer IN_PROGRESS."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.request("GET", path)
            if status["status"]["id"] != "IN_PROGRESS":
                return dict(status)
            if time.monotonic() > deadline:
                raise ApiError(f"{path} still in progress after {timeout_s:g} s")
            time.sleep(0.2)
