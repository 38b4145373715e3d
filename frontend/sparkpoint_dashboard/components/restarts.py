"""The rows of "Failures and restarts" that are not failures: the restores an operator
requested (``GET /jobs/{id}/restores``) and restarts the status history shows without a
failure or a restore behind them.

Flink's exception history lists failures only; here the job's restart count includes the
restores a user asked for, so the table lists them too, each as a restore (never as the
failover that aborted the checkpoints in flight).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.units import DASH, fmt_time

RESTORE_KIND = "RESTORE (requested)"
RESTART_KIND = "RESTART"
#: A RESTARTING transition this close (ms) to a failure or a restore is that one's restart.
MATCH_WINDOW_MS = 5_000


def fetch_restores(client: ApiClient, job_id: str, token: str | None) -> dict[str, Any]:
    """``GET /jobs/{id}/restores`` (raises the client's errors)."""
    answer = client.call("GET", f"/jobs/{quote(job_id, safe='')}/restores", token)
    return answer if isinstance(answer, dict) else {}


def what_restored(restore: dict[str, Any]) -> str:
    """``"savepoint 4 at file:///…"`` or ``"checkpoint 12"`` from a restore's location."""
    location = restore.get("location") or ""
    number = restore.get("checkpoint-id")
    if "savepoint" in location.rsplit("/", 1)[-1]:
        return f"savepoint {number} at {location}"
    return f"checkpoint {number}" + (f" at {location}" if location else "")


def restore_outcome(restore: dict[str, Any]) -> str:
    """What became of a restore request, in words."""
    status = restore.get("status")
    if status == "COMPLETED":
        attempt = restore.get("attempt")
        return f"restored: the job runs again as attempt {attempt}" if attempt else "restored"
    if status == "FAILED":
        return f"restore failed: {restore.get('failure-cause') or 'no cause given'}"
    return "restoring…"


def restore_rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The restores of ``GET /jobs/{id}/restores`` as rows of the failures table."""
    rows = []
    for r in answer.get("restores") or []:
        at = r.get("requested-at")
        attempt = r.get("attempt")
        rows.append(
            {
                "id": f"restore-{r.get('request-id')}",
                "timestamp": at,
                "time": fmt_time(at),
                "attempt": attempt - 1 if isinstance(attempt, int) else None,
                "kind": RESTORE_KIND,
                "task": "the operator",
                "epoch": None,
                "cause": f"restore of {what_restored(r)} requested (request {r.get('request-id')})",
                "decision": restore_outcome(r),
                "restore": True,
            }
        )
    return rows


def unexplained_restarts(
    job: dict[str, Any], explained: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """RESTARTING transitions with neither a failure nor a restore within
    :data:`MATCH_WINDOW_MS` before them (a restart after a control-plane failover, say)."""
    times = [int(r["timestamp"]) for r in explained if r.get("timestamp") is not None]
    rows = []
    for h in job.get("status-history") or []:
        if h.get("status") != "RESTARTING":
            continue
        at = int(h.get("timestamp") or 0)
        if any(0 <= at - t <= MATCH_WINDOW_MS for t in times):
            continue
        rows.append(
            {
                "id": f"restart-{at}",
                "timestamp": at,
                "time": fmt_time(at),
                "attempt": h.get("attempt"),
                "kind": RESTART_KIND,
                "task": "the job",
                "epoch": None,
                "cause": h.get("cause") or DASH,
                "decision": "restart",
            }
        )
    return rows


def failures_and_restarts(
    job: dict[str, Any] | None,
    failures: list[dict[str, Any]],
    restores: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The table's rows, newest first: failures, requested restores and other restarts."""
    rows = [*failures, *restores]
    if job is not None:
        rows += unexplained_restarts(job, rows)
    return sorted(rows, key=lambda r: -(r.get("timestamp") or 0))
