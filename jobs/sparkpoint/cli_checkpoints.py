"""``sparkpoint checkpoints JOB``: a job's checkpoint history in the terminal, from the control
plane's REST API (Flink's ``/jobs/:jobid/checkpoints``), and with ``--id N`` one checkpoint
operator by operator and subtask by subtask: which subtasks acknowledged, when, how long
their phases took, what they held back while aligning; for a checkpoint that failed, its
reason and the subtasks that never acknowledged (why checkpoint 4127 expired).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sparkpoint.console import size_text


def time_text(ms: int | None) -> str:
    """A wall-clock time in ms as ``YYYY-MM-DD HH:MM:SS`` (UTC); ``-`` for None."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration_text(ms: float | None) -> str:
    """``41 ms``, ``12.5 s``, ``14 min``, ``3.2 h``; ``-`` for None."""
    if ms is None:
        return "-"
    if ms < 10_000:
        return f"{ms:,.0f} ms"
    if ms < 120_000:
        return f"{ms / 1000:,.1f} s"
    return f"{ms / 60_000:,.0f} min" if ms < 7_200_000 else f"{ms / 3_600_000:,.1f} h"


def _size(size: int | None) -> str:
    return "-" if size is None else size_text(size)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns as wide as their widest cell, the last one left as it is."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return [
        "  ".join(
            [*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]
        ).rstrip()
        for row in [header, *rows]
    ]


def history_lines(job: dict[str, Any], stats: dict[str, Any]) -> list[str]:
    """The job, its counts, the latest restore, and one line per checkpoint, newest first."""
    counts = stats["counts"]
    lines = [
        f"job {job['jid']} ({job['name']}) {job['state']}, attempt {job['attempt']}: "
        f"{counts['total']} checkpoints ({counts['completed']} completed, {counts['failed']} "
        f"failed, {counts['in_progress']} in progress), {counts['restored']} restores"
    ]
    latest = stats.get("latest") or {}
    restored = latest.get("restored")
    if restored:
        at = f"{time_text(restored.get('restore_timestamp'))} UTC"
        if restored.get("id") is None and not restored.get("external_path"):
            lines.append(f"latest start: from the beginning at {at}")
        else:
            what = "savepoint" if restored.get("is_savepoint") else "checkpoint"
            where = restored.get("external_path") or "inline state"
            lines.append(f"latest restore: {what} {restored.get('id')} ({where}) at {at}")
    if latest.get("failover"):
        lines.append(f"a failover restores: {failover_text(latest['failover'])}")
    for kept in latest.get("origin_of") or []:
        lines.append(
            f"other jobs' restore point: {_kind(kept)} {kept['id']}: {', '.join(kept['jobs'])} "
            "would restore it in a failover (kept until they have a checkpoint of their own)"
        )
    rows = [
        [
            str(h["id"]),
            h["status"],
            "savepoint" if h["is_savepoint"] else "checkpoint",
            str(h["attempt"]),
            time_text(h["trigger_timestamp"]),
            duration_text(_took(h)),
            _size(h["state_size"]),
            f"{h['num_acknowledged_subtasks']}/{h['num_subtasks']}",
            h.get("failure_message") or ("discarded" if h.get("discarded") else ""),
        ]
        for h in stats["history"]
    ]
    if not rows:
        return [*lines, "no checkpoint yet"]
    header = ["id", "status", "kind", "attempt", "triggered (UTC)", "duration", "size", "acks"]
    return [*lines, *table([*header, "failure"], rows)]


def _took(entry: dict[str, Any]) -> float | None:
    """A history entry's end-to-end duration; a failed one's: from its trigger to its failure."""
    if entry["end_to_end_duration"] is not None or entry.get("failure_timestamp") is None:
        return entry["end_to_end_duration"]
    return max(0, entry["failure_timestamp"] - entry["trigger_timestamp"])


def failover_text(failover: dict[str, Any]) -> str:
    """``latest.failover`` in a line: the checkpoint, and what a restore went back past."""
    target = failover.get("id")
    if target is None:
        text = "the beginning (no checkpoint retained yet)"
    elif failover.get("is_savepoint") is None:  # the line's origin, by its path
        text = f"checkpoint {target} at {failover.get('external_path')} (where its line started)"
    else:
        text = f"{'savepoint' if failover.get('is_savepoint') else 'checkpoint'} {target}"
    passed = failover.get("passed_over") or []
    if passed:
        text += f"; not {', '.join(map(str, passed))}: a restore went back past them"
    return text


def details_lines(
    job_id: str, details: dict[str, Any], operators: list[dict[str, Any]]
) -> list[str]:
    """One checkpoint: its summary, its failure, then each operator's subtasks."""
    kind = "savepoint" if details["is_savepoint"] else "checkpoint"
    took, failed = details["end_to_end_duration"], details.get("failure_timestamp") is not None
    lines = [
        f"{kind} {details['id']} of job {job_id}: {details['status']}, attempt "
        f"{details['attempt']}, triggered {time_text(details['trigger_timestamp'])} UTC, "
        f"{details['num_acknowledged_subtasks']}/{details['num_subtasks']} subtasks "
        "acknowledged"
        + (f", {duration_text(took)} end to end" if took is not None else "")
        + (
            f", failed {duration_text(_took(details))} after the trigger"
            if failed and took is None
            else ""
        )
        + f", state {_size(details['state_size'])} ({_size(details['checkpointed_size'])} "
        "uploaded)"
    ]
    if details.get("external_path"):
        lines.append(f"location: {details['external_path']}")
    if details.get("failure_message"):
        lines.append(f"failure: {details['failure_message']}")
    for op in operators:
        missing = [str(s["index"]) for s in op["subtasks"] if s["status"] != "completed"]
        waiting = f"; not acknowledged: subtask {', '.join(missing)}" if missing else ""
        lines.append(
            f"operator {op['id']}: {op['num_acknowledged_subtasks']}/{op['num_subtasks']} "
            f"acknowledged{waiting}"
        )
        rows = [
            [
                str(s["index"]),
                s["status"],
                time_text(s["ack_timestamp"]),
                duration_text(s["end_to_end_duration"]),
                duration_text(s["start_delay"]),
                duration_text(s["alignment"].get("duration")),
                duration_text(s["checkpoint"].get("sync")),
                duration_text(s["checkpoint"].get("async")),
                _size(s["state_size"]),
                s.get("declined_reason") or "",
            ]
            for s in op["subtasks"]
        ]
        header = ["  subtask", "status", "acknowledged (UTC)", "end to end", "start delay"]
        header += ["alignment", "sync", "async", "state", "declined"]
        rows = [[f"  {r[0]}", *r[1:]] for r in rows]
        lines += table(header, rows)
    return lines


def show(client: Any, job_id: str, checkpoint_id: int | None, limit: int) -> dict[str, Any]:
    """What ``sparkpoint checkpoints`` prints, as the API answered it (``--output json``)."""
    if checkpoint_id is None:
        job = client.request("GET", f"/jobs/{job_id}")
        stats = client.request("GET", f"/jobs/{job_id}/checkpoints", params={"limit": limit})
        return {"job": job, "checkpoints": stats}
    base = f"/jobs/{job_id}/checkpoints/details/{checkpoint_id}"
    details = client.request("GET", base)
    operators = [client.request("GET", f"{base}/subtasks/{op}") for op in details["tasks"]]
    return {"details": details, "operators": operators}


def lines(job_id: str, shown: dict[str, Any]) -> list[str]:
    """The text of what :func:`show` fetched."""
    if "details" in shown:
        return details_lines(job_id, shown["details"], shown["operators"])
    return history_lines(shown["job"], shown["checkpoints"])


def _kind(entry: dict[str, Any]) -> str:
    return "savepoint" if entry.get("is_savepoint") else "checkpoint"
