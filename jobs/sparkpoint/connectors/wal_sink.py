"""Write-ahead-log sink (Flink's ``GenericWriteAheadSink``): at-least-once to a plain target.

The seeds' consistency table: a resettable source with a write-ahead-log sink is at-least-once.
Tasks write a transaction's records into the *write-ahead log* (hidden part files in
``wal_directory``, one per epoch and task attempt, as the file sink's parts), never into the
target; the pre-commit seals them and the checkpoint records them. Only when the checkpoint
completed does the driver send each part's records to the target (:meth:`send_values`), which
needs no transactions: an append-only file, a table without a commit log, a message queue.

As Flink's ``CheckpointCommitter``, a small file per sink subtask and job
(``_committed/<uid>-<subtask>-<job tag>``) holds the position of the last part sent: the
transactions of one subtask are committed in the order they began (attempt, epoch, sequence),
so a part at or before that position was sent, and a second commit of the same transaction (a
restore of its checkpoint) skips it. Sent parts are deleted; the commit files stay one per
subtask, however long the job runs. What the position cannot cover is a failure *while* a part
is being sent: the target holds some of its records, the position was not advanced, and the
restore sends the whole part again, so the target holds those records twice. Nothing is lost:
a part leaves the log only after the position passed it. That is why the guarantee is
at-least-once, not exactly-once (a target that could roll back a partial write would be
transactional, and then a two-phase-commit sink would serve better).

:class:`JsonLinesWriteAheadSink` sends to a plain JSON-lines file: appends are visible at once
and nothing can take them back, the plainest non-transactional target (and a reader of the file
sees the duplicates a failed commit leaves).
"""

from __future__ import annotations

import abc
import json
import os
import re
from typing import Any, BinaryIO, ClassVar

from sparkpoint.connectors.sinks import (
    OpenTransaction,
    SinkWriter,
    TwoPhaseCommitSink,
    WriterContext,
    close_durably,
    format_json_lines,
    make_directory,
    transaction_id,
    written_by,
)
from sparkpoint.errors import CheckpointError, ConfigurationError, naming_file
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch

WAL_SUFFIX = ".wal"
COMMITTED_DIR = "_committed"
#: Where a part comes in its subtask's commit order: attempt, epoch and sequence of its
#: transaction, epoch of the part.
Position = tuple[int, int, int, int]
_PART = re.compile(
    r"(?P<subtask>\d+)-(?P<tag>[0-9a-fh]{32})-a(?P<attempt>\d+)-e(?P<epoch>\d+)-(?P<seq>\d+)"
    r"\.e(?P<part_epoch>\d+)-t\d+" + re.escape(WAL_SUFFIX)
)


class WriteAheadSink(TwoPhaseCommitSink):
    """Keeps each transaction's records in a write-ahead log; sends them on checkpoint completion.

    ``wal_directory``: where the log's parts live, on a filesystem that the executors and the
    driver share (as checkpoint storage). Subclasses say how records reach the target
    (:meth:`send_values`). Records are kept as JSON lines, so they must be JSON values.
    """

    delivery: ClassVar[str] = "write_ahead_log"

    def __init__(self, wal_directory: str) -> None:
        if not wal_directory:
            raise ConfigurationError(f"{type(self).__name__} needs a write-ahead-log directory")
        self.wal_directory = os.path.abspath(wal_directory)
        make_directory(type(self).__name__, os.path.join(self.wal_directory, COMMITTED_DIR))

    @abc.abstractmethod
    def send_values(self, uid: str, part: str, records: list[Any]) -> None:
        """Write ``records`` (one log part of sink ``uid``, in order) to the target.

        Called on the driver, once per part and completed checkpoint, and again for a part
        whose sending failed before it returned. Raising fails the job's epoch: the restore
        sends the part again."""

    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        os.makedirs(self.wal_directory, exist_ok=True)
        return _WalWriter(self, ctx, open_txn)

    def part_path(self, part: str) -> str:
        return os.path.join(self.wal_directory, part)

    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        """Send a completed checkpoint's transaction to the target, part by part.

        For each part: (1) at or before its subtask's commit position it was sent: skip it
        (and delete it, if a failure came between steps 4 and 5); (2) read its records from
        the log (missing: CheckpointError, its records are lost); (3) send them; (4) advance
        the commit position to it; (5) delete the part. A failure in step 3 or before step 4
        sends the part again on the next commit: duplicates, never a loss. Returns parts sent.
        """
        sent = 0
        for part in transaction.parts:
            subtask, position = self._parse_part(uid, part)
            path = self.part_path(part)
            # Step 1
            done = self.committed_position(subtask)
            if done is not None and position <= done:
                if os.path.exists(path):
                    os.remove(path)
                continue
            # Step 2
            try:
                with open(path, encoding="utf-8") as fh:
                    records = [json.loads(line) for line in fh]
            except FileNotFoundError as err:
                raise CheckpointError(
                    f"cannot commit transaction {transaction.transaction_id} of sink {uid}: "
                    f"write-ahead-log part {path} is missing and was never sent"
                ) from err
            # Step 3
            self.send_values(uid, part, records)
            # Step 4
            self._advance(subtask, position)
            # Step 5
            os.remove(path)
            sent += 1
        return sent

    def committed_position(self, subtask: str) -> Position | None:
        """The position of the last part sent for ``subtask`` (``<uid>-<subtask>-<job tag>``)."""
        try:
            with open(os.path.join(self.wal_directory, COMMITTED_DIR, subtask)) as fh:
                attempt, epoch, seq, part_epoch = map(int, fh.read().split())
        except FileNotFoundError:
            return None
        return attempt, epoch, seq, part_epoch

    def _advance(self, subtask: str, position: Position) -> None:
        """Write the commit position durably (a new file renamed over the old one)."""
        directory = os.path.join(self.wal_directory, COMMITTED_DIR)
        tmp = os.path.join(directory, f".{subtask}.tmp")
        with naming_file(tmp), open(tmp, "w", encoding="utf-8") as fh:
            fh.write(" ".join(map(str, position)) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(directory, subtask))

    def abort_uncommitted(
        self,
        job_id: str,
        uid: str,
        keep: set[str],
        before_attempt: int | None = None,
        in_epoch: int | None = None,
    ) -> int:
        """Delete the log parts that job ``job_id`` wrote for sink ``uid`` (in an attempt
        before ``before_attempt`` when given) but those in ``keep``; another job's stay."""
        removed = 0
        for name in os.listdir(self.wal_directory):
            if not (name.startswith(".") and name.endswith(WAL_SUFFIX)) or name in keep:
                continue
            if written_by(job_id, uid, name[1:].removesuffix(WAL_SUFFIX), before_attempt, in_epoch):
                os.remove(self.part_path(name))
                removed += 1
        return removed

    @staticmethod
    def _parse_part(uid: str, part: str) -> tuple[str, Position]:
        """The subtask (``<uid>-<subtask>-<job tag>``) and position of a log part's name."""
        match = _PART.fullmatch(part.removeprefix(f".{uid}-")) if part.startswith(".") else None
        if os.sep in part or match is None:
            raise CheckpointError(f"sink {uid}: {part!r} is not a log part this sink wrote")
        position = (
            int(match["attempt"]),
            int(match["epoch"]),
            int(match["seq"]),
            int(match["part_epoch"]),
        )
        return f"{uid}-{match['subtask']}-{match['tag']}", position


class _WalWriter(SinkWriter):
    """Appends a transaction's records to its log part of this epoch and task attempt."""

    def __init__(self, sink: WriteAheadSink, ctx: WriterContext, open_txn: OpenTransaction | None):
        self._sink, self._ctx, self._seq = sink, ctx, 0
        self._txn = open_txn or self._begin()
        self._fh: Any = None
        self._part: str | None = None

    def _begin(self) -> OpenTransaction:
        self._seq += 1
        return OpenTransaction(transaction_id=transaction_id(self._ctx, self._seq))

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self._fh is None:
            c = self._ctx
            self._part = f".{self._txn.transaction_id}.e{c.epoch}-t{c.task_attempt}{WAL_SUFFIX}"
            self._fh = open(self._sink.part_path(self._part), "w", encoding="utf-8")
        text = format_json_lines(batch)
        assert self._part is not None
        with naming_file(self._sink.part_path(self._part)):
            self._fh.write(text)
        self._txn.records += len(batch)
        self._txn.bytes += len(text)

    def _close_part(self) -> None:
        if self._fh is None:
            return
        assert self._part is not None
        close_durably(self._fh, self._sink.part_path(self._part))
        self._fh = None
        self._txn.parts.append(self._part)
        self._part = None

    def pre_commit(self, checkpoint_id: int) -> SinkTransactionModel:
        self._close_part()
        txn, self._txn = self._txn, self._begin()
        return SinkTransactionModel(
            transaction_id=txn.transaction_id,
            parts=list(txn.parts),
            records=txn.records,
            bytes=txn.bytes,
        )

    def close_epoch(self) -> OpenTransaction:
        self._close_part()
        return self._txn


class JsonLinesWriteAheadSink(WriteAheadSink):
    """Sends records as JSON lines appended to the plain file ``path`` (not transactional).

    ``wal_directory`` defaults to ``<path>.wal`` beside it. Each part's records are appended
    with one write and an fsync; a reader sees them as soon as they are written."""

    def __init__(self, path: str, wal_directory: str | None = None) -> None:
        if not path:
            raise ConfigurationError("JsonLinesWriteAheadSink needs an output file path")
        self.path = os.path.abspath(path)
        if os.path.isdir(self.path):
            raise ConfigurationError(f"JsonLinesWriteAheadSink: {self.path} is a directory")
        make_directory("JsonLinesWriteAheadSink", os.path.dirname(self.path))
        super().__init__(wal_directory or self.path + WAL_SUFFIX)

    def __repr__(self) -> str:
        return f"JsonLinesWriteAheadSink({self.path!r}, wal_directory={self.wal_directory!r})"

    def send_values(self, uid: str, part: str, records: list[Any]) -> None:
        self.append(records)

    def append(self, records: list[Any]) -> None:
        """Append ``records`` to the file as JSON lines, durably. A partial last line (a
        send that died mid-write) is cut off first: its record is in the part sent again."""
        if not records:
            return
        text = "".join(json.dumps(r) + "\n" for r in records).encode()
        with naming_file(self.path), open(self.path, "a+b") as fh:
            _cut_partial_line(fh)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    def lines(self) -> list[str]:
        """Every line the file holds (empty when nothing was sent yet)."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                return fh.read().splitlines()
        except FileNotFoundError:
            return []


def _cut_partial_line(fh: BinaryIO, block: int = 1 << 16) -> None:
    """Truncate an open file after its last newline (nothing when it ends with one)."""
    end = fh.seek(0, os.SEEK_END)
    pos = end
    while pos > 0:
        start = max(0, pos - block)
        fh.seek(start)
        chunk = fh.read(pos - start)
        if pos == end and chunk.endswith(b"\n"):
            return
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            fh.truncate(start + newline + 1)
            return
        pos = start
    fh.truncate(0)
