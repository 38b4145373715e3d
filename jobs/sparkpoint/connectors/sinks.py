"""Two-phase-commit sinks (Flink's TwoPhaseCommitSinkFunction) and the transactional file sink.

A transaction holds what one sink subtask wrote between two barriers, possibly over several
epochs (one part per epoch and task attempt). The task side writes parts and pre-commits on a
barrier; the driver side commits a pre-committed transaction once its checkpoint completed,
and on restore commits the restored checkpoint's transactions again and aborts the rest.
"""

from __future__ import annotations

import abc
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkpoint.errors import CheckpointError, ConfigurationError
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch, Column, DictColumn


@dataclass
class OpenTransaction:
    """The sink transaction a subtask is writing: kept in its working state across epochs."""

    transaction_id: str
    parts: list[str] = field(default_factory=list)
    records: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class WriterContext:
    """Who writes: every part name carries these tags (execution contract, DESIGN §1)."""

    job_id: str
    uid: str
    subtask: int
    attempt: int
    epoch: int
    task_attempt: int


class SinkWriter(abc.ABC):
    """The task-side half of a sink, for one subtask during one epoch."""

    @abc.abstractmethod
    def write(self, batch: Batch) -> None:
        """Append records to the open transaction."""

    @abc.abstractmethod
    def pre_commit(self, checkpoint_id: int) -> SinkTransactionModel:
        """Flush and seal the open transaction for checkpoint ``checkpoint_id``; begin the next."""

    @abc.abstractmethod
    def close_epoch(self) -> OpenTransaction:
        """Flush what this epoch wrote; the returned open transaction goes to working state."""


class TwoPhaseCommitSink(abc.ABC):
    """A transactional sink: begin, pre-commit (task side), commit and abort (driver side)."""

    @abc.abstractmethod
    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        """A writer for one subtask and epoch, continuing ``open_txn`` when given."""

    @abc.abstractmethod
    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        """Make a pre-committed transaction visible. Idempotent. Returns parts committed now."""

    @abc.abstractmethod
    def abort_uncommitted(self, uid: str, keep: set[str]) -> int:
        """Delete every uncommitted part of sink ``uid`` not in ``keep``; returns how many."""


def _json_text(value: Any) -> str:
    return json.dumps(value.item() if hasattr(value, "item") else value)


def _json_values(col: np.ndarray, distinct: bool = False) -> list[str]:
    """Each element of a plain array as JSON text.

    Numbers and bools are converted in numpy; anything else is JSON-encoded once per distinct
    value (``numpy.unique``), or once per element when ``distinct`` says they are few.
    """
    if col.dtype.kind in "iub":
        values = col.astype(str) if col.dtype.kind != "b" else np.where(col, "true", "false")
        return values.tolist()
    if distinct:
        return [_json_text(v) for v in col]
    uniq, inverse = np.unique(col, return_inverse=True)
    texts = [_json_text(v) for v in uniq]
    return list(map(texts.__getitem__, inverse.reshape(-1).tolist()))


def _json_column(col: Column) -> list[str]:
    """Each record of a column as JSON text; a DictColumn encodes its values once, O(n)."""
    if isinstance(col, DictColumn):
        texts = _json_values(col.values, distinct=True)
        return list(map(texts.__getitem__, col.codes.tolist()))
    return _json_values(col)


def format_json_lines(batch: Batch) -> str:
    """Records as JSON lines (``{"app_id": "a", "pv": 3}``), vectorized for columnar batches."""
    if not len(batch):
        return ""
    if not batch.is_columnar:
        return "".join(json.dumps(r) + "\n" for r in batch.rows)
    columns = batch.columns
    # One str.format per record: '{"app_id": {}, "pv": {}}' with the names' braces escaped.
    fields = (json.dumps(name).replace("{", "{{").replace("}", "}}") + ": {}" for name in columns)
    template = "{{" + ", ".join(fields) + "}}\n"
    return "".join(map(template.format, *(_json_column(col) for col in columns.values())))


class _FileSinkWriter(SinkWriter):
    def __init__(self, sink: FileSink, ctx: WriterContext, open_txn: OpenTransaction | None):
        self._sink = sink
        self._ctx = ctx
        self._seq = 0
        self._txn = open_txn or self._begin()
        self._fh: Any = None
        self._part: str | None = None

    def _begin(self) -> OpenTransaction:
        c = self._ctx
        self._seq += 1
        txn_id = f"{c.uid}-{c.subtask}-{c.job_id[:8]}-a{c.attempt}-e{c.epoch}-{self._seq}"
        return OpenTransaction(transaction_id=txn_id)

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self._fh is None:
            c = self._ctx
            self._part = f".{self._txn.transaction_id}.e{c.epoch}-t{c.task_attempt}.inprogress"
            self._fh = open(os.path.join(self._sink.directory, self._part), "w", encoding="utf-8")
        text = self._sink.formatter(batch)
        self._fh.write(text)
        self._txn.records += len(batch)
        self._txn.bytes += len(text)

    def _close_part(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None
            assert self._part is not None
            self._txn.parts.append(self._part)
            self._part = None

    def pre_commit(self, checkpoint_id: int) -> SinkTransactionModel:
        self._close_part()
        txn = self._txn
        sealed = SinkTransactionModel(
            transaction_id=txn.transaction_id,
            parts=list(txn.parts),
            records=txn.records,
            bytes=txn.bytes,
        )
        self._txn = self._begin()
        return sealed

    def close_epoch(self) -> OpenTransaction:
        self._close_part()
        return self._txn


class FileSink(TwoPhaseCommitSink):
    """Writes JSON lines into ``directory``; a transaction's parts become visible by rename.

    Part files start hidden (``.<txn>.e<epoch>-t<task attempt>.inprogress``); commit renames
    each to ``part-<txn>.e<epoch>-t<task attempt>.jsonl`` with an atomic ``os.replace``, so a
    reader sees a transaction's lines only once it committed. Committed output is every file
    whose name does not start with ``.`` or ``_``.
    """

    def __init__(self, directory: str, formatter: Any = format_json_lines) -> None:
        if not directory:
            raise ConfigurationError("FileSink needs an output directory (--output)")
        self.directory = os.path.abspath(directory)
        self.formatter = formatter
        os.makedirs(self.directory, exist_ok=True)

    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        os.makedirs(self.directory, exist_ok=True)
        return _FileSinkWriter(self, ctx, open_txn)

    @staticmethod
    def committed_name(part: str) -> str:
        core = part[1:].removesuffix(".inprogress")
        return f"part-{core}.jsonl"

    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        committed = 0
        for part in transaction.parts:
            self._check_part(uid, part)
            src = os.path.join(self.directory, part)
            dst = os.path.join(self.directory, self.committed_name(part))
            if os.path.exists(src):
                os.replace(src, dst)
                committed += 1
            elif not os.path.exists(dst):
                raise CheckpointError(
                    f"cannot commit transaction {transaction.transaction_id} of sink {uid}: "
                    f"part {src} is missing and was never committed"
                )
        return committed

    def abort_uncommitted(self, uid: str, keep: set[str]) -> int:
        removed = 0
        prefix = f".{uid}-"
        for name in os.listdir(self.directory):
            if name.startswith(prefix) and name.endswith(".inprogress") and name not in keep:
                os.remove(os.path.join(self.directory, name))
                removed += 1
        return removed

    @staticmethod
    def _check_part(uid: str, part: str) -> None:
        if os.sep in part or not part.startswith(f".{uid}-") or not part.endswith(".inprogress"):
            raise CheckpointError(f"sink {uid}: {part!r} is not a part name this sink wrote")
