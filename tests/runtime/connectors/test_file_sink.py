"""The two-phase-commit file sink: hidden parts, atomic commit, idempotence, abort."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparkpoint.connectors.sinks import FileSink, WriterContext, format_json_lines
from sparkpoint.errors import CheckpointError, ConfigurationError
from sparkpoint.records import Batch
from sparkpoint.testing import committed_lines, uncommitted_files


def _ctx(epoch: int = 0, task_attempt: int = 7) -> WriterContext:
    return WriterContext("0123456789", "sink", 0, 1, epoch, task_attempt)


def test_lines_become_visible_only_when_committed(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    writer = sink.writer(_ctx(), None)
    writer.write(Batch.of_rows([{"a": 1}, {"a": 2}]))
    txn = writer.pre_commit(1)
    writer.write(Batch.of_rows([{"a": 3}]))
    open_txn = writer.close_epoch()
    assert committed_lines(str(tmp_path)) == []
    assert len(uncommitted_files(str(tmp_path))) == 2
    assert txn.records == 2 and open_txn.records == 1
    assert sink.commit("sink", txn) == 1
    assert committed_lines(str(tmp_path)) == ['{"a": 1}', '{"a": 2}']
    assert sink.commit("sink", txn) == 0  # idempotent
    assert committed_lines(str(tmp_path)) == ['{"a": 1}', '{"a": 2}']
    assert sink.abort_uncommitted("0123456789", "sink", keep=set()) == 1
    assert uncommitted_files(str(tmp_path)) == []


def test_a_transaction_spans_epochs_and_keeps_every_part(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    w0 = sink.writer(_ctx(epoch=0), None)
    w0.write(Batch.of_rows([{"x": "e0"}]))
    carried = w0.close_epoch()
    w1 = sink.writer(_ctx(epoch=1, task_attempt=8), carried)
    w1.write(Batch.of_rows([{"x": "e1"}]))
    txn = w1.pre_commit(5)
    assert txn.transaction_id == carried.transaction_id
    assert len(txn.parts) == 2
    sink.commit("sink", txn)
    assert sorted(committed_lines(str(tmp_path))) == ['{"x": "e0"}', '{"x": "e1"}']


def test_commit_of_a_lost_part_fails_loudly(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    writer = sink.writer(_ctx(), None)
    writer.write(Batch.of_rows([{"a": 1}]))
    txn = writer.pre_commit(1)
    (tmp_path / txn.parts[0]).unlink()
    with pytest.raises(CheckpointError, match="is missing and was never committed"):
        sink.commit("sink", txn)


def test_commit_refuses_names_it_did_not_write(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path))
    writer = sink.writer(_ctx(), None)
    txn = writer.pre_commit(1).model_copy(update={"parts": ["../../etc/passwd"]})
    with pytest.raises(CheckpointError, match="is not a part name this sink wrote"):
        sink.commit("sink", txn)


def test_columnar_json_lines_match_json_dumps() -> None:
    batch = Batch.of_columns(
        app_id=np.array(['a"b', "c"]), pv=np.array([1, 20]), ok=np.array([True, False])
    )
    assert format_json_lines(batch) == (
        '{"app_id": "a\\"b", "pv": 1, "ok": true}\n{"app_id": "c", "pv": 20, "ok": false}\n'
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_names_the_part_file_it_could_not_write(tmp_path: Path) -> None:
    """``[Errno 28] No space left on device`` alone does not say which disk is full."""
    sink = FileSink(str(tmp_path))
    sink.writer(_ctx(), None).write(Batch.of_rows([{"a": 1}]))
    (part,) = uncommitted_files(str(tmp_path))
    (tmp_path / part).unlink()
    (tmp_path / part).symlink_to("/dev/full")  # every write there fails with ENOSPC
    writer = sink.writer(_ctx(), None)  # the same transaction's part, written again
    writer.write(Batch.of_rows([{"a": 1}]))
    with pytest.raises(OSError, match="No space left on device") as failed:
        writer.pre_commit(1)
    assert failed.value.filename == str(tmp_path / part)
    assert str(tmp_path / part) in str(failed.value)


def test_an_output_directory_a_file_is_in_the_way_of_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    """A wrong ``--output`` is the user's setting, not a bug of the job file: `sparkpoint run`
    says it in one line (exit 2) instead of the job file's traceback."""
    (tmp_path / "taken").write_text("")
    for path, why in (("taken", "a file is in the way"), ("taken/out", "Not a directory")):
        with pytest.raises(ConfigurationError) as refused:
            FileSink(str(tmp_path / path))
        assert str(refused.value) == (
            f"FileSink cannot create the directory {tmp_path / path}: {why}"
        )
