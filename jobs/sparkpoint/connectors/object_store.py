"""The transactional file sink on object stores (``s3://``...): commit by manifest, not rename.

An object store has no atomic rename, so :class:`ObjectStoreFileSink` makes a transaction
visible the way table formats on object stores do (Delta Lake's log, Iceberg's manifests):

- a part is written once, with one upload, to ``<output>/_parts/<part>``, never moved;
  ``<part>`` is ``<transaction id>.e<epoch>-t<task attempt>.jsonl`` (the names of
  :mod:`~sparkpoint.connectors.sinks`, with the writing job's tag);
- commit writes the transaction's manifest ``<output>/_committed/<transaction id>.json``
  listing its parts. One put, which an object store makes visible all at once: the
  transaction is committed exactly when its manifest exists, all its parts together (a local
  :class:`~sparkpoint.connectors.sinks.FileSink` renames part by part);
- the committed output is the parts the manifests list (:meth:`ObjectStoreFileSink.
  committed_parts`). Names starting with ``_`` are what Spark and Hadoop readers skip, so a
  reader that does not know the manifests sees no output rather than uncommitted output.

The module docstring of :mod:`~sparkpoint.connectors.sinks` holds here too. Commit is
idempotent: a manifest that exists already means committed before (by this job, or by another
restored from the same checkpoint); two jobs committing one transaction at once put the same
bytes. An abort deletes only parts that this job wrote (:func:`~sparkpoint.connectors.sinks.
written_by`) and that no manifest lists: a part whose transaction has a manifest is committed
output and stays, whatever ``keep`` says.

A part upload that its task never closed (a killed task attempt) leaves no object, at most an
incomplete multipart upload, which S3 bills until a bucket lifecycle rule
(``AbortIncompleteMultipartUpload``) removes it, as Flink's documentation advises too.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.core import split_protocol

from sparkpoint.checkpointing.storage_base import (
    is_object_store,
    probe_directory,
    shipped_storage_options,
)
from sparkpoint.connectors.sinks import (
    FileSink,
    OpenTransaction,
    SinkWriter,
    WriterContext,
    format_json_lines,
    transaction_id,
    written_by,
)
from sparkpoint.errors import CheckpointError, ConfigurationError
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch

PARTS_DIR = "_parts"
COMMITTED_DIR = "_committed"
MANIFEST_FORMAT = "sparkpoint-file-sink-commit/1"
_PART_SUFFIX = ".jsonl"


class _ObjectStoreWriter(SinkWriter):
    """Writes one part object per epoch of a transaction; the upload completes on close."""

    def __init__(
        self, sink: ObjectStoreFileSink, ctx: WriterContext, open_txn: OpenTransaction | None
    ) -> None:
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
            self._part = f"{self._txn.transaction_id}.e{c.epoch}-t{c.task_attempt}{_PART_SUFFIX}"
            self._fh = self._sink.fs.open(self._sink.part_path(self._part), "wb")
        text = self._sink.formatter(batch)
        data = text.encode("utf-8")
        self._fh.write(data)
        self._txn.records += len(batch)
        self._txn.bytes += len(data)

    def _close_part(self) -> None:
        if self._fh is not None:
            self._fh.close()  # completes the upload: the object exists from here on
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
            location=self._sink.location,
        )
        self._txn = self._begin()
        return sealed

    def close_epoch(self) -> OpenTransaction:
        self._close_part()
        return self._txn


class ObjectStoreFileSink(FileSink):
    """Writes JSON lines under an object-store URL; a transaction becomes visible by manifest.

    ``FileSink("s3://bucket/out")`` builds one. See the module docstring for the layout.

    Args:
        directory: the output URL (``s3://bucket/out``, any fsspec protocol without rename).
        formatter: records -> text, JSON lines by default.
        storage_options: fsspec options of the store; the driver's fsspec configuration for
            the protocol is captured too (endpoint, credentials) and shipped to executors.

    Raises:
        ConfigurationError: an empty URL, a protocol fsspec does not know (for ``s3://``:
            ``pip install 'sparkpoint[s3]'``), or a store the job cannot write to (the
            message names the URL and the store's error).
    """

    def __init__(
        self,
        directory: str,
        formatter: Any = format_json_lines,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if not directory:
            raise ConfigurationError("FileSink needs an output directory (--output)")
        protocol, _ = split_protocol(directory)
        try:
            fs_class = fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError) as err:
            raise ConfigurationError(
                f"cannot write the file sink's output to {directory}: {err}"
            ) from err
        self.protocol = str(protocol)
        self.root = fs_class._strip_protocol(directory).rstrip("/")
        if not self.root:
            raise ConfigurationError(f"the file sink's output {directory} names no bucket")
        self.directory = f"{self.protocol}://{self.root}"
        self.formatter = formatter
        self.storage_options = shipped_storage_options(fs_class, storage_options)
        self._fs: fsspec.AbstractFileSystem | None = None  # created on first use, not pickled
        # As FileSink creates its directory: a store the job cannot write to is refused here,
        # on the driver, rather than failing every epoch on the executors.
        probe_directory(self.fs, f"{self.root}/{PARTS_DIR}", "--output", self.directory)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}

    def at(self, location: str) -> FileSink | None:
        """The sink of another output, with this one's store options when on its protocol."""
        if split_protocol(location)[0] != self.protocol:
            return super().at(location)
        try:
            return ObjectStoreFileSink(location, self.formatter, self.storage_options)
        except ConfigurationError:  # a store this job cannot write to
            return None

    def __repr__(self) -> str:
        return f"ObjectStoreFileSink({self.directory!r})"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The store's fsspec filesystem (no listing cache: other processes write here)."""
        if self._fs is None:
            self._fs = fsspec.filesystem(self.protocol, **self.storage_options)
        return self._fs

    def part_path(self, part: str) -> str:
        """Where the part object ``part`` is (a path on :attr:`fs`)."""
        return f"{self.root}/{PARTS_DIR}/{part}"

    def manifest_path(self, transaction_id: str) -> str:
        """Where the manifest of a committed transaction is (a path on :attr:`fs`)."""
        return f"{self.root}/{COMMITTED_DIR}/{transaction_id}.json"

    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        return _ObjectStoreWriter(self, ctx, open_txn)

    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        """Make a pre-committed transaction visible by putting its manifest. Idempotent.

        Steps: (1) check the part names (a transaction without parts has nothing to show:
        no manifest), (2) return 0 when the manifest exists (committed before), (3) check
        that every part object is there, (4) put the manifest.

        Returns:
            The number of parts committed now.

        Raises:
            CheckpointError: a part name this sink never writes, or a part object missing from
                a transaction that was never committed.
        """
        # Step 1
        for part in transaction.parts:
            self._check_part(uid, part)
        if not transaction.parts:
            return 0
        # Step 2
        manifest = self.manifest_path(transaction.transaction_id)
        if self.fs.exists(manifest):
            return 0
        # Step 3
        for part in transaction.parts:
            if not self.fs.exists(self.part_path(part)):
                raise CheckpointError(
                    f"cannot commit transaction {transaction.transaction_id} of sink {uid}: "
                    f"part {self.protocol}://{self.part_path(part)} is missing and was never "
                    "committed"
                )
        # Step 4
        self.fs.pipe_file(manifest, encode_commit_manifest(uid, transaction))
        return len(transaction.parts)

    def abort_uncommitted(
        self,
        job_id: str,
        uid: str,
        keep: set[str],
        before_attempt: int | None = None,
        in_epoch: int | None = None,
    ) -> int:
        """Delete the part objects job ``job_id`` wrote for sink ``uid`` that no manifest
        lists (in an attempt before ``before_attempt`` when given), but those in ``keep``."""
        mine = [
            part
            for part in self._part_names()
            if written_by(job_id, uid, part.removesuffix(_PART_SUFFIX), before_attempt, in_epoch)
            and part not in keep
        ]
        if not mine:
            return 0
        committed = self._committed_transaction_ids()
        doomed = [p for p in mine if _transaction_of(p) not in committed]
        for part in doomed:
            try:
                self.fs.rm(self.part_path(part))
            except FileNotFoundError:
                continue
        return len(doomed)

    # ------------------------------------------------------------------------- readers

    def committed_parts(self) -> list[str]:
        """The paths (on :attr:`fs`) of every committed part, in transaction-id order."""
        out: list[str] = []
        for manifest in self._manifest_paths():
            doc = decode_commit_manifest(self.fs.cat_file(manifest), manifest)
            out.extend(self.part_path(part) for part in doc["parts"])
        return out

    def committed_lines(self) -> list[str]:
        """Every line of the committed output, part after part."""
        lines: list[str] = []
        for path in self.committed_parts():
            lines.extend(self.fs.cat_file(path).decode("utf-8").splitlines())
        return lines

    def uncommitted_parts(self) -> list[str]:
        """The names of the part objects that no manifest lists (any job's)."""
        committed = self._committed_transaction_ids()
        return [p for p in self._part_names() if _transaction_of(p) not in committed]

    # ------------------------------------------------------------------------- listing

    def _part_names(self) -> list[str]:
        return sorted(posixpath.basename(p) for p in self._listing(PARTS_DIR))

    def _manifest_paths(self) -> list[str]:
        return sorted(p for p in self._listing(COMMITTED_DIR) if p.endswith(".json"))

    def _committed_transaction_ids(self) -> set[str]:
        return {posixpath.basename(p).removesuffix(".json") for p in self._manifest_paths()}

    def _listing(self, sub: str) -> Iterator[str]:
        try:
            entries = self.fs.ls(f"{self.root}/{sub}", detail=True)
        except FileNotFoundError:
            return iter(())
        return (str(e["name"]) for e in entries if e.get("type") == "file")

    @staticmethod
    def _check_part(uid: str, part: str) -> None:
        if "/" in part or not part.startswith(f"{uid}-") or not part.endswith(_PART_SUFFIX):
            raise CheckpointError(f"sink {uid}: {part!r} is not a part name this sink wrote")


def _transaction_of(part: str) -> str:
    """The transaction id in a part name ``<transaction id>.e<epoch>-t<attempt>.jsonl``."""
    return part.removesuffix(_PART_SUFFIX).rsplit(".", 1)[0]


def encode_commit_manifest(uid: str, transaction: SinkTransactionModel) -> bytes:
    """A committed transaction's manifest: the same bytes whoever commits it."""
    doc = {
        "format": MANIFEST_FORMAT,
        "sink": uid,
        "transaction_id": transaction.transaction_id,
        "parts": list(transaction.parts),
        "records": transaction.records,
        "bytes": transaction.bytes,
    }
    return json.dumps(doc, sort_keys=True).encode("utf-8")


def decode_commit_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """The manifest in ``raw``; raises :class:`CheckpointError` naming ``where`` if invalid."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a {MANIFEST_FORMAT} manifest")
        if not all(isinstance(p, str) and "/" not in p for p in doc["parts"]):
            raise ValueError("a part is not a plain name")
        return doc
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"commit manifest {where} is not valid: {err}") from err


def is_object_store_url(url: str) -> bool:
    """Whether the file sink's output ``url`` names an object store (``s3://``...)."""
    protocol, _ = split_protocol(url)
    return protocol is not None and is_object_store([protocol])
