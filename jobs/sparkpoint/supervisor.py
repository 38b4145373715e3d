"""Supervises a job's driver process: a crashed driver is restarted.

``sparkpoint run`` starts the driver as a child process with a fixed job id. A driver that
ends on its own (0 finished, 1 failed for good, 2 invalid configuration) ends the run; one
that dies otherwise (killed, out of memory, a signal) is restarted:

- ``--standalone``: with ``--from-checkpoint`` pointing at the latest checkpoint that has
  ``_metadata`` in its checkpoint directory, so the new driver restores state, source
  positions and the sink transactions that checkpoint still has to commit. Completed
  checkpoints are durable before their sinks commit, so this keeps exactly-once across
  driver crashes.
- connected to a control plane: with the same arguments. The new driver registers with a new
  incarnation, and the control plane fails the job over to its latest completed checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence

from sparkpoint.checkpointing.storage import checkpoint_storage_from_options
from sparkpoint.options import parse_job_options

#: Exit codes with which a driver ends by itself (no restart).
DRIVER_EXITS = frozenset({0, 1, 2})
SUPERVISED_ENV = "SPARKPOINT_SUPERVISED"


def _option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _without(args: list[str], name: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == name:
            skip = True
            continue
        if arg.startswith(name + "="):
            continue
        out.append(arg)
    return out


def latest_checkpoint_path(args: list[str], job_id: str) -> str | None:
    """The external path of the job's latest completed checkpoint, if it has one on storage."""
    options, _ = parse_job_options(args)
    if options.checkpoint_dir is None:
        return None
    storage = checkpoint_storage_from_options(
        options.checkpoint_storage, options.checkpoint_dir, options.max_inline_state_bytes
    )
    ids = storage.completed_checkpoint_ids(job_id)
    return storage.checkpoint_path(job_id, ids[-1]) if ids else None


def supervise(
    job: str,
    job_args: Sequence[str],
    *,
    max_restarts: int = 3,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
) -> int:
    """Run the job's driver in a child process, restarting it after a crash.

    Steps: (1) fix the job id, (2) run the driver, (3) on a crash start a new driver, up to
    ``max_restarts`` times (standalone: from the latest completed checkpoint it finds).
    """
    args = list(job_args)
    standalone = parse_job_options(args)[0].standalone  # an invalid option fails here
    # Step 1
    job_id = _option(args, "--job-id")
    if job_id is None:
        job_id = uuid.uuid4().hex
        args = ["--job-id", job_id, *args]
    env = {**os.environ, SUPERVISED_ENV: "1"}
    restarts = 0
    while True:
        # Step 2
        rc = subprocess.call([sys.executable, "-m", "sparkpoint.cli", "run", job, *args], env=env)
        if rc in DRIVER_EXITS:
            return rc
        # Step 3
        restarts += 1
        what = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
        if restarts > max_restarts:
            log(
                f"sparkpoint run: driver of job {job_id} crashed ({what}) "
                f"{restarts} times; giving up"
            )
            return 1
        if not standalone:
            log(
                f"sparkpoint run: driver of job {job_id} crashed ({what}); restarting "
                "(the control plane names the checkpoint to restore)"
            )
            continue
        path = latest_checkpoint_path(args, job_id)
        args = _without(args, "--from-checkpoint")
        if path is not None:
            args += ["--from-checkpoint", path]
        log(
            f"sparkpoint run: driver of job {job_id} crashed ({what}); restarting "
            + (f"from {path}" if path else "from the beginning (no completed checkpoint)")
        )
