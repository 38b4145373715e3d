"""One standalone run of a job at a time on a machine: a lock file in its local directory.

Two ``sparkpoint run --standalone --job-id J`` at once (a cron entry that overlapped the last
one, a command line run twice) wrote the same checkpoints (``chk-N`` of both, in one
directory), the same working-state versions, and committed into the same output: each
restored the other's half-written checkpoints, both failed, and the output held wrong counts
and duplicate lines. A connected run has its lease in Redis
(:mod:`sparkpoint.runtime.driver_lease`); a standalone run holds ``<local-dir>/<job-id>.lock``
(an exclusive ``flock``) from its start to its end. ``sparkpoint run`` takes it and hands it to
each driver it starts, so the kernel releases it only when the last process of the run ended,
however it ended (kill -9 included): a run restarted after a crash takes it at once. A second
run is refused at once, naming the process that holds it.

Runs on different machines that share a checkpoint directory are not seen (nor runs with
different ``--local-dir``): give each its own ``--job-id``.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time

from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.runtime.driver_lease import describe_process


class JobRunningError(SparkpointError):
    """Another standalone run of the job holds its lock: a job runs one driver at a time."""


def lock_path(local_dir: str, job_id: str) -> str:
    return os.path.join(local_dir, f"{job_id}.lock")


def hold_run_lock(local_dir: str, job_id: str) -> int:
    """Take the job's run lock; the descriptor that holds it (inheritable: pass it to the
    drivers; closed by the process's end).

    Raises:
        JobRunningError: another run holds it (its process named).
        ConfigurationError: the local directory cannot be written.
    """
    path = lock_path(local_dir, job_id)
    try:
        os.makedirs(local_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ConfigurationError(f"cannot write to --local-dir {local_dir}: {err}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise JobRunningError(
            f"job {job_id} is running standalone in another process ({holder}; it holds "
            f"{path}): a job runs one driver at a time, and two runs would write the same "
            "checkpoints and output. Wait for it to end or stop it (Ctrl-C, kill -TERM), or "
            "run this one with another --job-id"
        ) from None
    holder = describe_process(os.getpid(), socket.gethostname(), int(time.time() * 1000))
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{holder}\n".encode(), 0)
    os.set_inheritable(fd, True)
    return fd
