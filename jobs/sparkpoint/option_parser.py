"""The product options of ``sparkpoint run``, grouped as Flink groups its configuration.

Each option's help names its Flink configuration key where one exists, so that a Flink user
finds the setting they know. :func:`product_parser` is what
:func:`~sparkpoint.options.parse_job_options` parses with; :func:`help_text` is what
``sparkpoint run --help`` prints.
"""

from __future__ import annotations

import argparse
import math
import os

from sparkpoint.checkpointing.restart import parse_duration_ms
from sparkpoint.errors import ConfigurationError
from sparkpoint.protocol import CheckpointingMode

#: The control plane's stream prefix, as ``sparkpoint server`` reads it (its settings).
STREAM_PREFIX_ENV = "SPARKPOINT_STREAM_PREFIX"

USAGE = "sparkpoint run JOB.py [PRODUCT OPTIONS] [JOB OPTIONS]"

DESCRIPTION = (
    "Run a job file. Product options (below) and the job's own options may come in any order "
    "after the job file; `sparkpoint run JOB.py --help` shows the job's own options, if it "
    "has a parser. A job option that looks like a misspelled product option is refused."
)


def _flink(key: str, text: str) -> str:
    return f"{text} [Flink: {key}]"


def seconds(text: str) -> float:
    """An option's time: seconds (``1.5``), or a number and a unit as Flink writes durations
    (``500ms``, ``10 s``, ``2 min``): a Flink user's ``1000`` is then written ``1000ms``.

    Raises:
        argparse.ArgumentTypeError: naming the value that is neither.
    """
    try:
        value = float(text)
    except ValueError:
        try:
            return parse_duration_ms(text) / 1000
        except ConfigurationError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a time: seconds (1.5) or a number and a unit "
                "(500ms, 10 s, 2 min, 1 h)"
            ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: a finite number of seconds")
    return value


def product_parser() -> argparse.ArgumentParser:
    """The product options (no ``--help``: the job's parser may have its own)."""
    p = argparse.ArgumentParser(
        prog="sparkpoint run",
        usage=USAGE,
        description=DESCRIPTION,
        add_help=False,
        allow_abbrev=False,
    )
    job = p.add_argument_group("job")
    job.add_argument(
        "--standalone",
        action="store_true",
        help="run without a control plane: this process is the checkpoint authority",
    )
    job.add_argument(
        "--job-id",
        help="the job's id (default: a new random one). Connected, the same id runs the job "
        "again from the newest checkpoint of its line; --standalone, it continues the "
        "checkpoint ids but starts from --from-checkpoint or the beginning",
    )
    job.add_argument(
        "--parallelism",
        type=int,
        default=2,
        metavar="N",
        help=_flink("parallelism.default", "keyed subtasks per keyed operator (default 2)"),
    )
    job.add_argument(
        "--max-parallelism",
        type=int,
        default=128,
        metavar="N",
        help=_flink("pipeline.max-parallelism", "key groups, the upper bound of rescaling"),
    )

    cp = p.add_argument_group("checkpointing")
    cp.add_argument(
        "--checkpoint-interval",
        type=seconds,
        default=0.0,
        metavar="SECONDS",
        help=_flink(
            "execution.checkpointing.interval",
            "0 (default) disables checkpoints; like every SECONDS here, also with a unit: "
            "500ms, 2min",
        ),
    )
    cp.add_argument(
        "--checkpoint-timeout",
        type=seconds,
        default=600.0,
        metavar="SECONDS",
        help=_flink("execution.checkpointing.timeout", "a checkpoint expires after it"),
    )
    cp.add_argument(
        "--min-pause",
        type=seconds,
        default=0.0,
        metavar="SECONDS",
        help=_flink("execution.checkpointing.min-pause", "between a checkpoint and the next"),
    )
    cp.add_argument(
        "--tolerable-failures",
        type=int,
        default=0,
        metavar="N",
        help=_flink(
            "execution.checkpointing.tolerable-failed-checkpoints",
            "consecutive failed checkpoints before the job fails over",
        ),
    )
    cp.add_argument(
        "--retained",
        type=int,
        default=1,
        metavar="N",
        help=_flink("state.checkpoints.num-retained", "completed checkpoints kept"),
    )
    cp.add_argument(
        "--mode",
        choices=[m.value for m in CheckpointingMode],
        default="exactly_once",
        help=_flink("execution.checkpointing.mode", "aligned barriers, or no alignment"),
    )
    cp.add_argument(
        "--checkpoint-dir",
        metavar="URL",
        help=_flink("state.checkpoints.dir", "where checkpoints go (file://...)"),
    )
    cp.add_argument(
        "--checkpoint-storage",
        choices=["filesystem", "jobmanager"],
        help=_flink(
            "state.checkpoint-storage",
            "filesystem with --checkpoint-dir (the default then), else jobmanager (inline)",
        ),
    )
    cp.add_argument(
        "--max-inline-state",
        type=int,
        default=1 << 20,
        metavar="BYTES",
        help=_flink(
            "state.storage.fs.memory-threshold", "larger state handles go to files, not inline"
        ),
    )

    state = p.add_argument_group("state backend")
    state.add_argument(
        "--state-backend",
        choices=["hashmap", "rocksdb"],
        default="hashmap",
        help=_flink("state.backend.type", "where keyed state lives (default hashmap)"),
    )
    state.add_argument(
        "--incremental",
        action="store_true",
        help=_flink(
            "execution.checkpointing.incremental",
            "rocksdb: upload only the files a checkpoint adds",
        ),
    )
    state.add_argument(
        "--local-dir",
        metavar="DIR",
        help=_flink(
            "taskmanager.state.local.root-dirs",
            "working state and RocksDB instances (default: <tmp>/sparkpoint-local)",
        ),
    )
    state.add_argument(
        "--durable-working-state",
        choices=["auto", "on", "off"],
        default="auto",
        help="also keep each epoch's working state in checkpoint storage, so a subtask moved "
        "to another executor rebuilds it (auto: on unless the master is local)",
    )

    restore = p.add_argument_group("savepoints and restore")
    restore.add_argument(
        "--from-checkpoint",
        metavar="PATH",
        help=_flink("execution.savepoint.path", "start from this checkpoint or savepoint"),
    )
    restore.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help=_flink(
            "execution.savepoint.ignore-unclaimed-state",
            "restore even if the snapshot has state of an operator the job no longer has",
        ),
    )
    restore.add_argument(
        "--savepoint-on-finish",
        metavar="DIR",
        help="standalone: end with a savepoint in DIR (also on SIGTERM: stop-with-savepoint)",
    )

    restart = p.add_argument_group("restart strategy")
    restart.add_argument(
        "--restart-strategy",
        choices=["none", "fixed-delay", "failure-rate", "exponential-delay"],
        help=_flink(
            "restart-strategy.type", "default: exponential-delay with checkpoints, else none"
        ),
    )
    restart.add_argument(
        "--restart-attempts",
        type=int,
        help=_flink("restart-strategy.fixed-delay.attempts", "implies fixed-delay"),
    )
    restart.add_argument(
        "--restart-delay",
        type=seconds,
        metavar="SECONDS",
        help=_flink("restart-strategy.fixed-delay.delay", "implies fixed-delay"),
    )
    restart.add_argument(
        "--restart-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other restart-strategy.* key, repeatable",
    )
    restart.add_argument(
        "--failover-strategy",
        choices=["region", "full"],
        default="region",
        help=_flink(
            "jobmanager.execution.failover-strategy",
            "region: a failure restarts only its independent pipeline (default)",
        ),
    )

    spark = p.add_argument_group("execution on Spark (epochs)")
    spark.add_argument(
        "--master",
        default=os.environ.get("SPARKPOINT_MASTER", "local[*]"),
        help="Spark master URL (spark.master; default $SPARKPOINT_MASTER or local[*])",
    )
    spark.add_argument(
        "--epoch-target-ms",
        type=float,
        default=1000.0,
        metavar="MS",
        help="how long the planner aims each epoch (one Spark job) to take",
    )
    spark.add_argument(
        "--max-epoch-records",
        type=int,
        default=4_000_000,
        metavar="N",
        help="upper bound of the records an epoch reads",
    )
    spark.add_argument(
        "--min-epoch-records",
        type=int,
        default=None,
        metavar="N",
        help="lower bound of the records an epoch reads per split (default 1,000, at most "
        "--max-epoch-records); also the size of a driver's first epoch, which mostly starts "
        "Spark's Python workers",
    )
    spark.add_argument(
        "--alignment-buffer",
        type=int,
        default=64 << 20,
        metavar="BYTES",
        help="records a keyed subtask holds back while aligning a barrier, in memory up to "
        "this many bytes, past it in a file of --local-dir (default 64 MiB; 0: all to disk)",
    )
    spark.add_argument(
        "--events-log",
        metavar="FILE",
        help="standalone: append the job's events (checkpoints, failures) as JSON lines",
    )

    connected = p.add_argument_group("control plane (without --standalone)")
    connected.add_argument(
        "--redis-url",
        help="the control plane's Redis (default: $REDIS_URL, else the file `sparkpoint "
        "server` writes in its data directory)",
    )
    connected.add_argument(
        "--stream-prefix",
        # What `sparkpoint server` reads: one setting in a shell runs both alike.
        default=os.environ.get(STREAM_PREFIX_ENV) or "sparkpoint",
        help=f"the control plane's stream prefix (default: ${STREAM_PREFIX_ENV}, as `sparkpoint "
        "server` reads it, else sparkpoint)",
    )
    connected.add_argument(
        "--control-plane-timeout",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the control plane's first decision",
    )

    console = p.add_argument_group("console output")
    console.add_argument(
        "--quiet",
        action="store_true",
        help="print only failures, restores and how the job ended",
    )
    console.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="one line of text per event (default), or one JSON object per line",
    )
    console.add_argument(
        "--log-every",
        type=int,
        default=10,
        metavar="N",
        help="print the 1st and then every N-th completed checkpoint (default 10)",
    )

    testing = p.add_argument_group("testing (failure injection)")
    testing.add_argument(
        "--fail-after",
        type=int,
        metavar="RECORDS",
        help="attempt 1 fails once the first split of the first source has read RECORDS "
        "records (a test of recovery; a warning says when the split ended before)",
    )
    testing.add_argument(
        "--crash-after-checkpoint",
        type=int,
        metavar="N",
        help="the driver is killed (SIGKILL) once checkpoint N completed, before its commit",
    )
    return p


def help_text() -> str:
    """``sparkpoint run --help``."""
    return product_parser().format_help()
