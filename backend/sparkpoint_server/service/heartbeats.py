"""The control plane's watch over connected drivers (Flink's ``heartbeat.timeout``).

A driver that announced a heartbeat interval in its registration is watched from then on;
its ``driver_heartbeat`` events (and its per-epoch ``heartbeat`` events) keep it alive. When
none arrived for the heartbeat timeout, the job's attempt failed as if it had sent
``task_failed``: the failure is recorded with the last heartbeat in its cause, the restart
strategy decides (RESTARTING, the restore sent when due and again to the driver that
registers next; or FAILED), and the silent driver is no longer watched. A job being
cancelled has nobody left to report CANCELED: it is CANCELED then.
"""

from __future__ import annotations

from sparkpoint import protocol as p
from sparkpoint_server.coordination.heartbeat import (
    HEARTBEAT_TIMEOUT,
    WATCHED,
    DriverHeartbeatMonitor,
    lost_driver_key,
)
from sparkpoint_server.coordination.job import JobRuntime
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service.batch import Batch


def watch(batch: Batch, rt: JobRuntime, interval_ms: int | None, monotonic_ms: float) -> None:
    """Watch the driver that just registered (``rt.incarnation``), if it sends heartbeats;
    its registration is its first sign of life."""
    rt.driver_lost = False
    if interval_ms is None or rt.incarnation is None:
        rt.heartbeat = None
        batch.writer.job(rt.job_id, heartbeat_interval=None)
        return
    rt.heartbeat = DriverHeartbeatMonitor(
        job_id=rt.job_id,
        incarnation=rt.incarnation,
        since_monotonic_ms=monotonic_ms,
        last_at=batch.now,
        watching_since=batch.now,
    )
    batch.writer.job(rt.job_id, heartbeat_interval=interval_ms, last_driver_heartbeat=batch.now)


def received(
    batch: Batch, rt: JobRuntime, monotonic_ms: float, incarnation: str | None = None
) -> None:
    """A sign of life of the watched driver (``incarnation``: of that driver process only).

    A driver declared lost that speaks again (it hung, it was not gone) is watched again:
    it reads the restore decided meanwhile and goes on as that attempt.
    """
    if rt.driver_lost and incarnation is not None and incarnation == rt.incarnation:
        rt.driver_lost = False
        rt.heartbeat = DriverHeartbeatMonitor(
            job_id=rt.job_id,
            incarnation=incarnation,
            since_monotonic_ms=monotonic_ms,
            last_at=batch.now,
            watching_since=batch.now,
        )
    monitor = rt.heartbeat
    if monitor is None or (incarnation is not None and incarnation != monitor.incarnation):
        return
    monitor.received(batch.now, monotonic_ms)
    batch.writer.job(rt.job_id, last_driver_heartbeat=batch.now)


def silent(
    rt: JobRuntime, now_monotonic_ms: float, timeout_ms: int, *, counting_from: float = 0.0
) -> bool:
    """Whether the job's driver stayed silent past the timeout while the job needs it,
    counting from ``counting_from`` at the earliest (since when heartbeats could arrive)."""
    monitor = rt.heartbeat
    return (
        monitor is not None
        and rt.restart_due_at is None
        and rt.status.value in WATCHED
        and monitor.overdue(now_monotonic_ms, timeout_ms, counting_from)
    )


def driver_lost(batch: Batch, rt: JobRuntime, timeout_ms: int) -> None:
    """The driver is gone: fail the attempt over as :func:`decisions.job_failed` does.

    Steps: (1) stop watching that driver (a restart must not count its silence twice),
    (2) a job being cancelled is CANCELED, (3) any other: record the failure and act on the
    restart strategy's decision.
    """
    monitor = rt.heartbeat
    assert monitor is not None, f"job {rt.job_id}: no driver is watched"
    # Step 1
    rt.heartbeat, rt.driver_lost = None, True
    # Step 2
    if rt.status is p.JobStatus.CANCELLING:
        d.set_status_and_settle(batch, rt, p.JobStatus.CANCELED, monitor.cause(timeout_ms))
        return
    # Step 3
    d.job_failed(
        batch,
        rt,
        monitor.cause(timeout_ms),
        kind=HEARTBEAT_TIMEOUT,
        dedupe=lost_driver_key(monitor.incarnation, rt.attempt),
    )
