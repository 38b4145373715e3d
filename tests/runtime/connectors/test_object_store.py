"""The file sink on a real S3 API (moto's server, through s3fs): commit by manifest, abort,
re-commit on restore, and jobs forked onto one output."""

from __future__ import annotations

import json
import pickle
import threading

import pytest

from sparkpoint.connectors.object_store import COMMITTED_DIR, ObjectStoreFileSink
from sparkpoint.connectors.sinks import FileSink, WriterContext
from sparkpoint.errors import CheckpointError, ConfigurationError
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.records import Batch

from ...support.s3 import S3Bucket, s3, s3_endpoint  # noqa: F401 - fixtures

JOB = "0123456789abcdef0123456789abcdef"
FORK = "fedcba9876543210fedcba9876543210"


def _ctx(job: str = JOB, epoch: int = 0, task_attempt: int = 7, attempt: int = 1) -> WriterContext:
    return WriterContext(job, "sink", 0, attempt, epoch, task_attempt)


def _write(
    sink: FileSink, rows: list[dict[str, object]], ctx: WriterContext | None = None
) -> SinkTransactionModel:
    writer = sink.writer(ctx or _ctx(), None)
    writer.write(Batch.of_rows(rows))
    return writer.pre_commit(1)


def test_an_s3_output_builds_the_object_store_sink(s3: S3Bucket) -> None:  # noqa: F811
    sink = FileSink(s3.url("out"))
    assert type(sink) is ObjectStoreFileSink
    assert sink.directory == s3.url("out")
    assert sink.storage_options["endpoint_url"] == s3.endpoint_url  # captured on the driver
    copy = pickle.loads(pickle.dumps(sink))  # as Spark ships it to executors
    assert type(copy) is ObjectStoreFileSink and copy.storage_options == sink.storage_options
    txn = _write(copy, [{"a": 1}])
    assert sink.commit("sink", txn) == 1
    assert sink.committed_lines() == ['{"a": 1}']


def test_lines_become_visible_only_when_the_manifest_is_written(s3: S3Bucket) -> None:  # noqa: F811
    sink = FileSink(s3.url("out"))
    assert isinstance(sink, ObjectStoreFileSink)
    writer = sink.writer(_ctx(), None)
    writer.write(Batch.of_rows([{"a": 1}, {"a": 2}]))
    txn = writer.pre_commit(1)
    writer.write(Batch.of_rows([{"a": 3}]))
    open_txn = writer.close_epoch()
    assert sink.committed_lines() == []
    assert len(sink.uncommitted_parts()) == 2
    assert txn.records == 2 and open_txn.records == 1
    assert sink.commit("sink", txn) == 1
    assert sink.committed_lines() == ['{"a": 1}', '{"a": 2}']
    manifest = json.loads(s3.fs().cat_file(sink.manifest_path(txn.transaction_id)))
    assert manifest["parts"] == txn.parts and manifest["records"] == 2
    assert sink.commit("sink", txn) == 0  # idempotent: a restore commits it again
    assert sink.committed_lines() == ['{"a": 1}', '{"a": 2}']
    assert sink.abort_uncommitted(JOB, "sink", keep=set()) == 1  # the open transaction
    assert sink.uncommitted_parts() == []
    assert sink.committed_lines() == ['{"a": 1}', '{"a": 2}']
    # A reader that does not know the manifests sees nothing outside ``_`` names.
    names = [p.rsplit("/", 1)[-1] for p in s3.fs().ls(s3.url("out"))]
    assert sorted(names) == ["_committed", "_parts"]


def test_a_transaction_spans_epochs_and_commits_all_its_parts_at_once(s3: S3Bucket) -> None:  # noqa: F811
    sink = FileSink(s3.url("out"))
    w0 = sink.writer(_ctx(epoch=0), None)
    w0.write(Batch.of_rows([{"x": "e0"}]))
    carried = w0.close_epoch()
    w1 = sink.writer(_ctx(epoch=1, task_attempt=8), carried)
    w1.write(Batch.of_rows([{"x": "e1"}]))
    txn = w1.pre_commit(5)
    assert txn.transaction_id == carried.transaction_id and len(txn.parts) == 2
    assert sink.commit("sink", txn) == 2
    assert sorted(sink.committed_lines()) == ['{"x": "e0"}', '{"x": "e1"}']
    assert len(s3.fs().ls(s3.url("out", COMMITTED_DIR))) == 1  # one manifest, both parts


def test_a_transaction_without_records_puts_no_manifest(s3: S3Bucket) -> None:  # noqa: F811
    sink = FileSink(s3.url("out"))
    txn = sink.writer(_ctx(), None).pre_commit(1)
    assert txn.parts == []
    assert sink.commit("sink", txn) == 0
    assert not s3.fs().exists(s3.url("out", COMMITTED_DIR))


def test_commit_of_a_lost_part_fails_loudly_and_writes_no_manifest(s3: S3Bucket) -> None:  # noqa: F811
    sink = FileSink(s3.url("out"))
    assert isinstance(sink, ObjectStoreFileSink)
    txn = _write(sink, [{"a": 1}])
    s3.fs().rm(sink.part_path(txn.parts[0]))
    with pytest.raises(CheckpointError, match="is missing and was never committed"):
        sink.commit("sink", txn)
    assert not s3.fs().exists(sink.manifest_path(txn.transaction_id))


def test_commit_refuses_a_part_name_it_never_writes(s3: S3Bucket) -> None:  # noqa: F811
    sink = FileSink(s3.url("out"))
    txn = SinkTransactionModel(transaction_id="sink-0-x", parts=["../other/sink-0-x.jsonl"])
    with pytest.raises(CheckpointError, match="not a part name this sink wrote"):
        sink.commit("sink", txn)


def test_abort_keeps_committed_parts_kept_parts_and_earlier_attempts_only(s3: S3Bucket) -> None:  # noqa: F811
    sink = FileSink(s3.url("out"))
    assert isinstance(sink, ObjectStoreFileSink)
    committed = _write(sink, [{"a": "committed"}], _ctx(attempt=1))
    sink.commit("sink", committed)
    old = _write(sink, [{"a": "attempt 1"}], _ctx(attempt=1, epoch=1))
    kept = _write(sink, [{"a": "kept"}], _ctx(attempt=2, epoch=2))
    new = _write(sink, [{"a": "attempt 3"}], _ctx(attempt=3, epoch=3))
    # An earlier-attempt sweep removes attempt 1's uncommitted part, never the committed one.
    assert sink.abort_uncommitted(JOB, "sink", keep=set(), before_attempt=2) == 1
    assert not s3.fs().exists(sink.part_path(old.parts[0]))
    assert sink.abort_uncommitted(JOB, "sink", keep=set(kept.parts)) == 1
    assert not s3.fs().exists(sink.part_path(new.parts[0]))
    assert sink.uncommitted_parts() == kept.parts
    assert sink.committed_lines() == ['{"a": "committed"}']


def test_a_fork_commits_the_restored_transaction_once_and_aborts_only_its_own(
    s3: S3Bucket,  # noqa: F811
) -> None:
    """A job restored from another's checkpoint into the same output, both running."""
    original = FileSink(s3.url("out"))
    fork = FileSink(s3.url("out"))
    restored = _write(original, [{"a": "decided"}])  # pre-committed in the shared checkpoint
    pending = _write(original, [{"a": "original's open"}], _ctx(epoch=1))
    forks_own = _write(fork, [{"a": "fork's stale"}], _ctx(job=FORK, epoch=1))
    # Both commit the restored transaction at the same time: the same manifest, put twice.
    done: list[int] = []
    threads = [
        threading.Thread(target=lambda s=s: done.append(s.commit("sink", restored)))
        for s in (original, fork)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(done) in (1, 2)  # each put the same bytes, or one saw the other's manifest
    assert fork.commit("sink", restored) == 0
    # The fork's restore aborts only what the fork wrote.
    assert fork.abort_uncommitted(FORK, "sink", keep=set()) == 1
    assert original.uncommitted_parts() == pending.parts
    assert not s3.fs().exists(fork.part_path(forks_own.parts[0]))
    assert original.commit("sink", pending) == 1
    assert sorted(original.committed_lines()) == ['{"a": "decided"}', '{"a": "original\'s open"}']


def test_an_unknown_protocol_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="cannot write the file sink's output"):
        FileSink("nosuchstore://bucket/out")
    with pytest.raises(ConfigurationError, match="names no bucket"):
        FileSink("s3://")


def test_an_output_the_job_cannot_write_is_refused_on_the_driver(s3: S3Bucket) -> None:  # noqa: F811
    with pytest.raises(ConfigurationError, match=r"cannot write to --output s3://Not_A_Bucket!"):
        FileSink("s3://Not_A_Bucket!/out")
    FileSink(s3.url("out"))
    assert s3.fs().find(s3.name) == []  # the probe object is gone again


def test_a_transaction_names_its_output_and_a_sink_elsewhere_reaches_it(
    s3: S3Bucket,  # noqa: F811
) -> None:
    """A fork into another output commits the restored transactions where they were
    pre-committed (``at``), with its own store options."""
    original, fork = FileSink(s3.url("out-a")), FileSink(s3.url("out-b"))
    restored = _write(original, [{"a": "decided"}])
    assert restored.location == original.location == s3.url("out-a")
    there = fork.at(restored.location)
    assert isinstance(there, ObjectStoreFileSink) and there.location == original.location
    assert there.storage_options == fork.storage_options
    assert there.commit("sink", restored) == 1
    assert original.committed_lines() == ['{"a": "decided"}']
    assert fork.committed_lines() == []
    assert fork.at("s3://Not_A_Bucket!/out") is None
