"""How the control plane answers ``job_registered``: a new job starts (from the beginning or
its ``--from-checkpoint``), a duplicate registration gets its start again, a restarted driver
fails the job over, and an ended job that is run again starts a new attempt.

Registrations are events like the others (:mod:`~sparkpoint_server.service.events` hands them
here), applied under the coordination lock; the checkpoints they name were read before it
(:func:`read_restore_point`, by the ingest, bounded by the storage timeout).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sparkpoint import protocol as p
from sparkpoint.clock import Clock
from sparkpoint.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError
from sparkpoint.runtime.recovery import (
    RestorePoint,
    restore_point_from_metadata,
    storage_for_checkpoint_path,
)
from sparkpoint.transport import ReceivedMessage
from sparkpoint_server.coordination.job import (
    JobRuntime,
    Origin,
    RunSettings,
    build_runtime,
    checkpoint_config_dict,
    tasks_of,
)
from sparkpoint_server.errors import StorageUnavailableError
from sparkpoint_server.service import attempts, origins, run_settings, storage_io
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service import failover as fo
from sparkpoint_server.service import heartbeats as hb
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.recovery import load_job
from sparkpoint_server.service.storage_io import StorageRoots, state_paths
from sparkpoint_server.storage.models import Job

if TYPE_CHECKING:
    from sparkpoint_server.service.control_plane import ControlPlane

log = logging.getLogger(__name__)


class Registrations:
    """Applies ``job_registered`` events to the control plane's job runtimes."""

    def __init__(
        self,
        jobs: dict[str, JobRuntime],
        clock: Clock,
        *,
        checkpoint_dir: str,
        heartbeat_timeout_ms: int,
        roots: StorageRoots,
        disposing: set[storage_io.Location],
    ) -> None:
        self.jobs = jobs
        self.clock = clock
        self.checkpoint_dir = checkpoint_dir
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.roots = roots
        self.disposing = disposing  # the control plane's: savepoints being disposed of

    def registered(self, batch: Batch, env: p.Envelope, ev: p.JobRegistered) -> None:
        """Steps: (1) a duplicate (same driver process) gets its start command again,
        (2) a restarted driver of a known job fails the job over (or, when the silence of the
        previous driver already did, gets the restore decided then; when the job had ended,
        it is told so), an ended job run again starts a new attempt, (3) a new job starts at
        attempt 1 from the beginning or from ``from_checkpoint``. The registering driver is
        watched from then on if it sends heartbeats."""
        rt = self.jobs.get(env.job_id)
        if rt is None:  # a job that ended before this control plane started
            row = batch.writer.session.get(Job, env.job_id)
            if row is not None:
                rt = load_job(batch.writer.session, row, self.clock, self.checkpoint_dir)
                self.jobs[rt.job_id] = rt
        # Step 1
        if rt is not None and rt.incarnation == ev.incarnation and ev.incarnation is not None:
            hb.received(batch, rt, self.clock.monotonic_ms())
            batch.command(rt.job_id, rt.attempt, _start_command(rt))
            return
        # Step 2
        if rt is not None and rt.status is p.JobStatus.CANCELLING:
            # Its driver died while it was being cancelled: the cancel ends (Flink: a failure
            # while CANCELLING ends CANCELED), as when the driver's heartbeats stop.
            died = f" ({ev.previous_failure})" if ev.previous_failure else ""
            cause = f"its driver died while the job was being cancelled{died}"
            d.set_status_and_settle(batch, rt, p.JobStatus.CANCELED, cause)
        if rt is not None and not rt.active and ev.previous_failure is not None:
            # `sparkpoint run` restarted a driver that died after its job had ended (while it
            # shut down, say, after a cancel): the job stays as it ended, the driver too.
            cause = (
                f"job {rt.job_id} had ended {rt.status.value} before its driver died "
                f"({ev.previous_failure}): nothing to restart"
            )
            log.info("%s", cause)
            batch.command(rt.job_id, rt.attempt, p.CancelJob(status=rt.status, cause=cause))
            return
        if rt is not None:
            point, settings = None, None
            try:
                self._check_heartbeats(ev)
                run_settings.check_storage(rt, ev, self.checkpoint_dir)
                if not rt.active and ev.previous_failure is None:  # an ended job run again
                    settings = run_settings.rerun_settings(ev)
                    if ev.config.get("from_checkpoint"):  # from the checkpoint its run names
                        point = self._start_point(batch, dict(ev.config))
            except (ConfigurationError, CheckpointError) as err:
                _refuse(batch, rt.job_id, rt.attempt, err)
                return
            if settings is not None:
                self._rerun(batch, rt, ev, point, settings)
            else:
                self._restarted_driver(batch, rt, ev)
            return
        # Step 3: a configuration the control plane cannot run is refused, and the job told why.
        try:
            self._check_heartbeats(ev)
            self._new_job(batch, env, ev)
        except (ConfigurationError, CheckpointError) as err:
            _refuse(batch, env.job_id, 0, err)
            return
        self._watch(batch, self.jobs[env.job_id], ev)

    def _restarted_driver(self, batch: Batch, rt: JobRuntime, ev: p.JobRegistered) -> None:
        """A new driver process of a live job: fail over (:func:`~.failover.fail_over`),
        with the cause ``sparkpoint run`` gave (why the previous process ended) if any.

        When the previous driver's silence already failed the job over (RESTARTING), the
        restart strategy has decided: the new driver gets that restore (now, or from the
        timer when its delay is over), and no second failover is counted.
        """
        lost, rt.incarnation = rt.driver_lost, ev.incarnation
        _new_driver(batch, rt, ev)
        _adopt_graph(batch, rt, ev)
        self._watch(batch, rt, ev)
        run_settings.tell(batch, rt, ev)
        restarted = "the job's driver process registered again (it was restarted)"
        cause = f"{restarted}: {ev.previous_failure}" if ev.previous_failure else restarted
        decided = lost and rt.status is p.JobStatus.RESTARTING
        batch.writer.exception(
            f"{rt.job_id}:driver:{ev.incarnation}",
            job_id=rt.job_id,
            attempt=rt.attempt,
            timestamp=batch.now,
            kind="DRIVER_RESTART",
            cause=cause,
            action=(
                "the restart decided when the previous driver's heartbeats stopped goes on"
                if decided
                else f"restore {fo.target_name(rt)}"
            ),
        )
        if decided:
            if rt.restart_due_at is None:  # the restore went to the previous driver: again
                batch.command(rt.job_id, rt.attempt, _start_command(rt))
            return
        d.set_status(batch, rt, p.JobStatus.RESTARTING, cause)
        fo.fail_over(batch, rt, cause, batch.failover_verdicts.get(rt.job_id, {}))

    def _rerun(
        self,
        batch: Batch,
        rt: JobRuntime,
        ev: p.JobRegistered,
        point: RestorePoint | None,
        settings: RunSettings,
    ) -> None:
        """An ended job run again, with its command line's ``settings``: from its
        ``--from-checkpoint`` (``point``, read before the lock), where a new line of
        checkpoints starts as after a restore request; without one, from the newest
        checkpoint of its line (from the beginning, it would commit its output again). A
        driver that ``sparkpoint run`` restarted passes the same ``--from-checkpoint`` again:
        only a run without a previous failure comes here."""
        ended, rt.incarnation = rt.status.value, ev.incarnation
        _new_driver(batch, rt, ev)
        _adopt_graph(batch, rt, ev)
        self._watch(batch, rt, ev)
        cause = f"the job runs again (it had ended {ended})"
        action = f"restore {fo.target_name(rt)}"
        if point is not None:
            path = point.external_path or str(ev.config["from_checkpoint"])
            cause = f"{cause}, from --from-checkpoint {path}"
            action = f"restore checkpoint {point.checkpoint_id} at {path}"
        batch.writer.exception(
            f"{rt.job_id}:rerun:{ev.incarnation}",
            job_id=rt.job_id,
            attempt=rt.attempt,
            timestamp=batch.now,
            kind="RERUN",
            cause=cause,
            action=action,
        )
        d.set_status(batch, rt, p.JobStatus.RESTARTING, cause)
        if point is None:
            fo.fail_over(batch, rt, cause, batch.failover_verdicts.get(rt.job_id, {}))
        else:
            held = origins.held(rt, point.checkpoint_id, path)
            if held is not None:
                decision = rt.coordinator.restore_to(held.checkpoint_id)
            else:
                decision = rt.coordinator.restore_from(origins.read_from_path(point), cause)
            attempts.start_attempt(batch, rt, decision, request_id=None, new_line=True)
        if rt.status is not p.JobStatus.FAILED:  # not when no checkpoint could be restored
            run_settings.adopt(batch, rt, settings)

    def _check_heartbeats(self, ev: p.JobRegistered) -> None:
        """Refuse a driver whose heartbeats come no more often than the heartbeat timeout:
        every one would arrive late, and the job would fail over again and again (Flink
        refuses a ``heartbeat.timeout`` below ``heartbeat.interval``).

        Raises:
            ConfigurationError: naming both settings and the values.
        """
        interval, timeout = ev.heartbeat_interval_ms, self.heartbeat_timeout_ms
        if interval is not None and interval >= timeout:
            raise ConfigurationError(
                f"its driver sends a heartbeat every {interval / 1000:g} s "
                f"(SPARKPOINT_HEARTBEAT_INTERVAL), not more often than the control plane's "
                f"heartbeat timeout of {timeout / 1000:g} s (SPARKPOINT_HEARTBEAT_TIMEOUT): "
                "the job would be declared lost between any two heartbeats. Set the interval "
                f"below {timeout / 2000:g} s, half the timeout"
            )

    def _watch(self, batch: Batch, rt: JobRuntime, ev: p.JobRegistered) -> None:
        """Watch the registering driver's heartbeats, and its first epochs' (periodic
        checkpoints of an attempt wait for its first, when the driver sends one)."""
        interval = ev.heartbeat_interval_ms
        if interval is not None and 2 * interval > self.heartbeat_timeout_ms:
            log.warning(
                "job %s: its driver sends a heartbeat every %d ms, too rarely for the heartbeat "
                "timeout of %d ms (SPARKPOINT_HEARTBEAT_TIMEOUT): one late heartbeat fails it "
                "over; lower its SPARKPOINT_HEARTBEAT_INTERVAL",
                rt.job_id,
                interval,
                self.heartbeat_timeout_ms,
            )
        hb.watch(batch, rt, interval, self.clock.monotonic_ms())
        rt.first_epoch_heartbeat = ev.first_epoch_heartbeat
        batch.writer.job(rt.job_id, first_epoch_heartbeat=ev.first_epoch_heartbeat)

    def _new_job(self, batch: Batch, env: p.Envelope, ev: p.JobRegistered) -> None:
        graph = _graph_of(ev)
        config = dict(ev.config)
        point = self._start_point(batch, config)
        rt = build_runtime(
            job_id=env.job_id,
            name=ev.job_name,
            graph=graph,
            config=config,
            checkpoint_config=config,
            restart_strategy=dict(config.get("restart_strategy") or {}),
            status=p.JobStatus.CREATED,
            incarnation=ev.incarnation,
            attempt=1,
            next_checkpoint_id=point.checkpoint_id + 1 if point else 1,
            clock=self.clock,
            default_checkpoint_dir=self.checkpoint_dir,
        )
        if point is not None:
            path = point.external_path or str(config["from_checkpoint"])
            rt.origin = Origin(point.checkpoint_id, path, rt.coordinator.next_checkpoint_id)
        self.jobs[rt.job_id] = rt
        batch.writer.insert_job(
            job_id=rt.job_id,
            name=rt.name,
            status=rt.status.value,
            attempt=1,
            incarnation=ev.incarnation,
            created_at=batch.now,
            updated_at=batch.now,
            start_time=batch.now,
            graph=graph,
            config=config,
            checkpoint_config=checkpoint_config_dict(rt.coordinator.config),
            restart_strategy=dict(rt.restart.to_config()),
            next_checkpoint_id=rt.coordinator.next_checkpoint_id,
            **origins.columns(rt.origin),
            **_guarantee_columns(ev),
        )
        batch.writer.status_change(
            job_id=rt.job_id,
            attempt=1,
            timestamp=batch.now,
            status=rt.status.value,
            previous=None,
            cause="registered",
        )
        restore = origins.restore_command(rt, None, 1, None)
        rt.start_command = restore
        batch.command(rt.job_id, 1, restore)

    def _start_point(self, batch: Batch, config: dict[str, Any]) -> RestorePoint | None:
        """Check the storage a new job names; the checkpoint it starts from (read before the
        lock was taken), if any.

        Raises:
            ConfigurationError: its checkpoint directory, its ``--from-checkpoint`` or a state
                file that one names is outside the storage roots, or it could not be read.
        """
        refusal = self.roots.registration_refusal(config)
        if refusal is not None:
            raise ConfigurationError(refusal)
        if not config.get("from_checkpoint"):
            return None
        path = str(config["from_checkpoint"])
        if storage_io.location_of(path) in self.disposing:
            raise ConfigurationError(f"--from-checkpoint {path!r} is being disposed of")
        point = batch.restore_points.get(path)
        if not isinstance(point, RestorePoint):
            raise ConfigurationError(f"--from-checkpoint {path!r}: {_unreadable(point)}")
        gone = origins.deleted_at(batch.writer.session, path)
        if gone is not None:  # read just before its deletion
            raise ConfigurationError(
                f"--from-checkpoint {path!r}: {gone} there was deleted (a newer one subsumed "
                "it); start from a savepoint or from a checkpoint the job retains now"
            )
        roots = self.roots.of_job(config)
        for state in (path for a in point.acks for h in a.handles for path in state_paths(h)):
            if not roots.contains(state):
                raise ConfigurationError(
                    f"--from-checkpoint {path!r} names state at "
                    f"{state!r}, outside the storage roots: {roots.describe()}"
                )
        return point


def _unreadable(err: Exception | None) -> str:
    """Why a start checkpoint could not be read: the storage's own words for a missing or
    corrupt one (and, when missing, where to find one that stays), else the whole error."""
    if err is None:
        return "not read"
    cause = err.__cause__
    if isinstance(cause, CheckpointNotFoundError):
        return (
            f"{cause}; a running job deletes its checkpoints once newer ones subsume them: "
            "start from a savepoint (sparkpoint savepoint JOB) or from a checkpoint it "
            "retains now (sparkpoint checkpoints JOB)"
        )
    if isinstance(cause, CheckpointError):  # corrupt, of another format: it says which file
        return str(cause)
    return str(err)


def read_restore_point(path: str) -> RestorePoint:
    """The checkpoint at ``path`` (storage I/O: call it outside the lock, bounded in time)."""
    return restore_point_from_metadata(storage_for_checkpoint_path(path), path)


def _starts(
    messages: list[ReceivedMessage],
) -> Iterator[tuple[ReceivedMessage, dict[str, Any], str]]:
    """The registrations among ``messages`` that name a checkpoint to start from: each with
    its configuration and that checkpoint."""
    for m in messages:
        if isinstance(m.payload, p.JobRegistered) and m.payload.config.get("from_checkpoint"):
            yield m, m.payload.config, str(m.payload.config["from_checkpoint"])


def start_paths(messages: list[ReceivedMessage]) -> list[str]:
    """The checkpoints that the registrations among ``messages`` start from."""
    return [path for _, _, path in _starts(messages)]


def read_restore_points(plane: ControlPlane, messages: list[ReceivedMessage]) -> dict[str, Any]:
    """Before taking the lock: the checkpoints that registrations name to start from
    (``--from-checkpoint``), each read with the storage timeout (or why it could not be)."""
    points: dict[str, Any] = {}
    for m, config, path in _starts(messages):
        if path in points or plane.roots.registration_refusal(config):
            continue
        what = f"job {m.envelope.job_id}: reading --from-checkpoint {path}"
        try:
            points[path] = storage_io.call(what, plane.storage_timeout_s, read_restore_point, path)
        except StorageUnavailableError as err:
            points[path] = err
    return points


def _start_command(rt: JobRuntime) -> p.RestoreJob:
    """The ``restore`` that starts the job's current attempt (rebuilt when a control-plane
    restart lost it)."""
    start = rt.start_command
    if start is None or start.new_attempt != rt.attempt:
        cp = rt.coordinator.store.get(rt.restore_pin) if rt.restore_pin else None
        start = origins.restore_command(rt, cp, rt.attempt, None)
    return start


def _refuse(batch: Batch, job_id: str, attempt: int, err: Exception) -> None:
    """Tell a driver that the control plane will not run its job, and why (it would otherwise
    wait for a start that never comes)."""
    cause = f"the control plane refused job {job_id}: {err}"
    log.warning("%s", cause)
    batch.command(job_id, attempt, p.CancelJob(status=p.JobStatus.FAILED, cause=cause))


def _new_driver(batch: Batch, rt: JobRuntime, ev: p.JobRegistered) -> None:
    """The job row of a job that another driver process now runs."""
    batch.writer.job(
        rt.job_id,
        incarnation=ev.incarnation,
        updated_at=batch.now,
        spark_application_id=None,  # the new driver names its own once RUNNING
        spark_ui_url=None,
        spark_executors=None,
        **_guarantee_columns(ev),  # the new driver may run a changed job
    )


def _graph_of(ev: p.JobRegistered) -> dict[str, Any]:
    return {
        "vertices": [v.model_dump(mode="json") for v in ev.vertices],
        "edges": [list(e) for e in ev.edges],
    }


def _adopt_graph(batch: Batch, rt: JobRuntime, ev: p.JobRegistered) -> None:
    """The graph of the driver that registers now is the job's: a job run again on a new
    version or at another parallelism (``--from-checkpoint`` of its savepoint, as Flink
    rescales) acknowledges with its own subtasks, which the old graph would refuse."""
    graph = _graph_of(ev)
    if graph == rt.graph or not tasks_of(graph):
        return
    log.info("job %s: a driver registered with another graph; it is the job's now", rt.job_id)
    rt.graph = graph
    rt.coordinator.set_tasks(rt.tasks)
    batch.writer.job(rt.job_id, graph=graph)


def _guarantee_columns(ev: p.JobRegistered) -> dict[str, str | None]:
    """The job row's guarantee columns from a registration (both None: not reported)."""
    g = ev.guarantee
    return {"guarantee_level": g.level if g else None, "guarantee_reason": g.reason if g else None}
