"""The coordination state of one connected job: its coordinator, restart strategy and status.

Pure: no database, no Redis. The service keeps one :class:`JobRuntime` per unfinished job, feeds
it events and timer ticks, and writes down what changed. Status transitions are guarded here,
with Flink's names (DESIGN §2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.coordinator import CheckpointCoordinator
from sparkpoint.checkpointing.expiry import EpochEnds
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.restart import RestartStrategy, restart_strategy_from_config
from sparkpoint.checkpointing.storage import CheckpointStorage, checkpoint_storage_from_options
from sparkpoint.clock import Clock
from sparkpoint.errors import ConfigurationError
from sparkpoint.protocol import CheckpointingMode, JobStatus
from sparkpoint_server.coordination.heartbeat import DriverHeartbeatMonitor

TERMINAL = frozenset({JobStatus.FINISHED, JobStatus.CANCELED, JobStatus.FAILED})

# Which statuses may follow which (Flink's JobStatus state machine, as Sparkpoint uses it).
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.CREATED: frozenset(
        {JobStatus.RUNNING, JobStatus.FAILING, JobStatus.CANCELLING, JobStatus.RESTARTING}
    ),
    JobStatus.RUNNING: frozenset(
        {
            JobStatus.RESTARTING,
            JobStatus.FAILING,
            JobStatus.CANCELLING,
            JobStatus.FINISHED,
            JobStatus.CANCELED,
        }
    ),
    JobStatus.RESTARTING: frozenset(
        {JobStatus.RUNNING, JobStatus.FAILING, JobStatus.CANCELLING, JobStatus.CANCELED}
    ),
    JobStatus.FAILING: frozenset({JobStatus.FAILED, JobStatus.RESTARTING}),
    JobStatus.CANCELLING: frozenset({JobStatus.CANCELED, JobStatus.FINISHED, JobStatus.FAILED}),
    # A driver registering again for a finished job id starts it over from its checkpoints.
    JobStatus.FINISHED: frozenset({JobStatus.RESTARTING}),
    JobStatus.CANCELED: frozenset({JobStatus.RESTARTING}),
    JobStatus.FAILED: frozenset({JobStatus.RESTARTING}),
}

CONFIG_KEYS = (
    "mode",
    "interval_ms",
    "timeout_ms",
    "min_pause_ms",
    "max_concurrent",
    "tolerable_failures",
    "retained",
)
UNCOMMITTED_PIN = "uncommitted sink transactions"
RESTORE_PIN = "pending restore"
# A live job started from it (or restored it) by its path and has no checkpoint since: its
# failover would read these files (``service.origins.relied_on``).
ORIGIN_PIN = "a live job's origin"


def checkpoint_config_from(conf: dict[str, Any]) -> CheckpointConfig:
    """A CheckpointConfig from a job's registered (or stored) configuration.

    Raises:
        ConfigurationError: naming the field that is invalid.
    """
    try:
        values = {k: conf[k] for k in CONFIG_KEYS if conf.get(k) is not None}
        if "mode" in values:
            values["mode"] = CheckpointingMode(values["mode"])
        return CheckpointConfig(**values)
    except (TypeError, ValueError) as err:
        raise ConfigurationError(f"invalid checkpoint configuration: {err}") from err


def checkpoint_config_dict(config: CheckpointConfig) -> dict[str, Any]:
    return {
        "mode": config.mode.value,
        "interval_ms": config.interval_ms,
        "timeout_ms": config.timeout_ms,
        "min_pause_ms": config.min_pause_ms,
        "max_concurrent": config.max_concurrent,
        "tolerable_failures": config.tolerable_failures,
        "retained": config.retained,
    }


def tasks_of(graph: dict[str, Any]) -> dict[str, int]:
    """Operator uid -> parallelism, from a registered graph's vertices."""
    return {v["id"]: int(v["parallelism"]) for v in graph.get("vertices", [])}


@dataclass
class Finalizing:
    """A completed checkpoint whose ``_metadata`` (a savepoint: its copy) is being written,
    outside the coordination lock; it is recorded, notified and may subsume others only then."""

    checkpoint: CompletedCheckpoint
    savepoint_target: str
    written: Any = None  # the write's future, once its unit committed
    taken_back: bool = False  # failed before the write ended (a failover): discard when it does

    @property
    def done(self) -> bool:
        return self.written is not None and self.written.done()


@dataclass(frozen=True)
class Origin:
    """Where the job's current line of checkpoints starts: the checkpoint that its
    ``--from-checkpoint`` or the latest restore request named. A failover restores the
    newest checkpoint completed since (ids from ``next_id`` on), else this one, and never
    one that a restore went back past (Flink starts a new job from the checkpoint restored,
    whose store holds nothing newer).

    Attributes:
        checkpoint_id: its id.
        path: its location, restored by path when the job's store does not hold it (another
            job's checkpoint, a savepoint read from its path); None: inline, in the store.
        next_id: the id of the first checkpoint after it.
    """

    checkpoint_id: int
    path: str | None
    next_id: int


@dataclass
class JobRuntime:
    """Everything the control plane decides with about one job, in memory."""

    job_id: str
    name: str
    graph: dict[str, Any]
    config: dict[str, Any]  # as registered: storage, directories, ...
    coordinator: CheckpointCoordinator
    restart: RestartStrategy
    status: JobStatus
    incarnation: str | None
    storage: CheckpointStorage
    restart_due_at: int | None = None  # wall-clock ms of a decided restart
    restart_cause: str | None = None
    final_requested: bool = False  # the input ended: the final checkpoint ends the job
    final_waiting: bool = False  # its trigger waits (service.final_checkpoint)
    stop_checkpoint: int | None = None  # stop-with-savepoint: finish after this one
    cancel_after: set[int] = field(default_factory=set)  # savepoints with cancel-job
    savepoint_targets: dict[int, str] = field(default_factory=dict)  # savepoint id -> dir
    operations: dict[int, str] = field(default_factory=dict)  # checkpoint id -> request id
    # Manual checkpoint requests that came while max_concurrent checkpoints were pending, in
    # order (Flink's CheckpointRequestDecider queues them): request ids, triggered first.
    queued_checkpoints: list[str] = field(default_factory=list)
    restore_request: tuple[int, str] | None = None  # (attempt it starts, request id)
    restore_pin: int | None = None  # the checkpoint a pending restore needs
    cancel_request: str | None = None
    start_command: Any = None  # the last ``restore`` sent: a duplicate registration gets it again
    origin: Origin | None = None  # None: the job started from the beginning, no restore since
    uncommitted: dict[int, set[tuple[str, int]]] = field(default_factory=dict)
    heartbeat: DriverHeartbeatMonitor | None = None  # None: no driver is watched
    epoch_ends: EpochEnds = field(default_factory=EpochEnds)  # why a checkpoint expired
    # Its driver ends each attempt's first epoch with a heartbeat (``first_epoch_heartbeat``
    # of its registration): periodic checkpoints wait for it (:attr:`tasks_running`).
    first_epoch_heartbeat: bool = False
    driver_lost: bool = False  # its driver's silence failed it over; no driver registered since
    finalizing: dict[int, Finalizing] = field(default_factory=dict)  # checkpoint id -> write
    # Rebuilt from rows of a checkpoint every subtask acknowledged whose completion was not
    # recorded (a crash, a failed unit): (attempt, last ack), applied again at the next tick.
    held_acks: list[tuple[int, Any]] = field(default_factory=list)
    # The check of a due restart's checkpoint files, running outside the lock
    # (``service.failover.FailoverCheck``); None: none runs.
    failover_check: Any = None
    # (graph, its tasks): every barrier and alignment event checks its subtask against them,
    # and building them again per event was a dict per event.
    _tasks: tuple[dict[str, Any], dict[str, int]] | None = field(default=None, repr=False)

    @property
    def attempt(self) -> int:
        return self.coordinator.attempt

    @property
    def active(self) -> bool:
        return self.status not in TERMINAL

    @property
    def tasks(self) -> dict[str, int]:
        """Operator uid -> parallelism (built once per graph; do not change it)."""
        if self._tasks is None or self._tasks[0] is not self.graph:
            self._tasks = (self.graph, tasks_of(self.graph))
        return self._tasks[1]

    @property
    def tasks_running(self) -> bool:
        """Whether the attempt's tasks run, so that a periodic checkpoint may be triggered
        (Flink triggers none before: ``NOT_ALL_REQUIRED_TASKS_RUNNING``). On Spark a task
        runs within an epoch, and the first epoch of an attempt starts Spark's Python
        workers, possibly executors: a barrier triggered meanwhile would wait that out and
        could expire. Known from the attempt's first heartbeat, for a driver that runs its
        first epoch at once; always True for one that does not say."""
        return not self.first_epoch_heartbeat or self.epoch_ends.any_of(self.attempt)

    def periodic_due(self) -> bool:
        """Whether a periodic checkpoint is due: the coordinator's interval and pause are
        over, and the attempt's tasks run (:attr:`tasks_running`)."""
        return self.coordinator.periodic_due() and self.tasks_running

    def can_become(self, status: JobStatus) -> bool:
        return status == self.status or status in TRANSITIONS[self.status]


@dataclass(frozen=True)
class RunSettings:
    """How a job checkpoints and restarts, from its registration or its stored row."""

    checkpoint: CheckpointConfig
    restart: RestartStrategy


def run_settings_from(
    checkpoint_config: dict[str, Any], restart_strategy: dict[str, Any]
) -> RunSettings:
    """Raises:
    ConfigurationError: an invalid checkpoint configuration or restart strategy.
    """
    cfg = checkpoint_config_from(checkpoint_config)
    restart = restart_strategy_from_config(
        dict(restart_strategy), checkpointing_enabled=cfg.interval_ms > 0
    )
    return RunSettings(cfg, restart)


def storage_of(config: dict[str, Any], default_dir: str) -> tuple[str, str]:
    """The checkpoint storage a job's configuration names: its kind and its directory."""
    kind = str(config.get("checkpoint_storage") or "filesystem")
    return kind, str(config.get("checkpoint_dir") or default_dir)


def build_runtime(
    *,
    job_id: str,
    name: str,
    graph: dict[str, Any],
    config: dict[str, Any],
    checkpoint_config: dict[str, Any],
    restart_strategy: dict[str, Any],
    status: JobStatus,
    incarnation: str | None,
    attempt: int,
    next_checkpoint_id: int,
    clock: Clock,
    default_checkpoint_dir: str,
) -> JobRuntime:
    """A job's runtime from its registration or its stored row.

    Raises:
        ConfigurationError: an invalid graph, checkpoint configuration or restart strategy.
    """
    tasks = tasks_of(graph)
    if not tasks:
        raise ConfigurationError(f"job {job_id}: the registered graph has no vertices")
    settings = run_settings_from(checkpoint_config, restart_strategy)
    storage = checkpoint_storage_from_options(
        *storage_of(config, default_checkpoint_dir),
        int(config.get("max_inline_state_bytes") or (1 << 20)),
    )
    coordinator = CheckpointCoordinator(
        job_id,
        tasks,
        settings.checkpoint,
        clock,
        attempt=max(attempt, 1),
        next_checkpoint_id=next_checkpoint_id,
    )
    return JobRuntime(
        job_id=job_id,
        name=name,
        graph=graph,
        config=config,
        coordinator=coordinator,
        restart=settings.restart,
        status=status,
        incarnation=incarnation,
        storage=storage,
    )
