"""The write-ahead-log sink without Spark: the log, commit on completion, at-least-once."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.connectors.sinks import WriterContext
from sparkpoint.connectors.wal_sink import JsonLinesWriteAheadSink
from sparkpoint.errors import CheckpointError, ConfigurationError, InjectedFailure
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch


class FailingMidSend(JsonLinesWriteAheadSink):
    """Fails the ``fail_at``-th part sent (counting from 1) after appending the first half of
    its records, as a target that dies mid-write; once. (The Spark tests use it too: executors
    unpickle it from this module.)"""

    def __init__(self, path: str, fail_at: int) -> None:
        super().__init__(path)
        self.fail_at, self.calls = fail_at, 0
        self.sent_before_failure: list[str] = []

    def send_values(self, uid: str, part: str, records: list[Any]) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            half = records[: len(records) // 2]
            self.append(half)
            self.sent_before_failure = [json.dumps(r) for r in half]
            raise InjectedFailure(f"injected failure while sending {part} to {self.path}")
        super().send_values(uid, part, records)


def ctx(job_id: str = "job-a", attempt: int = 1, epoch: int = 0) -> WriterContext:
    return WriterContext(job_id, "sink", 0, attempt, epoch, task_attempt=0)


def records(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"app_id": f"a{i % 3}", "pv": i} for i in range(start, start + n)]


def pre_committed(
    sink: JsonLinesWriteAheadSink, batches: list[list[dict[str, Any]]], context: WriterContext
) -> SinkTransactionModel:
    """One transaction over one epoch per batch (a part each, from ``context``'s epoch on),
    pre-committed."""
    open_txn = None
    for i, batch in enumerate(batches):
        epoch = context.epoch + i
        writer = sink.writer(WriterContext(**{**context.__dict__, "epoch": epoch}), open_txn)
        writer.write(Batch.of_rows(batch))
        if i < len(batches) - 1:
            open_txn = writer.close_epoch()
    return writer.pre_commit(1)


def sent(sink: JsonLinesWriteAheadSink) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sink.lines()]


def test_nothing_reaches_the_target_before_the_commit(tmp_path: Path) -> None:
    sink = JsonLinesWriteAheadSink(str(tmp_path / "out.jsonl"))
    txn = pre_committed(sink, [records(5), records(4, start=5)], ctx())
    assert len(txn.parts) == 2 and txn.records == 9
    assert sink.lines() == [] and not os.path.exists(sink.path)
    assert sorted(os.listdir(sink.wal_directory)) == sorted(["_committed", *txn.parts])
    assert sink.commit("sink", txn) == 2
    assert sent(sink) == records(9)  # part by part, in order
    assert os.listdir(sink.wal_directory) == ["_committed"]  # the log parts are gone
    # A second commit (a restore of the same checkpoint) sends nothing again.
    assert sink.commit("sink", txn) == 0
    assert sent(sink) == records(9)


def test_a_failure_while_sending_duplicates_the_part_and_loses_nothing(tmp_path: Path) -> None:
    sink = FailingMidSend(str(tmp_path / "out.jsonl"), fail_at=2)
    first = pre_committed(sink, [records(4)], ctx())
    assert sink.commit("sink", first) == 1
    txn = pre_committed(sink, [records(6, start=4), records(2, start=10)], ctx(epoch=1))
    with pytest.raises(InjectedFailure, match="while sending"):
        sink.commit("sink", txn)
    assert sent(sink) == records(4) + records(3, start=4)  # half of the first part
    assert sink.sent_before_failure == [json.dumps(r) for r in records(3, start=4)]
    assert sink.commit("sink", txn) == 2  # the restore commits the checkpoint again
    extra = Counter(map(json.dumps, sent(sink))) - Counter(map(json.dumps, records(12)))
    assert extra == Counter(map(json.dumps, records(3, start=4)))  # at-least-once
    assert Counter(map(json.dumps, records(12))) - Counter(map(json.dumps, sent(sink))) == Counter()


def test_a_partial_last_line_is_cut_before_the_next_append(tmp_path: Path) -> None:
    sink = JsonLinesWriteAheadSink(str(tmp_path / "out.jsonl"))
    sink.append(records(2))
    with open(sink.path, "a", encoding="utf-8") as fh:
        fh.write('{"app_id": "a2", "p')  # a send that died mid-write
    sink.append(records(1, start=2))
    assert sent(sink) == records(3)


def test_an_abort_removes_this_jobs_unsent_parts_only(tmp_path: Path) -> None:
    sink = JsonLinesWriteAheadSink(str(tmp_path / "out.jsonl"), str(tmp_path / "wal"))
    mine = pre_committed(sink, [records(3)], ctx())
    other = pre_committed(sink, [records(3)], ctx(job_id="job-b"))
    earlier = pre_committed(sink, [records(3)], ctx(epoch=0, attempt=2))
    assert sink.abort_uncommitted("job-a", "sink", keep=set(), before_attempt=2) == 1
    assert sink.abort_uncommitted("job-a", "sink", keep=set(earlier.parts)) == 0
    assert sink.abort_uncommitted("job-a", "sink", keep=set()) == 1
    assert sorted(os.listdir(sink.wal_directory)) == sorted(["_committed", *other.parts])
    with pytest.raises(CheckpointError, match="is missing and was never sent"):
        sink.commit("sink", mine)
    assert sink.lines() == []


def test_a_part_name_the_sink_did_not_write_is_refused(tmp_path: Path) -> None:
    sink = JsonLinesWriteAheadSink(str(tmp_path / "out.jsonl"))
    for part in ("../x.wal", ".other-0-x.wal", ".sink-0-x.jsonl"):
        txn = SinkTransactionModel(transaction_id="sink-0-x", parts=[part])
        with pytest.raises(CheckpointError, match="not a log part this sink wrote"):
            sink.commit("sink", txn)


def test_configuration_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="needs an output file path"):
        JsonLinesWriteAheadSink("")
    with pytest.raises(ConfigurationError, match="is a directory"):
        JsonLinesWriteAheadSink(str(tmp_path))
    assert JsonLinesWriteAheadSink.delivery == "write_ahead_log"


def test_one_commit_position_per_subtask_skips_what_was_sent(tmp_path: Path) -> None:
    sink = JsonLinesWriteAheadSink(str(tmp_path / "out.jsonl"))
    txns = [pre_committed(sink, [records(2, start=2 * i)], ctx(epoch=i)) for i in range(5)]
    other = WriterContext("job-a", "sink", 1, 1, 0, task_attempt=0)  # subtask 1
    txns.append(pre_committed(sink, [records(2, start=10)], other))
    kept = Path(sink.part_path(txns[3].parts[0])).read_text(encoding="utf-8")
    assert [sink.commit("sink", t) for t in txns] == [1] * 6
    assert sent(sink) == records(12)
    committed = os.listdir(os.path.join(sink.wal_directory, "_committed"))
    assert len(committed) == 2  # one per subtask, not one per part
    # A restore of an older checkpoint commits its transactions again: nothing is sent.
    assert sink.commit("sink", txns[1]) == 0
    # A failure after the position advanced, before the part was deleted: the part goes.
    with open(sink.part_path(txns[3].parts[0]), "w", encoding="utf-8") as fh:
        fh.write(kept)
    assert sink.commit("sink", txns[3]) == 0
    assert sent(sink) == records(12)
    assert sorted(os.listdir(sink.wal_directory)) == ["_committed"]
