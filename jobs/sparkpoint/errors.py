"""Errors raised by the Sparkpoint runtime: one root, small subclasses that name what failed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def error_text(err: BaseException) -> str:
    """``err``'s message on one line (whitespace runs made one space), or its class's name
    when it has none."""
    return " ".join(str(err).split()) or type(err).__name__


@contextlib.contextmanager
def naming_file(path: str) -> Iterator[None]:
    """An OSError raised inside names ``path`` when it names no file: a write to an open
    file that fails for a full disk says only ``[Errno 28] No space left on device``, and
    the operator must know which disk (the output's, the local directory's) filled up."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror, path) from err


class SparkpointError(Exception):
    """Root of every error the runtime raises on purpose."""


class ConfigurationError(SparkpointError):
    """An option or a job graph is invalid; the message names the option or operator."""


class CheckpointError(SparkpointError):
    """A checkpoint could not be taken, completed or restored."""


class CheckpointDeclinedError(CheckpointError):
    """A subtask declined a checkpoint (for example: snapshot above the inline size limit)."""

    def __init__(self, checkpoint_id: int, operator_id: str, subtask: int, reason: str) -> None:
        super().__init__(
            f"checkpoint {checkpoint_id} declined by {operator_id}[{subtask}]: {reason}"
        )
        self.checkpoint_id = checkpoint_id
        self.operator_id = operator_id
        self.subtask = subtask
        self.reason = reason


class CorruptSnapshotError(CheckpointError):
    """A state handle's bytes do not match its recorded size or checksum."""


class CheckpointNotFoundError(CheckpointError):
    """A checkpoint or savepoint to restore does not exist (or has no ``_metadata``)."""


class StaleAttemptError(SparkpointError):
    """A message carries a job attempt older than the current one and is refused."""


class StorageLocationError(SparkpointError):
    """A path lies outside the storage root it must stay under."""


class InjectedFailure(SparkpointError):
    """A failure injected on purpose by ``--fail-after`` or :mod:`sparkpoint.testing`.

    ``raised_at_ms``: the wall clock where it was raised (a task's), appended to the message
    (``at unix time <seconds>``): only the message crosses Spark to the driver, and how long
    the driver took to hear of the failure is measured from it (``bench_recovery.py``).
    """

    def __init__(self, message: str, raised_at_ms: int | None = None) -> None:
        if raised_at_ms is not None:
            message = f"{message} at unix time {raised_at_ms / 1000:.3f}"
        super().__init__(message)
        self.raised_at_ms = raised_at_ms
