"""Supervises a job's driver process: a driver that dies is restarted under the restart strategy.

``sparkpoint run`` starts the driver as a child process, in a process group of its own, with a
fixed job id. Its exit codes (the driver's own, when it ends by itself):

- ``0``: the job finished.
- ``1``: the job failed for good: its restart strategy allows no more restarts (in the
  driver, or here after a driver died), or the job raised an error.
- ``2``: invalid configuration; nothing ran (or the driver refused it before Spark started).
- ``75`` (:data:`EXIT_DRIVER_LOST`, sysexits' ``EX_TEMPFAIL``): a driver that lost its Spark
  (the JVM died, the SparkContext stopped) ends with it: recoverable. So does a connected
  driver that lost its control plane's Redis (``ControlPlaneLostError``). The supervisor restarts
  such a driver; ``sparkpoint run`` only ends with it when run with ``SPARKPOINT_SUPERVISED=1``.
- ``128 + N`` (130 for SIGINT, 143 for SIGTERM): canceled by signal N. The job stopped at an
  epoch boundary and reported CANCELED; work since its last completed checkpoint stays
  uncommitted, and a later ``--from-checkpoint`` of that checkpoint aborts it.

Any other end of the driver is a death: killed by a signal (the OOM killer, ``kill -9``),
:data:`EXIT_DRIVER_LOST`, or an exit code not listed above. Each death is logged in one line
with its cause; standalone, it goes through the job's restart strategy, built from the job's
options as the driver builds it (Flink's defaults: ``exponential-delay`` when checkpointing is
on, else ``none``), with its delays. The restarted driver gets the cause in
``SPARKPOINT_PREVIOUS_DRIVER_FAILURE`` and starts:

- ``--standalone``: from the newest checkpoint that this run completed (its ``_metadata`` is in
  the job's checkpoint directory) whose state files verify, else as the run started (its
  ``--from-checkpoint``, or the beginning). Completed checkpoints are durable before their
  sinks commit, and checkpoint ids and attempts keep increasing past everything in storage, so
  this keeps exactly-once. A checkpoint with a missing or altered file is skipped (logged, with
  the file); when this run completed checkpoints but none verifies, the driver is not
  restarted (exit 1): starting as the run started would commit their output again.
- connected to a control plane: at once, with the same arguments. The new driver registers
  with a new incarnation and the cause; the control plane fails the job over under the job's
  restart strategy there (its delay, or a refusal that ends the new driver with exit 1), so
  the supervisor applies no strategy of its own: an operator's change of the strategy through
  the REST API holds.

A ``--standalone`` job with periodic checkpoints (``--checkpoint-interval`` > 0) must have a
``--checkpoint-dir``: checkpoints kept in memory die with the driver, and a restarted driver
would produce again the output that they committed. Without periodic checkpoints the only
commit is the final checkpoint's: a driver that dies before it restarts from the beginning with
nothing committed (exactly-once); one that dies while committing it (after all input was
processed) repeats what it had committed. ``--checkpoint-dir`` closes that window too.

Signals: the first SIGTERM or SIGINT is forwarded to the driver, which cancels the job at its
next epoch boundary; the supervisor waits for it and restarts nothing. A second one kills the
driver's process group (the driver and its Spark JVM) at once. A supervisor that dies itself
(even by SIGKILL) leaves no orphan: on Linux its driver then gets SIGTERM and cancels.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import FrameType
from typing import IO

from sparkpoint.checkpointing.storage import CheckpointStorage, checkpoint_storage_from_options
from sparkpoint.errors import (
    CheckpointNotFoundError,
    ConfigurationError,
    CorruptSnapshotError,
    SparkpointError,
    StorageLocationError,
    error_text,
)
from sparkpoint.options import JobOptions, parse_job_options
from sparkpoint.run_lock import hold_run_lock
from sparkpoint.runtime.driver_lease import RUN_ID_ENV

EXIT_FINISHED = 0
EXIT_FAILED = 1
EXIT_INVALID_CONFIGURATION = 2
EXIT_DRIVER_LOST = 75
#: Exit codes with which a driver ends by itself (no restart); 128 + N: canceled by signal N.
DRIVER_EXITS = frozenset(
    {EXIT_FINISHED, EXIT_FAILED, EXIT_INVALID_CONFIGURATION}
    | {128 + s for s in (signal.SIGINT, signal.SIGTERM)}
)
SUPERVISED_ENV = "SPARKPOINT_SUPERVISED"
#: The one-line cause of the previous driver's death, set on a restarted driver.
PREVIOUS_FAILURE_ENV = "SPARKPOINT_PREVIOUS_DRIVER_FAILURE"
#: The descriptor of a file where a driver that ends with EXIT_DRIVER_LOST writes its cause
#: in one line. The file has no name (unlinked when made), so nothing is left behind however
#: the supervisor ends, SIGKILL included.
TERMINATION_LOG_ENV = "SPARKPOINT_TERMINATION_LOG_FD"


def exit_canceled(signum: int) -> int:
    """The exit code of a job canceled by signal ``signum``."""
    return 128 + signum


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


def check_supervised(options: JobOptions) -> None:
    """Refuse a job that a restarted driver could not recover exactly once.

    Raises:
        ConfigurationError: ``--standalone`` with periodic checkpoints but no checkpoint
            directory (its completed checkpoints would die with the driver).
    """
    if options.standalone and options.checkpoint.interval_ms > 0 and not options.checkpoint_dir:
        raise ConfigurationError(
            f"job {options.job_id}: --standalone with --checkpoint-interval > 0 needs "
            "--checkpoint-dir: checkpoints kept in memory die with a crashed driver, and its "
            "restart would repeat the output they committed"
        )


def _storage(options: JobOptions, checkpoint_dir: str) -> CheckpointStorage:
    return checkpoint_storage_from_options(
        options.checkpoint_storage, checkpoint_dir, options.max_inline_state_bytes
    )


def checkpoint_ids(options: JobOptions, job_id: str) -> list[int]:
    """The ids of the job's checkpoints that have ``_metadata`` in its checkpoint directory.

    Raises:
        ConfigurationError: the directory cannot be listed (no credentials for an object
            store, an unknown host...), on one line, instead of the storage library's trace.
    """
    if options.checkpoint_dir is None:
        return []
    storage = _storage(options, options.checkpoint_dir)
    try:
        return storage.completed_checkpoint_ids(job_id)
    except SparkpointError:
        raise
    except Exception as err:  # OSError locally; object stores raise their own errors too
        detail = error_text(err)
        raise ConfigurationError(
            f"cannot read --checkpoint-dir {options.checkpoint_dir}: {type(err).__name__}: {detail}"
        ) from err


def latest_checkpoint_path(
    options: JobOptions,
    job_id: str,
    *,
    after: int = 0,
    log: Callable[[str], None] = lambda m: None,
) -> str | None:
    """The external path of the newest completed checkpoint with an id above ``after`` whose
    state files verify (:meth:`~sparkpoint.checkpointing.storage_base.CheckpointStorage.
    verify_checkpoint`): a checkpoint with a missing or altered file (a lost shared file of
    incremental state) would fail the restarted driver at once, so the restart steps back to
    the newest one that verifies, logging each one it skips and why.

    Returns:
        That path, or None when no checkpoint above ``after`` completed.

    Raises:
        CorruptSnapshotError: checkpoints above ``after`` completed but none verifies (naming
            each and its file): starting as the run started instead would produce the
            output they committed again.
    """
    ids = [i for i in checkpoint_ids(options, job_id) if i > after]
    if not ids or options.checkpoint_dir is None:
        return None
    storage = _storage(options, options.checkpoint_dir)
    skipped = []
    for checkpoint_id in reversed(ids):
        try:
            storage.verify_checkpoint(job_id, checkpoint_id)
        except (CheckpointNotFoundError, CorruptSnapshotError, StorageLocationError) as err:
            log(f"sparkpoint run: job {job_id}: skipping checkpoint {checkpoint_id}: {err}")
            skipped.append(f"checkpoint {checkpoint_id} cannot be restored: {err}")
            continue
        return storage.checkpoint_path(job_id, checkpoint_id)
    raise CorruptSnapshotError(
        f"job {job_id}: no checkpoint of this run can be restored: {'; '.join(skipped)}"
    )


def fresh_start_warning(options: JobOptions, job_id: str, newest: int) -> str | None:
    """What to tell a standalone run that starts from the beginning although the job's
    directory holds completed checkpoints (``newest``: the id of the newest, 0 for none):
    its sinks commit again what those checkpoints committed. None when nothing to say."""
    if not options.standalone or options.from_checkpoint or options.checkpoint_dir is None:
        return None
    if newest <= 0:
        return None
    storage = _storage(options, options.checkpoint_dir)
    return (
        f"sparkpoint run: job {job_id} completed checkpoints up to {newest} in "
        f"{options.checkpoint_dir}; this run starts from the beginning (no --from-checkpoint) "
        "and its sinks commit again what they committed. To go on where it was: "
        f"--from-checkpoint {storage.checkpoint_path(job_id, newest)}"
    )


class _DriverProcess:
    """Runs driver processes one at a time, and turns SIGTERM/SIGINT into their cancel."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._forwarded = False
        self._stop = threading.Event()

    def __enter__(self) -> _DriverProcess:
        self._previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in self._previous:
            signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *_exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)
        self._stop.set()
        self._forward()

    def _forward(self) -> None:
        """First signal: forward it to the driver. Later ones: kill its process group."""
        proc = self._proc
        if proc is None or not self.signals:
            return
        try:
            if not self._forwarded:
                self._forwarded = True
                os.kill(proc.pid, self.signals[0])
            elif len(self.signals) > 1:
                os.killpg(proc.pid, signal.SIGKILL)  # its own group: start_new_session
        except ProcessLookupError:
            pass

    def run(self, cmd: list[str], env: dict[str, str], keep_fds: tuple[int, ...] = ()) -> int:
        """Start a driver and wait for it; its exit code (negative: killed by that signal).
        ``keep_fds``: descriptors the driver inherits (the run's lock)."""
        self._forwarded = False
        self._proc = subprocess.Popen(
            cmd,
            env=env,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,
            pass_fds=keep_fds,
        )
        self._forward()  # a signal that came while it started
        try:
            return self._proc.wait()
        finally:
            self._proc = None

    def wait(self, delay_ms: int) -> bool:
        """Wait ``delay_ms`` before a restart; False when a signal stopped the run meanwhile."""
        return not self._stop.wait(delay_ms / 1000)


def _terminate_with_parent() -> None:
    """In the new driver process: SIGTERM when its supervisor dies (Linux)."""
    die_with_parent(signal.SIGTERM)


def die_with_parent(sig: int) -> None:
    """Have the kernel send this process ``sig`` when its parent dies (Linux; elsewhere
    nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


_PR_SET_PDEATHSIG = 1


def _read_termination_log(log: IO[bytes]) -> str | None:
    """The last line a dead driver wrote in the termination log, which is emptied for the
    next one."""
    try:
        text = os.pread(log.fileno(), 1 << 16, 0).decode("utf-8", "replace").strip()
        os.ftruncate(log.fileno(), 0)
    except OSError:
        return None
    return text.splitlines()[-1] if text else None


def _death_cause(rc: int, message: str | None) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return message if message else f"exit code {rc}"


def supervise(
    job: str,
    job_args: Sequence[str],
    *,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> int:
    """Run the job's driver in a child process, restarting it after a death.

    Steps: (1) check the options and fix the job id, (2) run the driver, forwarding SIGTERM
    and SIGINT, (3) a driver that ended by itself (or was canceled) ends the run, (4) a death
    goes to the restart strategy (connected: a new driver at once, the control plane
    decides), (5) wait its delay and start a new driver (standalone: from
    the latest checkpoint this run completed).

    Returns:
        The exit code of ``sparkpoint run`` (see the module's docstring).

    Raises:
        ConfigurationError: the job's options are invalid or unsafe to supervise.
    """
    from sparkpoint.runtime.driver import job_restart_strategy

    # Step 1
    args = list(job_args)
    job_id = _option(args, "--job-id")
    if job_id is None:
        job_id = uuid.uuid4().hex
        args = ["--job-id", job_id, *args]
    options = parse_job_options(args)[0]
    check_supervised(options)
    # One standalone run of the job at a time (run_lock.py); its drivers hold the lock too.
    lock = (hold_run_lock(options.local_dir, job_id),) if options.standalone else ()
    strategy = job_restart_strategy(options)
    before = max(checkpoint_ids(options, job_id), default=0) if options.standalone else 0
    warning = fresh_start_warning(options, job_id, before)
    if warning is not None:
        log(warning)
    termination_log = tempfile.TemporaryFile()  # closed in the finally
    # PYTHONSAFEPATH (Python 3.11+): the current directory is not put first on the driver's
    # sys.path, where a folder named like the package (``sparkpoint/``) would shadow it as a
    # namespace package under an editable install; the driver appends it after the package
    # is imported (:func:`sparkpoint.cli._drive`), so the job's own modules there still import.
    env = {
        **os.environ,
        SUPERVISED_ENV: "1",
        TERMINATION_LOG_ENV: str(termination_log.fileno()),
        "PYTHONSAFEPATH": "1",
    }
    env.pop(PREVIOUS_FAILURE_ENV, None)
    # Its drivers take over the job's lease from one another at once (driver_lease.py).
    env[RUN_ID_ENV] = uuid.uuid4().hex
    driver_args = args
    try:
        with _DriverProcess() as driver:
            while True:
                # Step 2
                cmd = [sys.executable, "-m", "sparkpoint.cli", "run", job, *driver_args]
                kept = (*lock, termination_log.fileno())
                rc = driver.run(cmd, env, kept) if not driver.signals else EXIT_FAILED
                # Step 3
                if driver.signals:
                    return rc if rc in DRIVER_EXITS else exit_canceled(driver.signals[0])
                if rc in DRIVER_EXITS:
                    return rc
                # Step 4
                cause = _death_cause(rc, _read_termination_log(termination_log))
                if not options.standalone:
                    # The control plane is the authority: the new driver registers, and the
                    # job's restart strategy there (which an operator may have changed since)
                    # decides whether and when it restarts, or refuses it (exit 1).
                    log(
                        f"sparkpoint run: driver of job {job_id} died ({cause}); starting a new "
                        "driver: the control plane decides whether and when the job restarts"
                    )
                    env[PREVIOUS_FAILURE_ENV] = cause
                    continue
                decision = strategy.on_failure(round(time.monotonic() * 1000))
                if not decision.restart:
                    log(
                        f"sparkpoint run: driver of job {job_id} died ({cause}); not "
                        f"restarted: {decision.message}"
                    )
                    return EXIT_FAILED
                # Step 5
                try:
                    path = latest_checkpoint_path(options, job_id, after=before, log=log)
                except CorruptSnapshotError as err:
                    log(
                        f"sparkpoint run: driver of job {job_id} died ({cause}); not "
                        f"restarted: {err}"
                    )
                    return EXIT_FAILED
                driver_args = args
                where = (
                    f"from {options.from_checkpoint}"
                    if options.from_checkpoint
                    else "from the beginning (no checkpoint completed)"
                )
                if path is not None:
                    driver_args = [*_without(args, "--from-checkpoint"), "--from-checkpoint", path]
                    where = f"from {path}"
                log(
                    f"sparkpoint run: driver of job {job_id} died ({cause}); restarting {where} "
                    f"({decision.message})"
                )
                env[PREVIOUS_FAILURE_ENV] = cause
                if not driver.wait(decision.delay_ms):
                    return exit_canceled(driver.signals[0])
    finally:
        termination_log.close()
