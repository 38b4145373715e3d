"""``sparkpoint status | exceptions | config | restart-strategy JOB``: where a job stands and
what steers it, in the terminal, from the control plane's REST API.

``status`` answers the first questions of someone paged about a job: its status and why it got
there, whether its driver and epochs are alive, its last completed and last failed
checkpoint, what a failover would restore, its restart strategy and its latest failures with
what the strategy decided. ``exceptions`` lists the failures (Flink's exception history);
``config`` and ``restart-strategy`` show a running job's checkpoint configuration and restart
strategy, and change them (Flink's options) when given new values.
"""

from __future__ import annotations

import argparse
from typing import Any

from sparkpoint.checkpointing.restart import format_duration
from sparkpoint.cli_checkpoints import duration_text, failover_text, table, time_text
from sparkpoint.connectors.sources import unanswered_text
from sparkpoint.console import size_text
from sparkpoint.option_parser import seconds

#: Failures ``status`` shows; ``exceptions`` shows more.
STATUS_FAILURES = 3

#: ``config``'s options: the PATCH field each sets, whether it takes a duration, its help.
CONFIG_OPTIONS = {
    "interval": (
        "interval",
        True,
        "between periodic checkpoints, in s or with a unit (500ms, 2min); 0: off",
    ),
    "timeout": ("timeout", True, "before a pending checkpoint expires"),
    "min_pause": ("min_pause", True, "from a checkpoint's end to the next's trigger"),
    "tolerable_failures": (
        "tolerable_failed_checkpoints",
        False,
        "consecutive failed checkpoints tolerated before a failover",
    ),
    "retained": ("retained", False, "completed checkpoints kept"),
}


def millis(text: str) -> int:
    """``config``'s durations, read as ``sparkpoint run`` reads its times (seconds, ``1.5``,
    or a number and a unit, ``500ms``, ``10s``, ``2min``), in milliseconds: ``--timeout 10``
    is 10 s here as ``--checkpoint-timeout 10`` is there.

    Raises:
        argparse.ArgumentTypeError: naming the value that is not such a time, or negative.
    """
    ms = round(seconds(text) * 1000)
    if ms < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: negative")
    return ms


def shown_and_text(client: Any, ns: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """What ``sparkpoint status | exceptions | config | restart-strategy JOB`` fetched (or
    changed), as the API answered it (``--output json``), and its text."""
    job: str = ns.job_id
    if ns.command == "status":
        shown = show_status(client, job)
        return shown, status_lines(shown)
    if ns.command == "exceptions":
        shown = show_exceptions(client, job, ns.limit)
        return shown, exceptions_lines(job, shown)
    if ns.command == "config":
        shown = change_config(client, job, ns)
        return shown, config_lines(job, shown)
    # restart-strategy: show it, or replace it by TYPE [KEY=VALUE ...] (restart_strategy_body)
    path = f"/jobs/{job}/restart-strategy"
    if ns.strategy:
        shown = client.request("PUT", path, json=ns.strategy)
    else:
        shown = client.request("GET", path)
    return shown, restart_strategy_lines(job, shown)


def _ago(now: int, at: int | None) -> str:
    if not at:
        return "never"
    return f"{time_text(at)} UTC ({duration_text(max(0, now - at))} ago)"


# ----------------------------------------------------------------------------- list


def job_list_lines(answer: dict[str, Any], base_url: str) -> list[str]:
    """``sparkpoint list``: one line per job, newest first: its status, attempt and
    restarts, its last finished checkpoint (completed or failed, and when), its records per
    second, its name."""
    jobs = answer["jobs"]
    if not jobs:
        return [f"no jobs: the control plane at {base_url} knows none"]
    rows = []
    for j in jobs:
        last = j.get("last-checkpoint")
        rate = j.get("records-per-second")
        rows.append(
            [
                j["id"],
                j["status"],
                str(j["attempt"]),
                str(j["restarts"]),
                f"{last['id']} {last['status']} {time_text(last['timestamp'])}" if last else "-",
                f"{rate:,.0f}" if rate is not None else "-",
                j["name"],
            ]
        )
    header = ["id", "status", "attempt", "restarts", "last checkpoint (UTC)", "records/s"]
    lines = table([*header, "name"], rows)
    if answer.get("total", len(jobs)) > len(jobs):
        lines.append(f"... and {answer['total'] - len(jobs)} more (the newest are listed)")
    return lines


# ----------------------------------------------------------------------------- status


def show_status(client: Any, job_id: str) -> dict[str, Any]:
    """What ``sparkpoint status`` prints, as the API answered it (``--output json``)."""
    base = f"/jobs/{job_id}"
    return {
        "job": client.request("GET", base),
        "checkpoints": client.request("GET", f"{base}/checkpoints", params={"limit": 1}),
        "exceptions": client.request(
            "GET", f"{base}/exceptions", params={"limit": STATUS_FAILURES}
        )["exceptionHistory"],
        "restart_strategy": client.request("GET", f"{base}/restart-strategy"),
    }


def status_lines(shown: dict[str, Any]) -> list[str]:
    """The text of what :func:`show_status` fetched."""
    job, stats = shown["job"], shown["checkpoints"]
    now = job["now"]
    lines = [
        f"job {job['jid']} ({job['name']}): {job['state']}, attempt {job['attempt']}, "
        f"{job['restarts']} restart{'' if job['restarts'] == 1 else 's'}; started "
        f"{_ago(now, job['start-time'])}"
    ]
    history = job["status-history"]
    if history:
        last = history[-1]
        cause = f": {last['cause']}" if last.get("cause") else ""
        lines.append(f"{last['status']} since {_ago(now, last['timestamp'])}{cause}")
    lines += _liveness(job, now)
    lines += _checkpoint_lines(job["jid"], stats, now)
    lines.append(f"restart strategy: {shown['restart_strategy']['description']}")
    guarantee = job.get("guarantee")
    if guarantee:
        why = f" ({guarantee['reason']})" if guarantee.get("reason") else ""
        lines.append(f"guarantee: {guarantee['level'].replace('_', '-')}{why}")
    spark = job.get("spark") or {}
    if spark.get("ui-url") or spark.get("application-id"):
        lines.append(
            f"Spark: application {spark.get('application-id') or '-'}, UI "
            f"{spark.get('ui-url') or '-'}"
        )
    entries = shown["exceptions"]["entries"]
    if not entries:
        return [*lines, "no failure recorded"]
    more = ", older ones: sparkpoint exceptions" if shown["exceptions"]["truncated"] else ""
    lines.append(f"latest failures, newest first{more}:")
    return lines + [f"  {line}" for line in failure_lines(entries)]


def _liveness(job: dict[str, Any], now: int) -> list[str]:
    """The latest epoch's heartbeat and the driver's."""
    throughput, driver = job["throughput"], job.get("driver") or {}
    rate, lag = throughput.get("records-per-second"), throughput.get("source-lag")
    unanswered = throughput.get("unanswered-splits") or []
    line = f"records read: {throughput['records']:,}"
    if not throughput.get("last-heartbeat"):
        line += "; no epoch has ended yet"
    else:
        if rate is not None:
            line += f", {rate:,.0f} records/s in the latest epoch"
        if unanswered:
            line += f", source lag unknown ({unanswered_text(unanswered)} not answer)"
        elif lag is not None:
            line += f", source lag {lag:,.0f}"
        line += f"; latest epoch ended {_ago(now, throughput['last-heartbeat'])}"
        if throughput.get("epoch-bound") is not None:
            bound = throughput["epoch-bound"] / 1000
            line += f", held within {bound:g} s by the checkpoint timeout"
    lines = [line]
    if job.get("state") == "RUNNING" and driver.get("first-epoch-ended") is False:
        lines.append(
            f"attempt {job['attempt']}'s first epoch (Spark's start-up) has not ended: "
            "periodic checkpoints start when it has"
        )
    if driver.get("heartbeat-interval"):
        lines.append(
            f"driver heartbeat: every {format_duration(driver['heartbeat-interval'])}, latest "
            f"{_ago(now, driver.get('last-heartbeat'))}"
        )
    return lines


def _checkpoint_lines(job_id: str, stats: dict[str, Any], now: int) -> list[str]:
    counts, latest = stats["counts"], stats["latest"]
    lines = [
        f"checkpoints: {counts['total']} ({counts['completed']} completed, {counts['failed']} "
        f"failed, {counts['in_progress']} in progress)"
    ]
    newest = (stats.get("history") or [None])[0]
    if newest and newest["status"] == "IN_PROGRESS":  # what a stuck checkpoint waits for
        kind = "savepoint" if newest.get("is_savepoint") else "checkpoint"
        lines.append(
            f"in progress: {kind} {newest['id']}, triggered "
            f"{_ago(now, newest['trigger_timestamp'])}, {newest['num_acknowledged_subtasks']}/"
            f"{newest['num_subtasks']} subtasks acknowledged (which: sparkpoint checkpoints "
            f"{job_id} --id {newest['id']})"
        )
    for label, entry in (
        ("latest completed", latest.get("completed")),
        ("latest savepoint", latest.get("savepoint")),
    ):
        if entry:
            took = entry.get("end_to_end_duration")
            parts = [
                str(entry["id"]),
                _ago(now, entry["trigger_timestamp"]),
                f"{duration_text(took)} end to end",
                size_text(entry.get("state_size") or 0),
                *([entry["external_path"]] if entry.get("external_path") else []),
            ]
            lines.append(f"{label}: {', '.join(parts)}")
    failed = latest.get("failed")
    if failed:
        lines.append(
            f"latest failed: {failed['id']}, "
            f"{_ago(now, failed.get('failure_timestamp') or failed['trigger_timestamp'])}: "
            f"{failed.get('failure_message') or failed.get('failure_reason') or 'no message'}"
        )
    if latest.get("failover"):
        lines.append(f"a failover restores: {failover_text(latest['failover'])}")
    return lines


# ----------------------------------------------------------------------------- exceptions


def failure_lines(entries: list[dict[str, Any]]) -> list[str]:
    """One line per failure of an exception history, as given (newest first): when, which
    attempt, epoch and subtask, its kind and cause, and what the restart strategy did."""
    out = []
    for e in entries:
        cause = e["stacktrace"] or ""
        where = [f"attempt {e['attempt']}"] if e.get("attempt") is not None else []
        if e.get("epoch") is not None and f"epoch {e['epoch']} " not in cause:
            where.append(f"epoch {e['epoch']}")
        if e.get("taskName") and e["taskName"] not in cause:  # the cause names them already
            where.append(e["taskName"])
        action = f" -> {e['action']}" if e.get("action") else ""
        out.append(
            f"{time_text(e['timestamp'])} UTC  {', '.join(where)}  {e['exceptionName']}: "
            f"{cause}{action}"
        )
    return out


def show_exceptions(client: Any, job_id: str, limit: int) -> dict[str, Any]:
    """``sparkpoint exceptions``: the newest ``limit`` failures (Flink's exception history)."""
    answer = client.request("GET", f"/jobs/{job_id}/exceptions", params={"limit": limit})
    history: dict[str, Any] = answer["exceptionHistory"]
    return history


def exceptions_lines(job_id: str, history: dict[str, Any]) -> list[str]:
    entries = history["entries"]
    if not entries:
        return [f"job {job_id}: no failure recorded"]
    older = "; older ones exist (--limit)" if history["truncated"] else ""
    count = f"{len(entries)} failure{'' if len(entries) == 1 else 's'}"
    return [f"job {job_id}: {count}, newest first{older}", *failure_lines(entries)]


# ----------------------------------------------------------------------------- steering


def change_config(client: Any, job_id: str, ns: argparse.Namespace) -> dict[str, Any]:
    """``sparkpoint config``: the checkpoint configuration, changed first by the options
    given (they apply from the next trigger)."""
    patch = {
        field: getattr(ns, option)
        for option, (field, _, _) in CONFIG_OPTIONS.items()
        if getattr(ns, option) is not None
    }
    path = f"/jobs/{job_id}/checkpoints/config"
    answer: dict[str, Any] = (
        client.request("PATCH", path, json=patch) if patch else client.request("GET", path)
    )
    return answer


def config_lines(job_id: str, config: dict[str, Any]) -> list[str]:
    interval = config["interval"]
    lines = [
        f"job {job_id}: checkpoints {config['mode'].replace('_', '-').lower()}, "
        + (f"every {format_duration(interval)}" if interval else "periodic ones off"),
        f"timeout {format_duration(config['timeout'])}, minimum pause "
        f"{format_duration(config['min_pause'])}, at most {config['max_concurrent']} at once, "
        f"{config['tolerable_failed_checkpoints']} tolerable failures, {config['retained']} "
        "retained",
        f"state backend {config.get('state_backend') or '-'}"
        + (" (incremental)" if config.get("incremental") else "")
        + f", storage {config.get('checkpoint_storage') or '-'} "
        f"{config.get('checkpoint_dir') or ''}".rstrip(),
        "changeable while it runs: " + ", ".join(config["changeable"]),
    ]
    return lines


def restart_strategy_body(pairs: list[str]) -> dict[str, str]:
    """``TYPE [KEY=VALUE ...]`` as Flink's options: a key without the ``restart-strategy.``
    prefix is one of TYPE's own (``attempts=3`` of fixed-delay is
    ``restart-strategy.fixed-delay.attempts``).

    Raises:
        argparse.ArgumentTypeError: a pair has no ``=``.
    """
    kind, *options = pairs
    body = {"restart-strategy.type": kind}
    for pair in options:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(
                f"{pair!r} is not KEY=VALUE (attempts=3; quote a value with spaces: delay='10 s')"
            )
        if not key.startswith("restart-strategy."):
            key = f"restart-strategy.{kind.lower()}.{key}"
        body[key] = value
    return body


def restart_strategy_lines(job_id: str, answer: dict[str, Any]) -> list[str]:
    options = [f"  {k}: {v}" for k, v in sorted(answer.items()) if k != "description"]
    return [f"job {job_id}: restart strategy {answer['description']}", *options]
