"""The weak ends of the seeds' consistency table: a source that cannot replay, a sink that
cannot take a replay back.

:class:`RedisListSource` pops entries off Redis lists (a work queue). A popped entry is gone
from Redis, so a restore cannot read it again: the entries that a failed epoch popped after
the restored checkpoint are lost, and a job that reads this source is **at-most-once** end to
end, whatever its sinks (Flink's socket source is the same case).

:class:`AppendFileSink` appends records to one file per subtask as they come, without
transactions (Flink's print and plain-file sinks). A restore replays the records after the
restored checkpoint and they are appended again: with a resettable source the job is
**at-least-once** end to end.

Both exist to be chosen knowingly, and :mod:`sparkpoint.guarantees` says what a job that uses
them promises. The two-phase-commit, idempotent and write-ahead-log sinks, and the resettable
sources, are the other cells of the table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from sparkpoint.connectors.sinks import (
    OpenTransaction,
    SinkWriter,
    TwoPhaseCommitSink,
    WriterContext,
    close_durably,
    format_json_lines,
    make_directory,
)
from sparkpoint.connectors.sources import Source
from sparkpoint.errors import ConfigurationError, naming_file
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch
from sparkpoint.redis_connection import shared_client


class RedisListSource(Source):
    """Entries popped from the head of Redis lists, one split per list: not resettable.

    Each entry is decoded as JSON when it is JSON, else kept as text. A split's offset counts
    the entries its reads asked for; a read pops at most that many, atomically with a counter
    (``<key>:sparkpoint:popped``) that tells the planner how many entries the list has had, so
    the planner never asks for more than were pushed. After a restore the offsets of the
    entries lost in the failed epoch stay counted: the planner may ask for up to that many
    entries that no longer exist, and the reads return fewer records (nothing waits for them).

    Args:
        url: The Redis that holds the lists (``redis://host:port/db``).
        keys: The list keys, one split each.
        count: Entries per list after which the split ends (None: unbounded).
    """

    resettable: ClassVar[bool] = False

    def __init__(self, url: str, keys: Sequence[str], *, count: int | None = None) -> None:
        if not url:
            raise ConfigurationError("RedisListSource needs the URL of its Redis")
        if isinstance(keys, str) or not keys:
            raise ConfigurationError("RedisListSource needs a list of one or more list keys")
        if len(set(keys)) != len(keys):
            raise ConfigurationError(f"RedisListSource keys repeat a key: {list(keys)}")
        if count is not None and count < 0:
            raise ConfigurationError(f"RedisListSource count must be >= 0, got {count}")
        self.url = url
        self.keys = tuple(keys)
        self.count = count

    def __repr__(self) -> str:
        return f"RedisListSource(keys={list(self.keys)}, count={self.count})"

    def split_ids(self) -> list[str]:
        return [f"redis-list:{key}" for key in self.keys]

    def popped_key(self, split: int) -> str:
        return f"{self.keys[split]}:sparkpoint:popped"

    def total(self, split: int) -> int | None:
        return self.count

    def available(self, split: int, elapsed_s: float) -> int | None:
        """Entries the list has had: popped so far and still queued (one round trip)."""
        pipe = shared_client(self.url).pipeline(transaction=True)
        pipe.get(self.popped_key(split))
        pipe.llen(self.keys[split])
        popped, queued = pipe.execute()
        return int(popped or 0) + int(queued)

    def read(self, split: int, start: int, end: int) -> Batch:
        """Pop up to ``end - start`` entries off the head of the split's list."""
        if end <= start:
            return Batch.of_rows([])
        script = _POP_SCRIPTS.get(self.url)
        if script is None:
            script = _POP_SCRIPTS[self.url] = shared_client(self.url).register_script(_POP)
        entries = script(keys=[self.keys[split], self.popped_key(split)], args=[end - start])
        return Batch.of_rows([_decode(raw) for raw in entries])


# Pops up to ARGV[1] entries off the head of list KEYS[1] and counts them in KEYS[2], in one
# atomic step (LPOP with a count needs Redis 6.2; this runs on any).
_POP = """
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items > 0 then
  redis.call('LTRIM', KEYS[1], #items, -1)
  redis.call('INCRBY', KEYS[2], #items)
end
return items
"""
_POP_SCRIPTS: dict[str, Any] = {}


def _decode(raw: bytes) -> Any:
    text = raw.decode("utf-8")
    try:
        return json.loads(text)
    except ValueError:
        return text


class AppendFileSink(TwoPhaseCommitSink):
    """Appends records to ``<directory>/<uid>-<subtask>.jsonl`` at once: no replay protection.

    What a subtask writes is flushed and synced on each barrier, so a completed checkpoint's
    records are on disk; records replayed after a restore are appended again (at-least-once).
    """

    delivery: ClassVar[str] = "none"

    def __init__(
        self, directory: str, formatter: Callable[[Batch], str] = format_json_lines
    ) -> None:
        if not directory:
            raise ConfigurationError("AppendFileSink needs a directory")
        self.directory = os.path.abspath(directory)
        self.formatter = formatter
        make_directory("AppendFileSink", self.directory)

    def path(self, uid: str, subtask: int) -> str:
        return os.path.join(self.directory, f"{uid}-{subtask}.jsonl")

    def writer(self, ctx: WriterContext, open_txn: OpenTransaction | None) -> SinkWriter:
        return _AppendWriter(self, ctx, open_txn)

    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        return 0  # written already

    def abort_uncommitted(
        self,
        job_id: str,
        uid: str,
        keep: set[str],
        before_attempt: int | None = None,
        in_epoch: int | None = None,
    ) -> int:
        return 0  # nothing to take back: that is this sink's weakness


class _AppendWriter(SinkWriter):
    """Counts what it appended since the last barrier (across epochs, in the open
    transaction), so each checkpoint reports the records and bytes it covers."""

    def __init__(
        self, sink: AppendFileSink, ctx: WriterContext, open_txn: OpenTransaction | None
    ) -> None:
        self._sink = sink
        self._ctx = ctx
        self._fh: Any = None
        self._txn = open_txn or self._begin()

    def _begin(self) -> OpenTransaction:
        c = self._ctx
        return OpenTransaction(transaction_id=f"{c.uid}-{c.subtask}-a{c.attempt}-e{c.epoch}")

    def write(self, batch: Batch) -> None:
        if not len(batch):
            return
        if self._fh is None:
            self._fh = open(self._path(), "a", encoding="utf-8")
        text = self._sink.formatter(batch)
        with naming_file(self._path()):
            self._fh.write(text)
        self._txn.records += len(batch)
        self._txn.bytes += len(text)

    def _sync(self) -> None:
        if self._fh is not None:
            close_durably(self._fh, self._path())
            self._fh = None

    def _path(self) -> str:
        return self._sink.path(self._ctx.uid, self._ctx.subtask)

    def pre_commit(self, checkpoint_id: int) -> SinkTransactionModel:
        self._sync()
        txn = self._txn
        self._txn = self._begin()
        return SinkTransactionModel(
            transaction_id=f"{txn.transaction_id}-c{checkpoint_id}",
            parts=[],
            records=txn.records,
            bytes=txn.bytes,
        )

    def close_epoch(self) -> OpenTransaction:
        self._sync()
        return self._txn
