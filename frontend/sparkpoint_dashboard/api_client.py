"""The dashboard's only way to the control plane: its REST API, over HTTP.

Every call returns the decoded JSON answer or raises :class:`ApiUnreachableError` (no answer:
the banner shows it) or :class:`ApiRequestError` (an answer with a 4xx/5xx status: the message
the API gave, which names the field, job or checkpoint).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx


class DashboardError(Exception):
    """Root of the dashboard's errors."""


class ApiUnreachableError(DashboardError):
    """The control plane did not answer (down, wrong address, timeout)."""


class ApiRequestError(DashboardError):
    """The control plane answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


OPERATION_KINDS = ("checkpoints", "savepoints", "stop", "restore")


def _job(job_id: str) -> str:
    return f"/jobs/{quote(job_id, safe='')}"


class ApiClient:
    """A thin synchronous client of the REST API (one per dashboard process; thread-safe)."""

    def __init__(
        self, base_url: str, timeout_s: float = 5.0, http: httpx.Client | None = None
    ) -> None:
        """``http``: an httpx client to send through (tests pass the control plane's
        ``TestClient``); by default one of its own for ``base_url``."""
        self.base_url = base_url.rstrip("/")
        self._http = http or httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {token.strip()}"} if token and token.strip() else {}
        try:
            response = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as err:
            raise ApiUnreachableError(
                f"cannot reach the control plane at {self.base_url}: {err or type(err).__name__}"
            ) from err
        if response.status_code >= 400:
            try:
                errors = response.json().get("errors")
                message = "; ".join(str(e) for e in errors) if errors else response.text
            except (ValueError, AttributeError):
                message = response.text or response.reason_phrase
            raise ApiRequestError(response.status_code, message)
        return response.json() if response.content else None

    # Reads (a token only when the control plane protects reads).

    def health(self) -> Any:
        return self.call("GET", "/healthz")

    def jobs(self, token: str | None = None) -> list[dict[str, Any]]:
        return list(self.call("GET", "/jobs", token)["jobs"])

    def job(self, job_id: str, token: str | None = None) -> dict[str, Any]:
        return dict(self.call("GET", _job(job_id), token))

    def throughput(self, job_id: str, limit: int = 300, token: str | None = None) -> Any:
        return self.call(
            "GET", f"{_job(job_id)}/metrics/throughput", token, params={"limit": limit}
        )

    def exceptions(self, job_id: str, token: str | None = None) -> dict[str, Any]:
        return dict(self.call("GET", f"{_job(job_id)}/exceptions", token))

    def checkpoints(
        self, job_id: str, limit: int = 200, token: str | None = None
    ) -> dict[str, Any]:
        return dict(self.call("GET", f"{_job(job_id)}/checkpoints", token, params={"limit": limit}))

    def checkpoint(
        self, job_id: str, checkpoint_id: int, token: str | None = None
    ) -> dict[str, Any]:
        path = f"{_job(job_id)}/checkpoints/details/{checkpoint_id}"
        return dict(self.call("GET", path, token))

    def operator_timelines(
        self, job_id: str, limit: int = 100, token: str | None = None
    ) -> dict[str, Any]:
        """Each operator's statistics over the job's newest ``limit`` checkpoints."""
        path = f"{_job(job_id)}/checkpoints/operators"
        return dict(self.call("GET", path, token, params={"limit": limit}))

    def subtasks(
        self, job_id: str, checkpoint_id: int, operator_id: str, token: str | None = None
    ) -> dict[str, Any]:
        path = (
            f"{_job(job_id)}/checkpoints/details/{checkpoint_id}/subtasks/"
            f"{quote(operator_id, safe='')}"
        )
        return dict(self.call("GET", path, token))

    def checkpoint_config(self, job_id: str, token: str | None = None) -> dict[str, Any]:
        return dict(self.call("GET", f"{_job(job_id)}/checkpoints/config", token))

    def restart_strategy(self, job_id: str, token: str | None = None) -> dict[str, Any]:
        return dict(self.call("GET", f"{_job(job_id)}/restart-strategy", token))

    def operation(self, job_id: str, kind: str, request_id: str, token: str | None) -> Any:
        if kind not in OPERATION_KINDS:
            raise ValueError(f"unknown operation kind {kind!r}; one of {OPERATION_KINDS}")
        return self.call("GET", f"{_job(job_id)}/{kind}/{quote(request_id, safe='')}", token)

    def audit(self, token: str | None, limit: int = 200, job: str | None = None) -> Any:
        """The audit log, newest first (an admin's token)."""
        params: dict[str, Any] = {"limit": limit, **({"job": job} if job else {})}
        return self.call("GET", "/audit", token, params=params)

    # Actions (always with the operator's token).

    def trigger_checkpoint(self, job_id: str, token: str) -> Any:
        return self.call("POST", f"{_job(job_id)}/checkpoints", token, json={})

    def trigger_savepoint(self, job_id: str, target: str | None, token: str) -> Any:
        body = {"target-directory": target} if target else {}
        return self.call("POST", f"{_job(job_id)}/savepoints", token, json=body)

    def dispose_savepoint(self, location: str, token: str) -> Any:
        return self.call("POST", "/savepoint-disposal", token, json={"savepoint-path": location})

    def stop_with_savepoint(self, job_id: str, target: str | None, token: str) -> Any:
        body = {"targetDirectory": target} if target else {}
        return self.call("POST", f"{_job(job_id)}/stop", token, json=body)

    def restore(
        self,
        job_id: str,
        token: str,
        checkpoint_id: int | None = None,
        savepoint_path: str | None = None,
    ) -> Any:
        body: dict[str, Any] = (
            {"checkpoint_id": checkpoint_id}
            if checkpoint_id is not None
            else {"savepoint_path": savepoint_path}
        )
        return self.call("POST", f"{_job(job_id)}/restore", token, json=body)

    def cancel(self, job_id: str, token: str) -> Any:
        return self.call("PATCH", _job(job_id), token, params={"mode": "cancel"})

    def patch_checkpoint_config(self, job_id: str, changes: dict[str, Any], token: str) -> Any:
        return self.call("PATCH", f"{_job(job_id)}/checkpoints/config", token, json=changes)

    def put_restart_strategy(self, job_id: str, conf: dict[str, Any], token: str) -> Any:
        return self.call("PUT", f"{_job(job_id)}/restart-strategy", token, json=conf)
