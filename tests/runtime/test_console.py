"""What a running job prints: one line per event that matters, text or JSON, quiet or not."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from sparkpoint import protocol as p
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.console import Console, ConsoleEventSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.runtime.standalone_failover import JobFailedError

from .pv_harness import job_options


def _sink(**console: object) -> tuple[ConsoleEventSink, io.StringIO]:
    out = io.StringIO()
    return ConsoleEventSink(Console("job-1", stream=out, **console), spark_log="/l/s.log"), out


def _publish(sink: ConsoleEventSink, attempt: int, *payloads: p._Model) -> None:
    sink.publish([p.envelope("job-1", attempt, 0, pl) for pl in payloads])


def _completed(cid: int) -> p.CheckpointCompleted:
    return p.CheckpointCompleted(
        checkpoint_id=cid,
        external_path=f"file:///c/chk-{cid}",
        trigger_timestamp=0,
        completion_timestamp=250,
        end_to_end_duration_ms=250.0,
        state_size=2048,
    )


FAILED = p.TaskFailed(epoch=3, cause="ValueError: bad record\nTraceback (most recent call last):")


def test_text_lines_for_a_failure_and_a_restore_and_every_nth_checkpoint() -> None:
    sink, out = _sink(every=2)
    _publish(sink, 1, p.JobRestored(checkpoint_id=None))  # a connected job's start: no line
    _publish(sink, 1, p.JobStatusChanged(status=p.JobStatus.RUNNING, spark_application_id="a-1"))
    _publish(sink, 1, *(_completed(cid) for cid in (1, 2, 3)))
    _publish(sink, 1, FAILED)
    _publish(sink, 2, p.JobRestored(checkpoint_id=3, external_path="file:///c/chk-3"))
    sink.console.ended("FINISHED", 1200, 2.0, 3, 1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "sparkpoint job-1: attempt 1 running on Spark application a-1"
    assert [line for line in lines if "completed in" in line] == [
        "sparkpoint job-1: checkpoint 1 completed in 250 ms, 2.0 KiB (1 so far)",
        "sparkpoint job-1: checkpoint 3 completed in 250 ms, 2.0 KiB (3 so far)",
    ]
    [failure] = [line for line in lines if "failed" in line]
    assert failure == (
        "sparkpoint job-1: ERROR: attempt 1 failed in epoch 3: ValueError: bad record "
        "(Spark's log: /l/s.log)"
    )
    assert any("WARNING: attempt 2 restored from checkpoint 3" in line for line in lines)
    assert lines[-1] == (
        "sparkpoint job-1: FINISHED: 1,200 records in 2.0 s (600/s), 3 checkpoints completed, "
        "1 restores"
    )


def test_a_driver_that_took_over_a_running_job_says_its_counts_start_there() -> None:
    """The connected authority sets ``took_over_at`` from the first restore it obeys
    (tests/runtime/test_connected_no_spark.py): its records, checkpoints and restores are
    this driver's, not the job's, and the end line says so; JSON says it in a field."""
    sink, out = _sink()
    sink.console.took_over_at = 3
    _publish(sink, 3, p.JobRestored(checkpoint_id=27, external_path="file:///c/chk-27"))
    sink.console.ended("FINISHED", 270_170, 23.3, 14, 1)
    assert out.getvalue().splitlines()[-1] == (
        "sparkpoint job-1: FINISHED: 270,170 records in 23.3 s (11,595/s) since this driver "
        "took over at attempt 3, 14 checkpoints completed, 1 restores"
    )
    sink, out = _sink(log_format="json")
    sink.console.ended("FINISHED", 10, 1.0, 1, 1)
    sink.console.took_over_at = 2
    sink.console.ended("FINISHED", 10, 1.0, 1, 1)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert "took_over_at" not in first and "took over" not in first["message"]
    assert second["took_over_at"] == 2


def test_quiet_keeps_failures_restores_and_the_end_only() -> None:
    sink, out = _sink(quiet=True)
    _publish(sink, 1, p.JobStatusChanged(status=p.JobStatus.RUNNING), _completed(1), FAILED)
    _publish(sink, 2, p.JobRestored(checkpoint_id=1))
    sink.console.ended("FINISHED", 10, 1.0, 1, 1)
    text = out.getvalue()
    assert "running" not in text and "completed in" not in text
    assert "ERROR: attempt 1 failed" in text and "restored from checkpoint 1" in text
    assert text.splitlines()[-1].startswith("sparkpoint job-1: FINISHED: 10 records")


def test_json_lines_carry_the_event_and_its_fields() -> None:
    sink, out = _sink(log_format="json", every=1)
    _publish(sink, 1, _completed(7), FAILED)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (first["event"], first["level"], first["checkpoint_id"]) == (
        "checkpoint_completed",
        "info",
        7,
    )
    assert first["job"] == "job-1" and first["duration_ms"] == 250.0
    assert (second["event"], second["level"], second["epoch"]) == ("task_failed", "error", 3)
    assert second["cause"].startswith("ValueError: bad record")
    assert "operator_id" not in second  # a failure that names no subtask


@pytest.mark.parametrize(("fail_after", "warned"), [(150, False), (300, True)])
def test_a_fail_after_beyond_the_first_split_is_named_as_injecting_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fail_after: int, warned: bool
) -> None:
    """``--fail-after`` fails the first split of the first source: with 2 splits of 200
    records, 150 fails and restores the job; 300 never fires, and the job says so."""
    options = job_options(
        f"fail-{fail_after}", tmp_path, "job", epoch_records=50, fail_after=fail_after
    )
    env = StreamExecutionEnvironment(options)
    source = GeneratorSource(events=400, apps=5, rate=0, splits=2)
    env.from_source(source, uid="events").sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    result = JobDriver(env.graph, options, in_process=True).run()
    assert result.status is p.JobStatus.FINISHED and result.records >= 400
    assert len(result.restores) == (0 if warned else 1)
    lines = capsys.readouterr().err.splitlines()
    said = [line for line in lines if "injected no failure" in line]
    assert said == (
        [
            f"sparkpoint fail-{fail_after}: WARNING: --fail-after {fail_after} injected no "
            "failure: it fails the job once the first split of its first source has read "
            f"{fail_after} records, and that split ended before; ask for fewer records"
        ]
        if warned
        else []
    )


def _parse(record: dict[str, object]) -> dict[str, object]:
    if record["event_id"] == 123:
        raise ValueError("cannot parse event 123")
    return record


def test_a_failure_names_the_operators_chained_in_its_subtask(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The map that raised runs in the source's subtask: the line names the chain, as Flink
    names a task ``Source: events -> Map: parse``."""
    options = replace(
        job_options("chain", tmp_path, "job", epoch_records=50),
        restart_strategy={"restart-strategy.type": "none"},
    )
    env = StreamExecutionEnvironment(options)
    source = GeneratorSource(events=400, apps=5, rate=0, splits=1)
    env.from_source(source, uid="events").map(_parse, uid="parse").sink_to(
        FileSink(str(tmp_path / "out")), uid="sink"
    )
    with pytest.raises(JobFailedError):
        JobDriver(env.graph, options, in_process=True).run()
    [failure] = [line for line in capsys.readouterr().err.splitlines() if "ERROR: attempt" in line]
    assert failure.startswith(
        "sparkpoint chain: ERROR: attempt 1 failed in epoch 2 (events[0]: events -> parse -> "
        "sink): ValueError: cannot parse event 123"
    ), failure
