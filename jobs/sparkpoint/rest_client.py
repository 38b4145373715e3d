"""A small client of the control plane's REST API, for the ``sparkpoint`` command line.

``sparkpoint list | checkpoint | savepoint | restore | stop | cancel`` mirror Flink's CLI;
``sparkpoint token create | list | revoke`` manage the API tokens (an admin's token). The
API's address comes from ``--api`` or ``SPARKPOINT_API_URL`` (default
``http://127.0.0.1:8081``, Flink's REST port); the token from ``SPARKPOINT_API_TOKEN`` or the
file the server generated in its data directory (:func:`find_api_token`); a 401 says where the
CLI looked and which variable to set.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sparkpoint.errors import SparkpointError

DEFAULT_API_URL = "http://127.0.0.1:8081"


class ApiError(SparkpointError):
    """The control plane answered with an error, or could not be reached."""


#: Where ``sparkpoint server`` keeps its data unless ``SPARKPOINT_DATA_DIR`` says otherwise,
#: then where ``make demo``'s server keeps it (both relative to the current directory).
DEFAULT_DATA_DIRS = (".sparkpoint/server", ".sparkpoint/demo/server")


@dataclass(frozen=True)
class TokenLookup:
    """The API token the CLI found (None: none), where it came from, and where it looked."""

    token: str | None
    source: str | None
    looked: tuple[str, ...]

    def hint(self) -> str:
        """What a 401 adds: where the token came from or was looked for, and what to set."""
        if self.token is not None:
            where = f"the token from {self.source} was refused"
        else:
            where = "no API token found (looked in " + ", ".join(self.looked) + ")"
        return (
            f"{where}; set SPARKPOINT_API_TOKEN to a token of this control plane (`make demo` "
            "prints the export line; `sparkpoint server` writes it to <SPARKPOINT_DATA_DIR>/"
            "api-token), or SPARKPOINT_DATA_DIR to the server's data directory"
        )


def find_api_token() -> TokenLookup:
    """``SPARKPOINT_API_TOKEN``, else the ``api-token`` file that ``sparkpoint server`` wrote
    in ``SPARKPOINT_DATA_DIR`` — or, when that is not set, in :data:`DEFAULT_DATA_DIRS`."""
    token = os.environ.get("SPARKPOINT_API_TOKEN")
    if token:
        return TokenLookup(token, "SPARKPOINT_API_TOKEN", ("SPARKPOINT_API_TOKEN",))
    configured = os.environ.get("SPARKPOINT_DATA_DIR")
    dirs = (configured,) if configured else DEFAULT_DATA_DIRS
    looked = ["SPARKPOINT_API_TOKEN"]
    for data_dir in dirs:
        token_file = Path(data_dir) / "api-token"
        looked.append(str(token_file.absolute()))
        if token_file.is_file():
            return TokenLookup(token_file.read_text().strip(), str(token_file), tuple(looked))
    return TokenLookup(None, None, tuple(looked))


class ControlPlaneClient:
    """Calls the REST API; every error becomes an :class:`ApiError` with the API's message."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
        unauthorized_hint: str | None = None,
    ) -> None:
        self.unauthorized_hint = unauthorized_hint
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
            if response.status_code == 401 and self.unauthorized_hint:
                message = f"{message} ({self.unauthorized_hint})"
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
