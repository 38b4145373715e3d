"""The product's common options, parsed from a job's command line beside the job's own arguments.

``sparkpoint run job.py --standalone --checkpoint-interval 1 --events 1000`` hands every
argument to the job; :func:`parse_job_options` takes the options below and leaves the rest
(``--events 1000``) to the job's own parser.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.errors import ConfigurationError
from sparkpoint.protocol import CheckpointingMode
from sparkpoint.transport import default_redis_url


@dataclass(frozen=True)
class JobOptions:
    """Everything the runtime needs besides the job graph."""

    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    standalone: bool = True
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    checkpoint_dir: str | None = None
    checkpoint_storage: str = "jobmanager"
    max_inline_state_bytes: int = 1 << 20
    state_backend: str = "hashmap"
    parallelism: int = 2
    max_parallelism: int = 128
    master: str = "local[*]"
    fail_after: int | None = None
    crash_after_checkpoint: int | None = None
    durable_working_state: bool | None = None  # None: on unless the master is local
    isolate_workers: bool = False  # testing: every Python worker acts as its own executor
    from_checkpoint: str | None = None
    local_dir: str = field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "sparkpoint")
    )
    epoch_target_ms: float = 1000.0
    max_epoch_records: int = 4_000_000
    min_epoch_records: int = 1_000
    events_log: str | None = None
    max_events_in_memory: int | None = 1_000_000  # the driver's own event history
    restart_strategy: dict[str, str] = field(default_factory=dict)
    # Connected mode (not --standalone): the control plane's Redis and streams.
    redis_url: str | None = None
    stream_prefix: str = "sparkpoint"
    control_plane_timeout_ms: int = 60_000  # for the control plane's first restore


def _seconds_to_ms(flag: str, value: float) -> int:
    if value < 0:
        raise ConfigurationError(f"{flag} must be >= 0 seconds, got {value}")
    return round(value * 1000)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--job-id")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-storage", choices=["filesystem", "jobmanager"])
    p.add_argument("--checkpoint-interval", type=float, default=0.0)
    p.add_argument("--checkpoint-timeout", type=float, default=600.0)
    p.add_argument("--min-pause", type=float, default=0.0)
    p.add_argument("--tolerable-failures", type=int, default=0)
    p.add_argument("--retained", type=int, default=1)
    p.add_argument("--mode", choices=[m.value for m in CheckpointingMode], default="exactly_once")
    p.add_argument("--state-backend", choices=["hashmap"], default="hashmap")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--max-parallelism", type=int, default=128)
    p.add_argument("--master", default=os.environ.get("SPARKPOINT_MASTER", "local[*]"))
    p.add_argument("--fail-after", type=int)
    # Testing hook: kill the driver (SIGKILL) once checkpoint N completed, before its commit.
    p.add_argument("--crash-after-checkpoint", type=int)
    p.add_argument("--from-checkpoint")
    p.add_argument("--local-dir")
    p.add_argument("--epoch-target-ms", type=float, default=1000.0)
    p.add_argument("--max-epoch-records", type=int, default=4_000_000)
    p.add_argument("--events-log")
    p.add_argument("--durable-working-state", choices=["auto", "on", "off"], default="auto")
    p.add_argument(
        "--restart-strategy",
        choices=["none", "fixed-delay", "failure-rate", "exponential-delay"],
    )
    p.add_argument("--restart-attempts", type=int)
    p.add_argument("--restart-delay", type=float)
    p.add_argument("--restart-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--max-inline-state", type=int, default=1 << 20)
    p.add_argument("--redis-url")
    p.add_argument("--stream-prefix", default="sparkpoint")
    p.add_argument("--control-plane-timeout", type=float, default=60.0)
    return p


def parse_job_options(argv: Sequence[str] | None = None) -> tuple[JobOptions, list[str]]:
    """Split ``argv`` into the product's options and the job's own arguments.

    Raises:
        ConfigurationError: an option has an invalid value (the message names it).
    """
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        ns, rest = parser.parse_known_args(args)
    except SystemExit as err:  # argparse exits on bad values; turn that into our error
        raise ConfigurationError(f"invalid option in {' '.join(args)!r}") from err
    redis_url = None if ns.standalone else _redis_url(ns)
    if ns.parallelism < 1 or ns.parallelism > ns.max_parallelism:
        raise ConfigurationError(
            f"--parallelism must be between 1 and --max-parallelism ({ns.max_parallelism}), "
            f"got {ns.parallelism}"
        )
    if ns.fail_after is not None and ns.fail_after < 0:
        raise ConfigurationError(f"--fail-after must be >= 0 records, got {ns.fail_after}")
    storage = ns.checkpoint_storage or ("filesystem" if ns.checkpoint_dir else "jobmanager")
    if storage == "filesystem" and not ns.checkpoint_dir:
        raise ConfigurationError("--checkpoint-storage filesystem needs --checkpoint-dir URL")
    restart = _restart_options(ns)
    checkpoint = CheckpointConfig(
        mode=CheckpointingMode(ns.mode),
        interval_ms=_seconds_to_ms("--checkpoint-interval", ns.checkpoint_interval),
        timeout_ms=max(1, _seconds_to_ms("--checkpoint-timeout", ns.checkpoint_timeout)),
        min_pause_ms=_seconds_to_ms("--min-pause", ns.min_pause),
        tolerable_failures=ns.tolerable_failures,
        retained=ns.retained,
    )
    options = JobOptions(
        job_id=ns.job_id or uuid.uuid4().hex,
        standalone=ns.standalone,
        checkpoint=checkpoint,
        checkpoint_dir=ns.checkpoint_dir,
        checkpoint_storage=storage,
        max_inline_state_bytes=ns.max_inline_state,
        parallelism=ns.parallelism,
        max_parallelism=ns.max_parallelism,
        master=ns.master,
        fail_after=ns.fail_after,
        crash_after_checkpoint=ns.crash_after_checkpoint,
        durable_working_state={"auto": None, "on": True, "off": False}[ns.durable_working_state],
        from_checkpoint=ns.from_checkpoint,
        local_dir=ns.local_dir or os.path.join(tempfile.gettempdir(), "sparkpoint"),
        epoch_target_ms=ns.epoch_target_ms,
        max_epoch_records=ns.max_epoch_records,
        events_log=ns.events_log,
        restart_strategy=restart,
        redis_url=redis_url,
        stream_prefix=ns.stream_prefix,
        control_plane_timeout_ms=_seconds_to_ms(
            "--control-plane-timeout", ns.control_plane_timeout
        ),
    )
    return options, rest


def _redis_url(ns: argparse.Namespace) -> str:
    """Check the connected mode's options; return the control plane's Redis URL:
    ``--redis-url``, else ``REDIS_URL``, else the file ``sparkpoint server`` writes."""
    if not ns.stream_prefix.strip() or any(c.isspace() for c in ns.stream_prefix):
        raise ConfigurationError(
            f"--stream-prefix must be a non-empty name without spaces, got {ns.stream_prefix!r}"
        )
    if ns.control_plane_timeout <= 0:
        raise ConfigurationError(
            f"--control-plane-timeout must be > 0 seconds, got {ns.control_plane_timeout}"
        )
    url = ns.redis_url or default_redis_url()
    if not url:
        raise ConfigurationError(
            "no control plane to connect to: start `sparkpoint server` (it writes "
            "<SPARKPOINT_DATA_DIR or .sparkpoint/server>/redis.url), or set REDIS_URL or "
            "--redis-url, or run the job with --standalone"
        )
    return url


def _restart_options(ns: argparse.Namespace) -> dict[str, str]:
    """Flink's ``restart-strategy.*`` options from the command line.

    Nothing given: Flink's default (``exponential-delay`` when checkpointing is on, else
    ``none``). ``--restart-attempts`` / ``--restart-delay`` alone mean ``fixed-delay``; any
    other option of any strategy goes through ``--restart-option KEY=VALUE``.
    """
    out: dict[str, str] = {}
    kind = ns.restart_strategy
    if kind is None and (ns.restart_attempts is not None or ns.restart_delay is not None):
        kind = "fixed-delay"
    if kind is not None:
        out["restart-strategy.type"] = kind
    if ns.restart_attempts is not None:
        if ns.restart_attempts < 0:
            raise ConfigurationError(f"--restart-attempts must be >= 0, got {ns.restart_attempts}")
        out["restart-strategy.fixed-delay.attempts"] = str(ns.restart_attempts)
    if ns.restart_delay is not None:
        if ns.restart_delay < 0:
            raise ConfigurationError(
                f"--restart-delay must be >= 0 seconds, got {ns.restart_delay}"
            )
        out["restart-strategy.fixed-delay.delay"] = f"{round(ns.restart_delay * 1000)} ms"
    for item in ns.restart_option:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("restart-strategy"):
            raise ConfigurationError(
                f"--restart-option takes restart-strategy.KEY=VALUE, got {item!r}"
            )
        out[key.strip()] = value.strip()
    return out
