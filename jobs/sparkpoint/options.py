"""The product's common options, parsed from a job's command line beside the job's own arguments.

``sparkpoint run job.py --standalone --checkpoint-interval 1 --events 1000`` hands every
argument to the job; :func:`parse_job_options` takes the options below and leaves the rest
(``--events 1000``) to the job's own parser. A leftover ``--option`` that looks like a
misspelled product option (``--checkpoint-intervall``) is refused rather than silently
ignored; a job declares its own options (``job_options``) so that they never are.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.errors import ConfigurationError
from sparkpoint.limits import InvalidJobIdError, check_job_id
from sparkpoint.locations import absolute
from sparkpoint.option_parser import product_parser
from sparkpoint.protocol import CheckpointingMode
from sparkpoint.transport import default_redis_url

#: The default ``--local-dir`` under the temporary directory. Not ``sparkpoint``: run from the
#: temporary directory, a folder of the package's name there would shadow the package.
DEFAULT_LOCAL_DIR_NAME = "sparkpoint-local"
#: Records per split of an epoch's lower bound, and of a driver's first epoch.
DEFAULT_MIN_EPOCH_RECORDS = 1_000
# The options that only say how a connected job reaches its control plane (dest: flag).
CONTROL_PLANE_OPTIONS = {
    "redis_url": "--redis-url",
    "stream_prefix": "--stream-prefix",
    "control_plane_timeout": "--control-plane-timeout",
}


@dataclass(frozen=True)
class JobOptions:
    """Everything the runtime needs besides the job graph."""

    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    standalone: bool = True
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    checkpoint_dir: str | None = None
    checkpoint_storage: str = "jobmanager"
    max_inline_state_bytes: int = 1 << 20
    state_backend: str = "hashmap"  # Flink's state.backend.type: "hashmap" or "rocksdb"
    incremental: bool = False  # Flink's execution.checkpointing.incremental (rocksdb only)
    allow_non_restored_state: bool = False  # restore even if a snapshot's operator is gone
    savepoint_on_finish: str | None = None  # standalone: the final checkpoint is a savepoint here
    parallelism: int = 2
    max_parallelism: int = 128
    master: str = "local[*]"
    fail_after: int | None = None
    crash_after_checkpoint: int | None = None
    durable_working_state: bool | None = None  # None: on unless the master is local
    isolate_workers: bool = False  # testing: every Python worker acts as its own executor
    from_checkpoint: str | None = None
    local_dir: str = field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), DEFAULT_LOCAL_DIR_NAME)
    )
    epoch_target_ms: float = 1000.0
    max_epoch_records: int = 4_000_000
    min_epoch_records: int = DEFAULT_MIN_EPOCH_RECORDS
    alignment_buffer_bytes: int = 64 << 20  # held in memory per keyed subtask, then spilled
    events_log: str | None = None
    max_events_in_memory: int | None = 1_000_000  # the driver's own event history
    restart_strategy: dict[str, str] = field(default_factory=dict)
    failover_strategy: str = "region"  # Flink's jobmanager.execution.failover-strategy
    # Connected mode (not --standalone): the control plane's Redis and streams.
    redis_url: str | None = None
    stream_prefix: str = "sparkpoint"
    control_plane_timeout_ms: int = 60_000  # for the control plane's first restore
    # What the job prints (sparkpoint.console): quiet, text or json, every n-th checkpoint.
    quiet: bool = False
    log_format: str = "text"
    log_every: int = 10

    def __post_init__(self) -> None:
        # A plain path means the working directory of the process that made the options
        # (the driver): its executors and the control plane, which write and read the same
        # checkpoints, run in other directories.
        for name in ("checkpoint_dir", "from_checkpoint", "savepoint_on_finish"):
            value = getattr(self, name)
            if value:  # None or empty: not given
                object.__setattr__(self, name, absolute(value))


def check_epoch_options(options: JobOptions) -> None:
    """Refuse epoch sizes that would stall the job (an epoch of no record never ends the
    input) or that the planner cannot size by (a target that is not a positive number).

    Raises:
        ConfigurationError: naming the option.
    """
    if not (math.isfinite(options.epoch_target_ms) and options.epoch_target_ms > 0):
        raise ConfigurationError(
            f"--epoch-target-ms must be a number > 0 ms, got {options.epoch_target_ms:g}"
        )
    if options.max_epoch_records < 1:
        raise ConfigurationError(
            f"--max-epoch-records must be >= 1 records, got {options.max_epoch_records}"
        )
    if options.min_epoch_records < 1:
        raise ConfigurationError(
            f"--min-epoch-records must be >= 1 records, got {options.min_epoch_records}"
        )


def check_state_options(options: JobOptions) -> None:
    """Refuse state options that do not go together (the command line checks them too).

    Raises:
        ConfigurationError: naming the options.
    """
    if options.state_backend not in ("hashmap", "rocksdb"):
        raise ConfigurationError(
            f"unknown state backend {options.state_backend!r}; use hashmap or rocksdb"
        )
    if options.incremental and options.state_backend != "rocksdb":
        raise ConfigurationError(
            "--incremental needs --state-backend rocksdb: the hashmap backend writes full "
            "snapshots (its epochs already write only what changed)"
        )
    if options.incremental and options.checkpoint_storage != "filesystem":
        raise ConfigurationError(
            "--incremental needs a filesystem checkpoint storage (--checkpoint-dir URL): "
            "the files shared between checkpoints cannot be kept inline"
        )
    if options.incremental and options.checkpoint.max_concurrent > 1:
        raise ConfigurationError(
            "incremental checkpoints keep one checkpoint in flight (max_concurrent 1, got "
            f"{options.checkpoint.max_concurrent}): a subtask reuses the files of its previous "
            "snapshot, which a concurrent completion could subsume"
        )


def _seconds_to_ms(flag: str, value: float) -> int:
    if value < 0:
        raise ConfigurationError(f"{flag} must be >= 0 seconds, got {value}")
    return round(value * 1000)


def _positive_ms(flag: str, value: float) -> int:
    """A duration that must pass before something happens (a timeout): > 0, at least 1 ms."""
    if not value > 0:
        raise ConfigurationError(f"{flag} must be > 0 seconds, got {value:g}")
    return max(1, round(value * 1000))


#: How alike (difflib's ratio, without the dashes) a job argument and a product option must be
#: for the argument to count as a misspelling: ``checkpoint-intervall`` is 0.97, ``mod``
#: (``mode``) 0.86; the example job's ``events`` (``events-log``) 0.75.
SIMILARITY_CUTOFF = 0.85
#: An abbreviation is at least this long (without the dashes): ``--par`` means
#: ``--parallelism``, ``--ev`` is nobody's.
MIN_ABBREVIATION = 3


def parse_job_options(
    argv: Sequence[str] | None = None, *, job_options: Iterable[str] | None = None
) -> tuple[JobOptions, list[str]]:
    """Split ``argv`` into the product's options and the job's own arguments.

    Args:
        argv: the job's command line (default ``sys.argv[1:]``).
        job_options: the job's own ``--options`` (for example ``["--events", "--rate"]``, or
            none: ``()``); any other leftover ``--option`` close to a product option is
            refused. None (the default) skips that check, for a caller that cannot know the
            job's options (``sparkpoint run`` before the job starts): the job's
            :meth:`~sparkpoint.environment.StreamExecutionEnvironment.from_args` checks.

    Raises:
        ConfigurationError: an option has an invalid value, or a leftover ``--option`` is
            close to a product option (the message names it and suggests the product option).
    """
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    parser = product_parser()
    parser.exit_on_error = False
    try:
        ns, rest = parser.parse_known_args(args)
    except argparse.ArgumentError as err:  # a bad value: argparse's own words, one line
        raise ConfigurationError(str(err)) from None
    if job_options is not None:
        check_unknown_options(rest, _flags(parser), job_options)
    if ns.job_id is not None:
        try:
            check_job_id(ns.job_id)
        except InvalidJobIdError as err:
            raise ConfigurationError(f"--job-id: {err}") from err
    # A job asked for its help (``pv_count.py --help``) prints it, control plane or not.
    asks_for_help = any(arg in ("-h", "--help") for arg in rest)
    if ns.standalone:
        _check_no_control_plane_options(ns, parser)
    redis_url = None if ns.standalone or asks_for_help else _redis_url(ns)
    if ns.parallelism < 1 or ns.parallelism > ns.max_parallelism:
        raise ConfigurationError(
            f"--parallelism must be between 1 and --max-parallelism ({ns.max_parallelism}), "
            f"got {ns.parallelism}"
        )
    if ns.log_every < 1:
        raise ConfigurationError(f"--log-every must be >= 1 checkpoints, got {ns.log_every}")
    if ns.alignment_buffer < 0:
        raise ConfigurationError(
            f"--alignment-buffer must be >= 0 bytes, got {ns.alignment_buffer}"
        )
    if ns.fail_after is not None and ns.fail_after < 0:
        raise ConfigurationError(f"--fail-after must be >= 0 records, got {ns.fail_after}")
    if ns.retained < 1:
        raise ConfigurationError(f"--retained must be >= 1 checkpoints, got {ns.retained}")
    if ns.tolerable_failures < 0:
        raise ConfigurationError(
            f"--tolerable-failures must be >= 0 checkpoints, got {ns.tolerable_failures}"
        )
    storage = ns.checkpoint_storage or ("filesystem" if ns.checkpoint_dir else "jobmanager")
    if storage == "filesystem" and not ns.checkpoint_dir:
        raise ConfigurationError("--checkpoint-storage filesystem needs --checkpoint-dir URL")
    if ns.savepoint_on_finish and not ns.standalone:
        raise ConfigurationError(
            "--savepoint-on-finish is for --standalone jobs; a connected job's savepoints are "
            "taken by the control plane: sparkpoint savepoint JOB [DIR], or sparkpoint stop "
            "JOB [DIR] to stop it with one"
        )
    restart = _restart_options(ns)
    checkpoint = CheckpointConfig(
        mode=CheckpointingMode(ns.mode),
        interval_ms=_seconds_to_ms("--checkpoint-interval", ns.checkpoint_interval),
        timeout_ms=_positive_ms("--checkpoint-timeout", ns.checkpoint_timeout),
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
        state_backend=ns.state_backend,
        incremental=ns.incremental,
        allow_non_restored_state=ns.allow_non_restored_state,
        savepoint_on_finish=ns.savepoint_on_finish,
        parallelism=ns.parallelism,
        max_parallelism=ns.max_parallelism,
        master=ns.master,
        fail_after=ns.fail_after,
        crash_after_checkpoint=ns.crash_after_checkpoint,
        durable_working_state={"auto": None, "on": True, "off": False}[ns.durable_working_state],
        from_checkpoint=ns.from_checkpoint,
        local_dir=ns.local_dir or os.path.join(tempfile.gettempdir(), DEFAULT_LOCAL_DIR_NAME),
        epoch_target_ms=ns.epoch_target_ms,
        max_epoch_records=ns.max_epoch_records,
        min_epoch_records=_min_epoch_records(ns),
        alignment_buffer_bytes=ns.alignment_buffer,
        events_log=ns.events_log,
        restart_strategy=restart,
        failover_strategy=ns.failover_strategy,
        redis_url=redis_url,
        stream_prefix=ns.stream_prefix,
        control_plane_timeout_ms=_seconds_to_ms(
            "--control-plane-timeout", ns.control_plane_timeout
        ),
        quiet=ns.quiet,
        log_format=ns.log_format,
        log_every=ns.log_every,
    )
    check_state_options(options)
    check_epoch_options(options)
    return options, rest


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for action in parser._actions for flag in action.option_strings]


def check_unknown_options(
    rest: Sequence[str], product_options: Sequence[str], job_options: Iterable[str] = ()
) -> None:
    """Refuse a job argument that looks like a misspelled product option.

    A leftover ``--name`` (or ``--name=value``) is a misspelling when it is not one of
    ``job_options`` and either is alike one product option (:data:`SIMILARITY_CUTOFF`) or
    abbreviates exactly one (ends inside one of its words, or spans more than one word:
    ``--checkpoint-int``, ``--max-epoch``; not ``--events`` for ``--events-log``). Arguments
    after ``--`` are the job's, whatever they look like.

    Raises:
        ConfigurationError: ``unknown option --X; did you mean --Y?``
    """
    own = {"--" + name.lstrip("-") for name in job_options}
    for arg in rest:
        if arg == "--":
            return
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in own:
            continue
        suggestion = _misspelled(name, product_options)
        if suggestion is not None:
            raise ConfigurationError(f"unknown option {name}; did you mean {suggestion}?")


def _misspelled(name: str, product_options: Sequence[str]) -> str | None:
    """The product option that ``name`` most likely meant, if any."""
    bare = name[2:]
    longer = [f for f in product_options if f.startswith(name) and f != name]
    if len(longer) == 1 and len(bare) >= MIN_ABBREVIATION:
        after = longer[0][len(name)]
        if after != "-" or "-" in bare:  # ends inside a word, or spans several words
            return longer[0]
    bare_options = {f[2:]: f for f in product_options if f.startswith("--")}
    close = difflib.get_close_matches(bare, list(bare_options), n=1, cutoff=SIMILARITY_CUTOFF)
    return bare_options[close[0]] if close else None


def _check_no_control_plane_options(
    ns: argparse.Namespace, parser: argparse.ArgumentParser
) -> None:
    """A --standalone job talks to no control plane: an option that only tells it how to
    reach one was meant for a connected run, and is refused rather than ignored."""
    given = [
        flag
        for dest, flag in CONTROL_PLANE_OPTIONS.items()
        if getattr(ns, dest) != parser.get_default(dest)
    ]
    if given:
        raise ConfigurationError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for a job connected to "
            "the control plane; a --standalone job runs without one (drop --standalone to "
            "connect)"
        )


def _min_epoch_records(ns: argparse.Namespace) -> int:
    """``--min-epoch-records``, or by default DEFAULT_MIN_EPOCH_RECORDS but never above
    ``--max-epoch-records`` (a smaller maximum keeps working alone).

    Raises:
        ConfigurationError: both given, the minimum above the maximum.
    """
    if ns.min_epoch_records is None:
        return min(DEFAULT_MIN_EPOCH_RECORDS, ns.max_epoch_records)
    if ns.min_epoch_records > ns.max_epoch_records:
        raise ConfigurationError(
            f"--min-epoch-records ({ns.min_epoch_records:,}) must not exceed "
            f"--max-epoch-records ({ns.max_epoch_records:,})"
        )
    return int(ns.min_epoch_records)


def _redis_url(ns: argparse.Namespace) -> str:
    """Check the connected mode's options; return the control plane's Redis URL:
    ``--redis-url``, else ``REDIS_URL``, else the file ``sparkpoint server`` writes."""
    if not ns.stream_prefix.strip() or any(c.isspace() for c in ns.stream_prefix):
        raise ConfigurationError(
            "--stream-prefix (by default SPARKPOINT_STREAM_PREFIX) must be a non-empty name "
            f"without spaces, got {ns.stream_prefix!r}"
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
