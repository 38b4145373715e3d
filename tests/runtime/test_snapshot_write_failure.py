"""A snapshot that cannot be written fails its checkpoint, not the task (Flink's
``CHECKPOINT_ASYNC_EXCEPTION``): the tolerable failures decide whether the job fails over. A
durable copy of an epoch's working state that cannot be written fails nothing: the version
stays on its executor.

The failure is the file system's own: once checkpoint 2 has completed, a regular file is put
where checkpoint 3's directory must be created, so every subtask's upload of checkpoint 3
raises ``OSError`` (as a full or read-only checkpoint storage does). Discarding the failed
checkpoint removes that file, and the checkpoints after it are written as usual.
"""

from __future__ import annotations

import itertools
import logging
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sparkpoint import protocol as p
from sparkpoint.events import InMemoryEventSink
from sparkpoint.protocol import CheckpointAborted, CheckpointCompleted, JobStatus
from sparkpoint.runtime import working_state
from sparkpoint.testing import line_counts

from .pv_harness import BACKENDS, IN_PROCESS, run_pv

BLOCKED = 3


class _BlockNextCheckpoint(InMemoryEventSink):
    """Puts a file where checkpoint :data:`BLOCKED`'s directory goes once the one before it
    completed (a directory made before the job started would be swept at its start); with
    ``until``, the file stands where the durable working state goes instead, from then until
    checkpoint ``until`` completed."""

    def __init__(self, job_dir: Path, until: int | None = None) -> None:
        super().__init__()
        self.blocker = job_dir / (f"chk-{BLOCKED}" if until is None else "working")
        self.until = until
        self.placed = False

    def publish(self, events: Sequence[p.Envelope]) -> None:
        super().publish(events)
        for e in events:
            ev = e.decoded()
            if isinstance(ev, CheckpointCompleted) and ev.checkpoint_id == BLOCKED - 1:
                shutil.rmtree(self.blocker, ignore_errors=True)
                self.blocker.write_text("not a directory")
                self.placed = True
            elif isinstance(ev, CheckpointCompleted) and ev.checkpoint_id == self.until:
                self.blocker.unlink()


class _LoseTheExecutor(_BlockNextCheckpoint):
    """As :class:`_BlockNextCheckpoint` with durable copies refused from checkpoint 2 on; once
    checkpoint :data:`BLOCKED` completed, the executor's local copies go too (its disk lost,
    or the next epoch scheduled elsewhere): no copy of the working state is left anywhere."""

    def __init__(self, job_dir: Path, local_dir: Path) -> None:
        super().__init__(job_dir, until=0)
        self.local_dir = local_dir

    def publish(self, events: Sequence[p.Envelope]) -> None:
        super().publish(events)
        for e in events:
            ev = e.decoded()
            if isinstance(ev, CheckpointCompleted) and ev.checkpoint_id == BLOCKED:
                shutil.rmtree(self.local_dir)


@pytest.fixture(autouse=True)
def durable_copies_not_failing() -> None:
    """The log-once state of durable copies is per process: no test starts in another's row."""
    working_state._DURABLE_COPIES = working_state._durable_copies_streak()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    _, out = run_pv(IN_PROCESS, tmp_path_factory.mktemp("baseline"), "baseline")
    return line_counts(out)


def _run(
    tmp_path: Path,
    name: str,
    backend: tuple[str, bool],
    tolerable: int,
    *,
    durable_until: int | None = None,
) -> tuple:
    sink = _BlockNextCheckpoint(tmp_path / name / "chk" / f"pv-{name}", durable_until)
    result, out = run_pv(
        IN_PROCESS,
        tmp_path,
        name,
        backend=backend,
        max_inline=0,  # every snapshot goes to the storage
        tolerable_failures=tolerable,
        event_sink=sink,
        isolate_workers=durable_until is not None,  # durable working state, as on a cluster
    )
    assert sink.placed
    return result, out, sink


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_snapshot_that_cannot_be_written_fails_its_checkpoint_and_the_job_goes_on(
    tmp_path: Path, baseline: Counter[str], backend: tuple[str, bool]
) -> None:
    result, out, sink = _run(tmp_path, "tolerated", backend, tolerable=1)
    assert result.status is JobStatus.FINISHED
    assert (result.attempt, result.restores) == (1, [])
    assert result.events is not None
    (aborted,) = [e for e in result.events.of_type(CheckpointAborted) if e.checkpoint_id == 3]
    assert "declined by pv[" in aborted.reason
    assert "its snapshot could not be written to " in aborted.reason
    # Where: the operator must know which file system refused (a full disk's error names none).
    assert str(tmp_path / "tolerated" / "chk" / "pv-tolerated" / "chk-3") in aborted.reason
    assert "Error" in aborted.reason  # the file system's error, by name
    # A snapshot taken but not written is the asynchronous part's failure, not a refusal.
    declined = [e for e in result.events.of_type(p.CheckpointDeclined) if e.checkpoint_id == 3]
    assert declined and all(d.asynchronous for d in declined), declined
    completed = [e.checkpoint_id for e in result.events.of_type(CheckpointCompleted)]
    assert BLOCKED not in completed and max(completed) > BLOCKED
    assert not sink.blocker.exists()  # discarded with the failed checkpoint
    assert line_counts(out) == baseline


def test_with_no_tolerable_failure_the_job_fails_over_to_its_last_checkpoint(
    tmp_path: Path, baseline: Counter[str]
) -> None:
    result, out, _ = _run(tmp_path, "failover", ("hashmap", False), tolerable=0)
    assert result.status is JobStatus.FINISHED
    assert (result.attempt, result.restores) == (2, [BLOCKED - 1])
    assert line_counts(out) == baseline


@pytest.mark.parametrize("backend", BACKENDS)
def test_durable_working_state_the_storage_cannot_take_fails_no_epoch(
    tmp_path: Path,
    baseline: Counter[str],
    backend: tuple[str, bool],
    caplog: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Checkpoints 3 and 4 are written; the durable copies of their epochs are not.
    caplog.set_level(logging.INFO, logger=working_state.__name__)
    result, out, _ = _run(tmp_path, "durable", backend, tolerable=0, durable_until=BLOCKED + 1)
    assert result.status is JobStatus.FINISHED
    assert (result.attempt, result.restores) == (1, [])
    assert result.events is not None
    assert not result.events.of_type(CheckpointAborted)
    # Logged once when the copies start failing, and once when they are written again.
    assert caplog.text.count("failed (the version is kept on this executor only; one line") == 1
    assert "failed 2 times in a row" not in caplog.text  # within the 10 s: not told again
    assert caplog.text.count("durable copies of working state are written again") == 1
    # The driver's console says it too, from the task reports: once (within a minute), with
    # the subtasks, and once when the copies come back.
    console = capsys.readouterr().err
    told = [line for line in console.splitlines() if "took no durable copy" in line]
    assert len(told) == 1 and "pv[0]" in told[0] and "(1 epoch(s) in a row;" in told[0], told
    assert console.count("durable copies of working state are written again, after") == 1
    assert line_counts(out) == baseline


def test_working_state_with_no_copy_left_anywhere_recovers_from_the_latest_checkpoint(
    tmp_path: Path, baseline: Counter[str]
) -> None:
    name = "lost"
    sink = _LoseTheExecutor(tmp_path / name / "chk" / f"pv-{name}", tmp_path / name / "local")
    result, out = run_pv(
        IN_PROCESS,
        tmp_path,
        name,
        max_inline=0,
        event_sink=sink,
        isolate_workers=True,  # durable working state, as on a cluster
    )
    assert result.status is JobStatus.FINISHED
    assert (result.attempt, result.restores) == (2, [BLOCKED])
    assert line_counts(out) == baseline


class _BlockFinalCheckpoints(InMemoryEventSink):
    """Puts a file where each of the first ``count`` final checkpoints' directories goes as
    it is triggered: a storage that is full when the input ends."""

    def __init__(self, job_dir: Path, count: int) -> None:
        super().__init__()
        self.job_dir, self.count, self.placed = job_dir, count, 0

    def publish(self, events: Sequence[p.Envelope]) -> None:
        super().publish(events)
        for e in events:
            ev = e.decoded()
            if isinstance(ev, p.CheckpointTriggered) and ev.is_final and self.placed < self.count:
                self.job_dir.mkdir(parents=True, exist_ok=True)
                (self.job_dir / f"chk-{ev.checkpoint_id}").write_text("not a directory")
                self.placed += 1


def test_a_final_checkpoint_that_cannot_be_written_is_tried_again_an_interval_later(
    tmp_path: Path, baseline: Counter[str]
) -> None:
    """Tried again at once, the two tolerable failures would pass in two empty epochs of a few
    milliseconds; a storage away for longer would fail the job over."""
    interval_ms = 300
    sink = _BlockFinalCheckpoints(tmp_path / "final" / "chk" / "pv-final", count=2)
    result, out = run_pv(
        IN_PROCESS,
        tmp_path,
        "final",
        max_inline=0,
        tolerable_failures=2,
        interval_ms=interval_ms,
        event_sink=sink,
    )
    assert result.status is JobStatus.FINISHED
    assert (result.attempt, result.restores) == (1, [])
    assert result.events is not None
    finals = [e for e in result.events.of_type(p.CheckpointTriggered) if e.is_final]
    assert len(finals) == 3
    gaps = [b.trigger_timestamp - a.trigger_timestamp for a, b in itertools.pairwise(finals)]
    assert min(gaps) >= interval_ms, gaps
    aborted = {e.checkpoint_id: e.reason for e in result.events.of_type(CheckpointAborted)}
    for final in finals[:2]:
        assert "its snapshot could not be written" in aborted[final.checkpoint_id]
    assert line_counts(out) == baseline
