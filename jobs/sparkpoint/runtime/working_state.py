"""Versioned working state of a subtask between epochs, on the executor's local disk.

An epoch opens version *v* of a subtask's state and writes *v+1*; the driver makes *v+1*
current only once it accepted the epoch (execution contract 4, as Spark's own state store
does). The version tag names the job attempt, epoch and task attempt that wrote it, so a copy
left by a losing task attempt, or one from an older attempt, is never reused: opening a tag
that is not on this disk raises :class:`WorkingStateLostError`, which fails the epoch, and the
job recovers from its latest checkpoint (state, source positions and sink transactions).
"""

from __future__ import annotations

import contextlib
import os
import pickle
from dataclasses import dataclass, field

from sparkpoint.connectors.sinks import OpenTransaction
from sparkpoint.errors import SparkpointError
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.state.hashmap import HashMapKeyedStateBackend

_MAGIC = b"SPWS1"


class WorkingStateLostError(SparkpointError):
    """The expected working-state version is not on this executor's disk."""


@dataclass
class WorkingState:
    """What a subtask carries from one epoch to the next."""

    backend: HashMapKeyedStateBackend | None = None  # pickled as is: no key-group regrouping
    open_txn: OpenTransaction | None = None
    pending: list[tuple[int, SinkTransactionModel]] = field(default_factory=list)


def version_dir(local_dir: str, job_id: str, uid: str, subtask: int) -> str:
    return os.path.join(local_dir, job_id, uid, str(subtask))


def save(directory: str, tag: str, state: WorkingState) -> str:
    """Write version ``tag`` (temp file, then atomic rename) and return its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{tag}.state")
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(_MAGIC)
        pickle.dump((tag, state), fh, protocol=5)
    os.replace(tmp, path)
    return path


def load(path: str, tag: str) -> WorkingState:
    """Open version ``tag`` at ``path``; anything else is refused."""
    try:
        with open(path, "rb") as fh:
            if fh.read(len(_MAGIC)) != _MAGIC:
                raise WorkingStateLostError(f"{path} is not a Sparkpoint working-state file")
            found_tag, state = pickle.load(fh)
    except FileNotFoundError as err:
        raise WorkingStateLostError(
            f"working state {tag} is not on this executor ({path}); recovering from the "
            "latest checkpoint"
        ) from err
    if found_tag != tag:
        raise WorkingStateLostError(f"{path} holds version {found_tag}, expected {tag}")
    if not isinstance(state, WorkingState):
        raise WorkingStateLostError(f"{path} does not hold working state")
    return state


def prune(directory: str, keep: set[str]) -> None:
    """Delete versions other than ``keep`` (older ones and those of losing attempts)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name not in keep:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))
