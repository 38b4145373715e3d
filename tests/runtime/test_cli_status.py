"""``sparkpoint status | exceptions | config | restart-strategy``'s text and arguments (the
end-to-end test in ``tests/e2e/test_cli_client.py`` runs them against a real control plane)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from sparkpoint.cli_status import (
    config_lines,
    exceptions_lines,
    job_list_lines,
    millis,
    restart_strategy_body,
    status_lines,
)

NOW = 1_765_000_000_000


def _shown(**job: Any) -> dict[str, Any]:
    base = {
        "jid": "pv-1",
        "name": "pv",
        "state": "FAILED",
        "attempt": 3,
        "restarts": 1,
        "start-time": NOW - 3_600_000,
        "now": NOW,
        "status-history": [
            {"timestamp": NOW - 60_000, "status": "FAILED", "cause": "boom (no more restarts)"}
        ],
        "throughput": {
            "records": 1_234_567,
            "records-per-second": 20_000.0,
            "source-lag": 1200,
            "last-heartbeat": NOW - 61_000,
        },
        "driver": {"heartbeat-interval": 2000, "last-heartbeat": NOW - 60_500},
        "guarantee": {"level": "at_least_once", "reason": "sink 'audit' writes at once"},
        "spark": {"ui-url": "http://host:4040", "application-id": "local-17"},
    }
    failed = {
        "id": 12,
        "failure_timestamp": NOW - 90_000,
        "failure_message": "checkpoint 12 of job pv-1 expired before completing after 2000 ms",
    }
    return {
        "job": {**base, **job},
        "checkpoints": {
            "counts": {"total": 13, "completed": 11, "failed": 1, "in_progress": 1},
            "latest": {"completed": None, "savepoint": None, "failed": failed},
            "history": [
                {
                    "id": 13,
                    "status": "IN_PROGRESS",
                    "is_savepoint": False,
                    "trigger_timestamp": NOW - 4000,
                    "num_acknowledged_subtasks": 3,
                    "num_subtasks": 4,
                }
            ],
        },
        "exceptions": {
            "entries": [
                {
                    "exceptionName": "CHECKPOINT_FAILURE",
                    "stacktrace": "Exceeded checkpoint tolerable failure threshold.",
                    "timestamp": NOW - 60_000,
                    "taskName": None,
                    "attempt": 2,
                    "epoch": None,
                    "action": "job failed (fixed-delay: failure 2 exceeds 1 attempts)",
                }
            ],
            "truncated": True,
        },
        "restart_strategy": {"description": "fixed-delay: up to 1 restart, 1 s apart"},
    }


def test_a_failed_job_says_why_when_its_epochs_and_driver_last_spoke() -> None:
    lines = status_lines(_shown())
    assert lines[0].startswith("job pv-1 (pv): FAILED, attempt 3, 1 restart; started ")
    assert lines[0].endswith("(60 min ago)")
    assert lines[1].endswith("(60.0 s ago): boom (no more restarts)")
    assert lines[2].startswith(
        "records read: 1,234,567, 20,000 records/s in the latest epoch, source lag 1,200; "
        "latest epoch ended "
    )
    assert lines[3].startswith("driver heartbeat: every 2 s, latest ")
    assert lines[5] == (
        "in progress: checkpoint 13, triggered 2025-12-06 05:46:36 UTC (4,000 ms ago), 3/4 "
        "subtasks acknowledged (which: sparkpoint checkpoints pv-1 --id 13)"
    )
    assert lines[6] == (
        "latest failed: 12, 2025-12-06 05:45:10 UTC (90.0 s ago): checkpoint 12 of job pv-1 "
        "expired before completing after 2000 ms"
    )
    assert "guarantee: at-least-once (sink 'audit' writes at once)" in lines
    assert "Spark: application local-17, UI http://host:4040" in lines
    assert lines[-2] == "latest failures, newest first, older ones: sparkpoint exceptions:"
    assert lines[-1].endswith(
        "  attempt 2  CHECKPOINT_FAILURE: Exceeded checkpoint tolerable failure threshold. -> "
        "job failed (fixed-delay: failure 2 exceeds 1 attempts)"
    )


def test_exceptions_name_the_epoch_and_subtask_the_cause_does_not() -> None:
    entry = {
        "exceptionName": "TASK_FAILURE",
        "stacktrace": "ValueError: bad record",
        "timestamp": NOW,
        "taskName": "pv[1]",
        "attempt": 1,
        "epoch": 4,
        "action": None,
    }
    lines = exceptions_lines("pv-1", {"entries": [entry, entry], "truncated": True})
    assert lines[0] == "job pv-1: 2 failures, newest first; older ones exist (--limit)"
    assert lines[1].endswith("UTC  attempt 1, epoch 4, pv[1]  TASK_FAILURE: ValueError: bad record")
    assert exceptions_lines("pv-1", {"entries": [], "truncated": False}) == [
        "job pv-1: no failure recorded"
    ]


def test_config_reads_as_it_was_given() -> None:
    config = {
        "mode": "AT_LEAST_ONCE",
        "interval": 0,
        "timeout": 90_000,
        "min_pause": 500,
        "max_concurrent": 1,
        "tolerable_failed_checkpoints": 0,
        "retained": 3,
        "state_backend": "rocksdb",
        "incremental": True,
        "checkpoint_storage": "filesystem",
        "checkpoint_dir": "file:///chk",
        "changeable": ["interval", "timeout"],
    }
    assert config_lines("pv-1", config) == [
        "job pv-1: checkpoints at-least-once, periodic ones off",
        "timeout 90 s, minimum pause 500 ms, at most 1 at once, 0 tolerable failures, 3 retained",
        "state backend rocksdb (incremental), storage filesystem file:///chk",
        "changeable while it runs: interval, timeout",
    ]


def test_durations_and_restart_strategy_options_are_parsed_or_refused_by_name() -> None:
    # As `sparkpoint run` reads --checkpoint-timeout: a bare number is seconds.
    times = ("0", "10", "1.5", "500ms", "10s", "10 s", "2m", "2min", "1h")
    assert [millis(t) for t in times] == [
        0,
        10_000,
        1500,
        500,
        10_000,
        10_000,
        120_000,
        120_000,
        3_600_000,
    ]
    for bad in ("", "1.5s", "5x", "s", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a time"):
            millis(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="'-1' is not a time: negative"):
        millis("-1")
    assert restart_strategy_body(
        [
            "exponential-delay",
            "max-backoff=1 min",
            "restart-strategy.exponential-delay.jitter-factor=0",
        ]
    ) == {
        "restart-strategy.type": "exponential-delay",
        "restart-strategy.exponential-delay.max-backoff": "1 min",
        "restart-strategy.exponential-delay.jitter-factor": "0",
    }
    with pytest.raises(argparse.ArgumentTypeError, match="'=3' is not KEY=VALUE"):
        restart_strategy_body(["fixed-delay", "=3"])


def test_the_job_list_shows_each_jobs_last_checkpoint_and_says_when_more_exist() -> None:
    job = {
        "id": "pv-1",
        "status": "RUNNING",
        "attempt": 2,
        "restarts": 1,
        "last-checkpoint": {"id": 41, "status": "FAILED", "timestamp": NOW},
        "records-per-second": 16713.4,
        "name": "pv",
    }
    fresh = {**job, "id": "fresh", "last-checkpoint": None, "records-per-second": None}
    lines = job_list_lines({"jobs": [job, fresh], "total": 1002}, "http://cp:8081")
    assert [line.split() for line in lines[1:3]] == [
        ["pv-1", "RUNNING", "2", "1", "41", "FAILED", "2025-12-06", "05:46:40", "16,713", "pv"],
        ["fresh", "RUNNING", "2", "1", "-", "-", "pv"],
    ]
    assert lines[3] == "... and 1000 more (the newest are listed)"
    assert job_list_lines({"jobs": [], "total": 0}, "http://cp:8081") == [
        "no jobs: the control plane at http://cp:8081 knows none"
    ]


def test_a_lag_the_sources_could_not_count_is_unknown_and_names_their_splits() -> None:
    throughput = {
        "records": 10,
        "records-per-second": 5.0,
        "source-lag": None,
        "unanswered-splits": ["redis:ev"],
        "last-heartbeat": NOW - 1000,
    }
    lines = status_lines(_shown(state="RUNNING", throughput=throughput))
    assert ", source lag unknown (redis:ev does not answer); latest epoch ended " in lines[2]


def test_an_epoch_held_back_by_the_checkpoint_timeout_says_so() -> None:
    throughput = {
        "records": 10,
        "records-per-second": 5.0,
        "source-lag": 7,
        "epoch-bound": 1200.0,
        "last-heartbeat": NOW - 1000,
    }
    line = status_lines(_shown(state="RUNNING", throughput=throughput))[2]
    assert line.endswith("(1,000 ms ago), held within 1.2 s by the checkpoint timeout"), line


def test_a_first_epoch_that_has_not_ended_says_that_periodic_checkpoints_wait_for_it() -> None:
    driver = {"heartbeat-interval": 2000, "last-heartbeat": NOW - 500}
    starting = _shown(state="RUNNING", driver={**driver, "first-epoch-ended": False})
    assert (
        "attempt 3's first epoch (Spark's start-up) has not ended: periodic checkpoints start "
        "when it has"
    ) in status_lines(starting)
    for ended in (True, None):
        shown = _shown(state="RUNNING", driver={**driver, "first-epoch-ended": ended})
        assert not any("first epoch" in line for line in status_lines(shown))
