"""The job page's cards: status, uptime, attempt, restarts, throughput, records, source lag,
the driver's heartbeat and the latest checkpoint, each a value with a line of detail."""

from __future__ import annotations

from typing import Any

from dash import html

from sparkpoint.checkpointing.pending import CheckpointFailureReason as Reason
from sparkpoint.connectors.sources import unanswered_text
from sparkpoint_dashboard.components.widgets import stat
from sparkpoint_dashboard.theme import status_color
from sparkpoint_dashboard.units import DASH, fmt_age, fmt_count, fmt_ms, fmt_rate, fmt_time

CHECKPOINTS_LIMIT = 100  # the newest checkpoints read for the failures since the last completed
CAUSE_CHARS = 200  # of a failure's message on a card (all of it on hover)
# Failure reasons of checkpoints that the job's own lifecycle aborted.
ABORTED_BY_THE_JOB = frozenset(
    r.value
    for r in (
        Reason.CHECKPOINT_COORDINATOR_SHUTDOWN,
        Reason.CHECKPOINT_COORDINATOR_SUSPEND,
        Reason.CHECKPOINT_SUBSUMED,
        Reason.CHECKPOINT_DECLINED_SUBSUMED,
        Reason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM,
        Reason.CHECKPOINT_DECLINED_TASK_CLOSING,
        Reason.JOB_FAILOVER_REGION,
        Reason.JOB_FAILURE,
        Reason.TASK_FAILURE,
        Reason.PERIODIC_SCHEDULER_SHUTDOWN,
    )
)
TERMINAL = {"FINISHED", "FAILED", "CANCELED"}


def clock(ms: int | None) -> str:
    """A time of day in UTC: ``"02:21:59 UTC"`` (the cards are narrow)."""
    return f"{fmt_time(ms)[11:19]} UTC" if ms and ms > 0 else DASH


def records_total(job: dict[str, Any]) -> tuple[str, str]:
    """The "records" card: what the sources read over every attempt (replays count again), the
    number the job's own summary prints when it ends, written out in full as it does."""
    total = (job.get("throughput") or {}).get("records")
    detail = "all attempts" if job.get("state") in TERMINAL else "since the job started"
    return (f"{fmt_count(total)} records" if total is not None else DASH), detail


def throughput_detail(job: dict[str, Any]) -> str:
    """The "throughput" card's line: the last epoch's, and when the planner held that epoch
    back so that checkpoints complete within their timeout, how far (why a job catching up
    reads no more)."""
    state = job.get("state") or "UNKNOWN"
    if state in TERMINAL:
        return f"the job is {state}"
    bound = (job.get("throughput") or {}).get("epoch-bound")
    if bound is None:
        return "last epoch"
    return f"last epoch, held within {fmt_ms(bound)} by the checkpoint timeout"


def source_lag(job: dict[str, Any]) -> tuple[str, str]:
    """The "source lag" card: records the sources hold and have not read yet, while the job
    runs; an ended job reads nothing more, so its last lag would mislead. While a split's
    source does not answer (its Redis is down) the lag is unknown, and the card says which."""
    state = job.get("state") or "UNKNOWN"
    if state in TERMINAL:
        return DASH, f"the job is {state}"
    throughput = job.get("throughput") or {}
    unanswered = throughput.get("unanswered-splits") or []
    if unanswered:  # their records cannot be counted: a lag of the others would mislead
        return "unknown", f"{unanswered_text(unanswered)} not answer"
    lag = throughput.get("source-lag")
    return (f"{fmt_count(lag)} records" if lag is not None else DASH), "not read yet"


def job_cards(job: dict[str, Any], samples: list[dict[str, Any]]) -> list[html.Div]:
    """Status, uptime, attempt, restarts, records/s, records, source lag, heartbeat age
    (:func:`heartbeat_card`)."""
    state = job.get("state") or "UNKNOWN"
    now = int(job.get("now") or 0)
    history = job.get("status-history") or []
    since = history[-1]["timestamp"] if history else None
    throughput = job.get("throughput") or {}
    running = state not in TERMINAL
    rate = throughput.get("records-per-second")
    heartbeat = throughput.get("last-heartbeat")
    restarts = [h for h in history if h.get("status") == "RESTARTING"]
    total, total_detail = records_total(job)
    return [
        stat(
            "Status",
            html.Span(state, style={"color": status_color(state)}),
            f"since {clock(since)}" if since else None,
        ),
        stat("Uptime", fmt_ms(job.get("duration")), f"started {clock(job.get('start-time'))}"),
        stat("Attempt", fmt_count(job.get("attempt")), "restores count too"),
        stat(
            "Restarts",
            fmt_count(job.get("restarts")),
            f"last: {fmt_age(now, restarts[-1]['timestamp'])}" if restarts else "none",
        ),
        stat("Throughput", fmt_rate(rate) if running else DASH, throughput_detail(job)),
        stat("Records", total, total_detail),
        stat("Source lag", *source_lag(job)),
        heartbeat_card(job, now, heartbeat),
    ]


def heartbeat_card(job: dict[str, Any], now: int, epoch: int | None) -> html.Div:
    """The driver's liveness heartbeat (sent every interval while its process lives, Flink's
    TaskManager heartbeat) with the last epoch's age beside it: a driver that restarts its
    job, or waits on a quiet source, runs no epoch but is alive. A driver that sends none:
    the last epoch's heartbeat."""
    alive = (job.get("driver") or {}).get("last-heartbeat")
    if alive is None:
        return stat("Last heartbeat", fmt_age(now, epoch), clock(epoch))
    last_epoch = f"last epoch {fmt_age(now, epoch)}" if epoch is not None else "no epoch yet"
    return stat("Last heartbeat", fmt_age(now, alive), f"{clock(alive)} · {last_epoch}")


def checkpoints_card(answer: Any, now: int, job: dict[str, Any]) -> html.Div:
    """Whether checkpoints complete, from ``GET /jobs/{id}/checkpoints``: the latest completed
    one's age and id; when periodic checkpoints failed since, how many and why (the newest
    one's message), in red: what the checkpoints page says, on the page a job opens at. A failed
    savepoint, or a checkpoint that the job's own cancel, failover or restore aborted, is no
    sign that checkpoints stopped completing and is not counted. While the running attempt's
    first epoch has not ended (``job``'s ``driver``), periodic checkpoints wait: it says so."""
    if not isinstance(answer, dict):
        return stat("Last checkpoint", DASH, "not read")
    done = (answer.get("latest") or {}).get("completed")
    done_id = int(done["id"]) if done else 0
    value = fmt_age(now, done.get("latest_ack_timestamp")) if done else "none yet"
    history = answer.get("history") or []
    since = [h for h in history if int(h["id"]) > done_id and _stopped_completing(h)]
    if not since:
        completed = (answer.get("counts") or {}).get("completed", 0)
        detail = f"#{done_id} · {fmt_count(completed)} completed" if done else "none completed"
        if _first_epoch_runs(job):
            detail = f"{detail} · periodic ones wait for the attempt's first epoch to end"
        return stat("Last checkpoint", value, detail)
    # A full page of history that does not reach the last completed one: there were more.
    more = "+" if len(history) >= CHECKPOINTS_LIMIT and int(history[-1]["id"]) > done_id else ""
    why = f"{len(since)}{more} failed " + (f"since #{done_id}" if done else "(none completed)")
    newest = since[0]  # the history comes newest first
    cause = f"{why}; latest: {newest.get('failure_message') or newest.get('failure_reason')}"
    shown = cause if len(cause) <= CAUSE_CHARS else cause[: CAUSE_CHARS - 1] + "…"
    failing = html.Span(shown, title=cause, className="stat-detail-failed")
    return stat("Last checkpoint", value, failing)


def _first_epoch_runs(job: dict[str, Any]) -> bool:
    """The running attempt's first epoch (Spark's start-up) has not ended."""
    ended = (job.get("driver") or {}).get("first-epoch-ended")
    return job.get("state") == "RUNNING" and ended is False


def _stopped_completing(checkpoint: dict[str, Any]) -> bool:
    """A failed periodic checkpoint that says checkpoints do not complete (not a savepoint,
    nor one aborted by the job's own cancel, failover, restore or end)."""
    return (
        checkpoint.get("status") == "FAILED"
        and not checkpoint.get("is_savepoint")
        and checkpoint.get("failure_reason") not in ABORTED_BY_THE_JOB
    )
