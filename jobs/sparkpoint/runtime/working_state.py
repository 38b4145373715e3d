"""Versioned working state of a subtask between epochs: a local copy and a durable one.

An epoch opens version *v* of a subtask's state and writes *v+1*; the driver makes *v+1*
current only once it accepted the epoch (execution contract 4, as Spark's own state store
does). The version tag names the job attempt, epoch and task attempt that wrote it, so a copy
left by a losing task attempt, or one from an older attempt, is never reused.

A version has two parts. The sink's transactions (the open one and those pre-committed but not
yet committed) are small and written whole (``<tag>.state``). The keyed state is written by
its backend (:meth:`~sparkpoint.state.backend.KeyedStateBackend.save_version`) at a cost that
follows what the epoch changed, through a :class:`SubtaskVersionStore`.

Each version goes to the executor's local disk and, when the job keeps durable working state
(on a cluster: by default whenever the master is not ``local``), to the checkpoint storage as
well. A subtask that lands on an executor without the local copy reads the durable one; when
neither is there, opening it raises :class:`WorkingStateLostError`, which fails the epoch, and
the job recovers from its latest checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.checkpointing.file_ops import write_local_atomically
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.connectors.sinks import OpenTransaction
from sparkpoint.errors import SparkpointError
from sparkpoint.failure_streak import FailureStreak
from sparkpoint.protocol import SinkTransactionModel

log = logging.getLogger(__name__)

_MAGIC = b"SPWS4"


class WorkingStateLostError(SparkpointError):
    """The expected working-state version is neither on this executor nor stored durably."""


@dataclass
class WorkingState:
    """What a subtask carries from one epoch to the next (keyed state goes through its
    backend's own versions): each sink's open transaction by sink uid, the pre-committed
    transactions of every sink (each names its sink), and the operator state of its
    checkpointed functions (None until an epoch wrote it)."""

    open_txns: dict[str, OpenTransaction] = field(default_factory=dict)
    pending: list[tuple[int, SinkTransactionModel]] = field(default_factory=list)
    operator_state: dict[str, dict[str, tuple[Any, list[Any]]]] | None = None


@dataclass
class SubtaskVersionStore:
    """Where one subtask's keyed-state versions live: ``local_dir`` on this executor and,
    when ``durable``, the job's checkpoint storage (``<job>/working/<uid>-<subtask>/``).
    ``durable_url`` is where the durable copy of the version to open starts."""

    local_dir: str
    storage: CheckpointStorage
    job_id: str
    name: str
    durable: bool
    durable_url: str | None = None

    def write_durable(self, name: str, data: bytes) -> str | None:
        if not self.durable:
            return None
        return write_durable(self.storage, self.job_id, self.name, name, data)

    def read_durable(self, url: str) -> bytes | None:
        return self.storage.read_working_state(url)


#: Failed durable copies are logged at most once in this many seconds per process: a storage
#: that stays full (and takes a small file now and then) would log every subtask's epoch.
DURABLE_FAILURES_LOGGED_EVERY_S = 10.0


def _durable_copies_streak() -> FailureStreak:
    """The failures in a row of this process's durable copies (every subtask's, every
    thread's: a full storage fails them all alike, so one streak tells it once)."""
    return FailureStreak(
        "durable copies of working state",
        log,
        traceback=False,  # the storage's failure, expected: one line
        every_s=DURABLE_FAILURES_LOGGED_EVERY_S,
        then="the version is kept on this executor only",
        again="are written again",
        error_type=True,
    )


_DURABLE_COPIES = _durable_copies_streak()


def write_durable(
    storage: CheckpointStorage, job_id: str, name: str, tag: str, data: bytes
) -> str | None:
    """Write a durable copy of a subtask's working state; its URL, or None when the storage
    cannot take it (an ``OSError``: full, read-only, away). The epoch goes on with its local
    copy: the next epoch on this executor opens that, and one on another executor finds no
    copy and recovers from the latest checkpoint (:class:`WorkingStateLostError`), as without
    durable copies.
    Failures are logged at most once in :data:`DURABLE_FAILURES_LOGGED_EVERY_S` seconds, and
    the first success after them once."""
    try:
        url = storage.write_working_state(job_id, name, tag, data)
    except OSError:  # the storage's failure; a bug or a refused name still raises
        _DURABLE_COPIES.failed(f"the durable copy of working state {tag} of {name}")
        return None
    _DURABLE_COPIES.ended()
    return url


def version_dir(local_dir: str, job_id: str, uid: str, subtask: int) -> str:
    return os.path.join(local_dir, job_id, uid, str(subtask))


def file_name(tag: str) -> str:
    return f"{tag}.state"


def encode(tag: str, state: WorkingState) -> bytes:
    """The bytes of version ``tag`` (the same for the local and the durable copy)."""
    return _MAGIC + pickle.dumps((tag, state), protocol=5)


def decode(data: bytes, tag: str, where: str) -> WorkingState:
    """Open version ``tag`` from ``data`` read at ``where``; anything else is refused."""
    if not data.startswith(_MAGIC):
        raise WorkingStateLostError(f"{where} is not a Sparkpoint working-state file")
    found_tag, state = pickle.loads(data[len(_MAGIC) :])
    if found_tag != tag:
        raise WorkingStateLostError(f"{where} holds version {found_tag}, expected {tag}")
    if not isinstance(state, WorkingState):
        raise WorkingStateLostError(f"{where} does not hold working state")
    return state


def save_local(directory: str, tag: str, data: bytes) -> str:
    """Write version ``tag`` (temp file, then atomic rename) and return its path."""
    path = os.path.join(directory, file_name(tag))
    write_local_atomically(path, data)
    return path


def read_local(directory: str, tag: str) -> bytes | None:
    """The local copy of version ``tag``, or None when this executor does not have it."""
    try:
        with open(os.path.join(directory, file_name(tag)), "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def prune(directory: str, keep: set[str]) -> None:
    """Delete local versions other than ``keep`` (older ones and those of losing attempts)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name not in keep:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))
