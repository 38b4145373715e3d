"""Two-phase-commit sinks (Flink's TwoPhaseCommitSinkFunction) and the transactional file sink.

A transaction holds what one sink subtask wrote between two barriers, possibly over several
epochs (one part per epoch and task attempt). The task side writes parts and pre-commits on a
barrier; the driver side commits a pre-committed transaction once its checkpoint completed,
and on restore commits the restored checkpoint's transactions again and aborts every other
uncommitted part the job wrote.

Jobs that share an output and a sink uid (a fork started from another job's checkpoint or
savepoint into the same directory or table, running while the original still does) must not
touch each other's transactions. As Flink's ``TwoPhaseCommitSinkFunction`` and ``KafkaSink``
(whose transactional-id prefix must differ per job) do:

- every transaction id and part name carries the writing job's :func:`job_tag`, unambiguous
  (the whole job id, or a hash of it), so two jobs never write or commit the same name;
- a restore commits the restored checkpoint's pre-committed transactions, also when another
  job wrote them: that checkpoint completed, so their output is decided, and both commits are
  idempotent, also when the original job commits them at the same time (a rename that finds
  its part renamed already; the SQL commit log's key);
- a file or SQL sink's transaction names its output (``location``): a fork into another
  directory or table commits the restored checkpoint's transactions in the original's,
  where their parts are;
- a restore aborts only what this job wrote (:func:`written_by`), never another job's parts:
  not the restored job's open transaction either (the original may still pre-commit it). Parts
  that a job that will never run again left uncommitted stay hidden, out of the output.

Parts named before job tags were unambiguous (``job_id[:8]``) are still committed when a
restored checkpoint lists them; no abort removes them, since their job cannot be told apart.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import IO, Any, ClassVar

import numpy as np

from sparkpoint.connectors.json_lines import ascii_json_lines
from sparkpoint.errors import CheckpointError, ConfigurationError, naming_file
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


_DEFAULT_JOB_ID = re.compile(r"[0-9a-f]{32}\Z")


def job_tag(job_id: str) -> str:
    """How transaction ids and part names name job ``job_id``: 32 characters, no ``-``.

    The job id itself when it is a default one (32 lowercase hex digits, ``uuid4().hex``), else
    ``h`` and the first 31 hex digits of its SHA-256: the two forms never meet (only hashes hold
    an ``h``), names stay safe in file names and SQL, and they never match the tags of at most
    8 characters (``job_id[:8]``) that parts written before this had.
    """
    if _DEFAULT_JOB_ID.match(job_id):
        return job_id
    return "h" + hashlib.sha256(job_id.encode()).hexdigest()[:31]


def transaction_id(ctx: WriterContext, seq: int) -> str:
    """The id of the ``seq``-th transaction that ``ctx``'s subtask begins in its epoch."""
    tag = job_tag(ctx.job_id)
    return f"{ctx.uid}-{ctx.subtask}-{tag}-a{ctx.attempt}-e{ctx.epoch}-{seq}"


def written_by(
    job_id: str,
    uid: str,
    part: str,
    before_attempt: int | None = None,
    in_epoch: int | None = None,
) -> bool:
    """Whether job ``job_id`` wrote ``part`` (``<transaction id>.e<epoch>-t<task attempt>``,
    a file part's name without its ``.`` and ``.inprogress``) for sink ``uid`` — in an attempt
    before ``before_attempt`` and in epoch ``in_epoch`` when given."""
    match = _part_pattern(job_id, uid).fullmatch(part)
    if match is None:
        return False
    if in_epoch is not None and int(match["epoch"]) != in_epoch:
        return False
    return before_attempt is None or int(match["attempt"]) < before_attempt


@functools.lru_cache(maxsize=64)
def _part_pattern(job_id: str, uid: str) -> re.Pattern[str]:
    attempt = r"-a(?P<attempt>\d+)"
    part = r"\.e(?P<epoch>\d+)-t\d+"  # the epoch that wrote the part
    return re.compile(rf"{re.escape(uid)}-\d+-{job_tag(job_id)}{attempt}-e\d+-\d+{part}")


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

    # How the sink protects its target against replays, for the job's end-to-end guarantee
    # (``sparkpoint.guarantees``): "two_phase_commit", "idempotent", "write_ahead_log" or
    # "none". A subclass that writes other than through this class's transactions says so.
    delivery: ClassVar[str] = "two_phase_commit"

    @abc.abstractmethod
    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        """A writer for one subtask and epoch, continuing ``open_txn`` when given."""

    @abc.abstractmethod
    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        """Make a pre-committed transaction visible. Idempotent. Returns parts committed now."""

    @property
    def location(self) -> str | None:
        """Where this sink pre-commits its transactions (its output), written into each one
        (``SinkTransactionModel.location``); None: the sink does not say, and a restore
        commits every transaction where this sink writes."""
        return None

    def at(self, location: str) -> TwoPhaseCommitSink | None:
        """A sink like this one that commits transactions pre-committed at ``location``: a
        job restored from another job's checkpoint into another output commits the
        checkpoint's transactions where that job wrote them (Flink's file sink commits the
        pending files its committables name). None: it cannot reach ``location`` (the
        restoring job commits at its own output, as for a transaction that names none)."""
        return None

    @abc.abstractmethod
    def abort_uncommitted(
        self,
        job_id: str,
        uid: str,
        keep: set[str],
        before_attempt: int | None = None,
        in_epoch: int | None = None,
    ) -> int:
        """Delete every uncommitted part that job ``job_id`` wrote for sink ``uid`` (in an
        attempt before ``before_attempt``, and in epoch ``in_epoch``, when given), but those in
        ``keep``; another job's parts stay (see the module docstring). Returns how many."""


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
    if col.dtype.kind == "U":  # what json.dumps does with a str, in C, without a sort
        return list(map(encode_basestring_ascii, col.tolist()))
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
    laid_out = ascii_json_lines(batch)  # every text plain ASCII: in numpy, no call per record
    if laid_out is not None:
        return laid_out
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
        self._seq += 1
        return OpenTransaction(transaction_id=transaction_id(self._ctx, self._seq))

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self._fh is None:
            c = self._ctx
            self._part = f".{self._txn.transaction_id}.e{c.epoch}-t{c.task_attempt}.inprogress"
            self._fh = open(self._path(), "w", encoding="utf-8")
        text = self._sink.formatter(batch)
        with naming_file(self._path()):
            self._fh.write(text)
        self._txn.records += len(batch)
        self._txn.bytes += len(text)

    def _path(self) -> str:
        assert self._part is not None
        return os.path.join(self._sink.directory, self._part)

    def _close_part(self) -> None:
        if self._fh is not None:
            assert self._part is not None
            close_durably(self._fh, self._path())
            self._fh = None
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
            location=self._sink.location,
        )
        self._txn = self._begin()
        return sealed

    def close_epoch(self) -> OpenTransaction:
        self._close_part()
        return self._txn


def close_durably(fh: IO[Any], path: str) -> None:
    """Flush, fsync and close a sink's open file; an OSError (a full disk) names ``path``."""
    with naming_file(path):
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()


def make_directory(owner: str, path: str) -> None:
    """Create a sink's directory (and its parents) when missing.

    Raises:
        ConfigurationError: it cannot be created (a file is in the way, no permission),
            naming the sink and the path: a wrong ``--output``, not a bug of the job file.
    """
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        why = "a file is in the way" if isinstance(err, FileExistsError) else err.strerror
        raise ConfigurationError(f"{owner} cannot create the directory {path}: {why}") from err


class FileSink(TwoPhaseCommitSink):
    """Writes JSON lines into ``directory``; a transaction's parts become visible by rename.

    Part files start hidden (``.<txn>.e<epoch>-t<task attempt>.inprogress``); commit renames
    each to ``part-<txn>.e<epoch>-t<task attempt>.jsonl`` with an atomic ``os.replace``, so a
    reader sees a transaction's lines only once it committed. Committed output is every file
    whose name does not start with ``.`` or ``_``.

    An output on an object store (``s3://``..., no rename) builds an
    :class:`~sparkpoint.connectors.object_store.ObjectStoreFileSink`, which commits by manifest.
    """

    def __new__(cls, directory: str = "", *args: Any, **kwargs: Any) -> FileSink:
        if cls is FileSink and "://" in str(directory):
            from sparkpoint.connectors import object_store

            if object_store.is_object_store_url(directory):
                return super().__new__(object_store.ObjectStoreFileSink)
        return super().__new__(cls)

    def __init__(self, directory: str, formatter: Any = format_json_lines) -> None:
        if not directory:
            raise ConfigurationError("FileSink needs an output directory (--output)")
        self.directory = os.path.abspath(directory)
        self.formatter = formatter
        make_directory("FileSink", self.directory)

    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        os.makedirs(self.directory, exist_ok=True)
        return _FileSinkWriter(self, ctx, open_txn)

    @property
    def location(self) -> str:
        return self.directory

    def at(self, location: str) -> FileSink | None:
        """The file sink of another output directory (or object-store URL), when it exists."""
        if "://" not in location and not os.path.isdir(location):
            return None
        try:
            return FileSink(location, self.formatter)
        except ConfigurationError:  # a store this job cannot write to
            return None

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
            try:
                os.replace(src, dst)
                committed += 1
            except FileNotFoundError as err:
                # Committed before, or meanwhile by another job restored from the same checkpoint.
                if not os.path.exists(dst):
                    raise CheckpointError(
                        f"cannot commit transaction {transaction.transaction_id} of sink {uid}: "
                        f"part {src} is missing and was never committed"
                    ) from err
        return committed

    def abort_uncommitted(
        self,
        job_id: str,
        uid: str,
        keep: set[str],
        before_attempt: int | None = None,
        in_epoch: int | None = None,
    ) -> int:
        removed = 0
        for name in os.listdir(self.directory):
            hidden = name.startswith(".") and name.endswith(".inprogress")
            core = name[1:].removesuffix(".inprogress")
            mine = written_by(job_id, uid, core, before_attempt, in_epoch)
            if hidden and mine and name not in keep:
                os.remove(os.path.join(self.directory, name))
                removed += 1
        return removed

    @staticmethod
    def _check_part(uid: str, part: str) -> None:
        if os.sep in part or not part.startswith(f".{uid}-") or not part.endswith(".inprogress"):
            raise CheckpointError(f"sink {uid}: {part!r} is not a part name this sink wrote")
