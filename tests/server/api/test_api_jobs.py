"""Job reads: the list, one job, throughput, exceptions, configuration, restart strategy."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from .builders import (
    CONFIG,
    GRAPH,
    T0,
    add_checkpoint,
    add_exception,
    add_heartbeat,
    add_job,
    add_status,
)
from .conftest import NOW


@pytest.fixture
def two_jobs(sessions: sessionmaker[Session]) -> None:
    """``old`` finished after 30 s; ``new`` runs since T0 + 10 s with checkpoints 1 and 2."""
    with sessions() as s:
        add_job(s, "old", status="FINISHED", end_time=T0 + 30_000, attempt=2, restarts=1)
        add_job(
            s,
            "new",
            start_time=T0 + 10_000,
            records=12_345,
            records_per_second=2_500.5,
            source_lag=17,
            last_heartbeat=T0 + 59_000,
            spark_application_id="app-20231114221320-0007",
            spark_ui_url="http://driver-1:4041",
            heartbeat_interval=10_000,
            last_driver_heartbeat=T0 + 61_000,
        )
        s.flush()
        add_checkpoint(s, 1, job_id="new")
        add_checkpoint(s, 2, job_id="new", status="IN_PROGRESS")
        add_heartbeat(s, 1, 1, job_id="new", records=12_000)
        add_heartbeat(s, 1, 2, job_id="new", records=345)
        add_status(s, "CREATED", T0 + 10_000, job_id="new")
        add_status(s, "RUNNING", T0 + 11_000, job_id="new", previous="CREATED")
        add_status(
            s, "RESTARTING", T0 + 20_000, job_id="new", previous="RUNNING", cause="task failed"
        )
        add_status(s, "RUNNING", T0 + 21_000, job_id="new", previous="RESTARTING", attempt=2)
        s.commit()


@pytest.mark.usefixtures("two_jobs")
def test_jobs_are_listed_newest_first(client: TestClient) -> None:
    response = client.get("/jobs")

    assert response.status_code == 200
    assert response.json() == {
        "jobs": [
            {
                "id": "new",
                "name": "new-name",
                "status": "RUNNING",
                "start-time": T0 + 10_000,
                "end-time": -1,
                "duration": NOW - T0 - 10_000,
                "attempt": 1,
                "restarts": 0,
                # checkpoint 2 is still in progress: the last one with an outcome is 1
                "last-checkpoint": {"id": 1, "status": "COMPLETED", "timestamp": T0 + 1050},
                "records-per-second": 2_500.5,
                "guarantee": None,  # its driver reported none
            },
            {
                "id": "old",
                "name": "old-name",
                "status": "FINISHED",
                "start-time": T0,
                "end-time": T0 + 30_000,
                "duration": 30_000,
                "attempt": 2,
                "restarts": 1,
                "last-checkpoint": None,
                "records-per-second": 0.0,
                "guarantee": None,
            },
        ],
        "total": 2,
    }


@pytest.mark.usefixtures("two_jobs")
def test_the_job_list_is_paged(client: TestClient) -> None:
    """A page of ``limit`` jobs after ``offset``, newest first; ``total`` counts them all."""
    first = client.get("/jobs", params={"limit": 1}).json()
    second = client.get("/jobs", params={"limit": 1, "offset": 1}).json()
    beyond = client.get("/jobs", params={"offset": 2}).json()

    assert ([j["id"] for j in first["jobs"]], first["total"]) == (["new"], 2)
    assert ([j["id"] for j in second["jobs"]], second["total"]) == (["old"], 2)
    assert (beyond["jobs"], beyond["total"]) == ([], 2)
    for bad in ({"limit": 0}, {"limit": 10_001}, {"offset": -1}):
        answer = client.get("/jobs", params=bad)
        assert answer.status_code == 400, bad
        assert next(iter(bad)) in answer.json()["errors"][0]


@pytest.mark.usefixtures("two_jobs")
def test_job_details_have_flinks_fields_and_the_status_history(client: TestClient) -> None:
    response = client.get("/jobs/new")

    assert response.status_code == 200
    assert response.json() == {
        "jid": "new",
        "name": "new-name",
        "state": "RUNNING",
        "start-time": T0 + 10_000,
        "end-time": -1,
        "duration": NOW - T0 - 10_000,
        "now": NOW,
        "attempt": 1,
        "restarts": 0,
        "vertices": [
            {
                "id": "source",
                "name": "source -> parse",
                "parallelism": 2,
                "maxParallelism": 128,
                "operators": ["a", "b"],
            },
            {
                "id": "count",
                "name": "count -> sink",
                "parallelism": 3,
                "maxParallelism": 128,
                "operators": ["c", "d"],
            },
        ],
        "edges": [{"source": "source", "target": "count"}],
        "timestamps": {
            "CREATED": T0 + 10_000,
            "RUNNING": T0 + 11_000,  # the first time
            "FAILING": 0,
            "RESTARTING": T0 + 20_000,
            "FAILED": 0,
            "CANCELLING": 0,
            "CANCELED": 0,
            "FINISHED": 0,
        },
        "status-history": [
            {
                "timestamp": T0 + 10_000,
                "status": "CREATED",
                "previous": None,
                "cause": None,
                "attempt": 1,
            },
            {
                "timestamp": T0 + 11_000,
                "status": "RUNNING",
                "previous": "CREATED",
                "cause": None,
                "attempt": 1,
            },
            {
                "timestamp": T0 + 20_000,
                "status": "RESTARTING",
                "previous": "RUNNING",
                "cause": "task failed",
                "attempt": 1,
            },
            {
                "timestamp": T0 + 21_000,
                "status": "RUNNING",
                "previous": "RESTARTING",
                "cause": None,
                "attempt": 2,
            },
        ],
        "throughput": {
            "records": 12_345,
            "records-per-second": 2_500.5,
            "source-lag": 17,
            "unanswered-splits": [],
            "epoch-bound": None,
            "last-heartbeat": T0 + 59_000,
        },
        "config": CONFIG,
        "spark": {
            "ui-url": "http://driver-1:4041",
            "application-id": "app-20231114221320-0007",
            "executors": None,  # its driver listed none
        },
        "driver": {
            "heartbeat-interval": 10_000,
            "last-heartbeat": T0 + 61_000,
            "first-epoch-ended": None,  # its driver does not report it
        },
        "guarantee": None,  # its driver reported none
    }


@pytest.mark.usefixtures("two_jobs")
def test_a_job_whose_driver_named_no_spark_application_has_null_spark_fields(
    client: TestClient,
) -> None:
    body = client.get("/jobs/old").json()

    assert body["spark"] == {"ui-url": None, "application-id": None, "executors": None}
    assert body["driver"] == {
        "heartbeat-interval": None,
        "last-heartbeat": None,
        "first-epoch-ended": None,
    }


def test_job_reads_of_an_unknown_job_are_404(client: TestClient) -> None:
    for path in (
        "/jobs/nope",
        "/jobs/nope/metrics/throughput",
        "/jobs/nope/exceptions",
        "/jobs/nope/checkpoints/config",
        "/jobs/nope/restart-strategy",
    ):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json() == {"errors": ["job nope not found"]}, path


def test_throughput_is_the_last_heartbeats_oldest_first(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s)
        s.flush()
        for epoch in range(1, 4):
            add_heartbeat(s, 1, epoch)
        add_heartbeat(s, 2, 1, timestamp=T0 + 9000)  # after a restart: attempt 2, epoch 1
        add_heartbeat(s, 1, 1, job_id="other-job")
        s.commit()

    response = client.get("/jobs/job-1/metrics/throughput", params={"limit": 2})

    assert response.status_code == 200
    assert response.json() == [
        {
            "timestamp": T0 + 3000,
            "attempt": 1,
            "epoch": 3,
            "records": 300,
            "records-per-second": 300.0,
            "source-lag": 3,
            "unanswered-splits": [],
            "duration": 1000.0,
        },
        {
            "timestamp": T0 + 9000,
            "attempt": 2,
            "epoch": 1,
            "records": 100,
            "records-per-second": 100.0,
            "source-lag": 1,
            "unanswered-splits": [],
            "duration": 1000.0,
        },
    ]
    assert len(client.get("/jobs/job-1/metrics/throughput").json()) == 4


def test_exceptions_are_newest_first_and_say_when_truncated(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s)
        s.flush()
        add_exception(s, T0 + 1000, cause="old failure")
        add_exception(
            s,
            T0 + 2000,
            kind="CHECKPOINT_FAILURE",
            cause="Traceback: ...",
            operator_id="count",
            subtask=2,
            attempt=2,
            epoch=None,
            action="no restart: fixed-delay: failure 4 exceeds 3 attempts",
        )
        add_exception(s, T0 + 3000, operator_id="source", cause="no subtask")
        s.commit()

    response = client.get("/jobs/job-1/exceptions", params={"limit": 2})

    assert response.status_code == 200
    assert response.json() == {
        "exceptionHistory": {
            "entries": [
                {
                    "exceptionName": "TASK_FAILURE",
                    "stacktrace": "no subtask",
                    "timestamp": T0 + 3000,
                    "taskName": "source",
                    "attempt": 1,
                    "epoch": 7,
                    "action": "restart in 10 s",
                },
                {
                    "exceptionName": "CHECKPOINT_FAILURE",
                    "stacktrace": "Traceback: ...",
                    "timestamp": T0 + 2000,
                    "taskName": "count[2]",
                    "attempt": 2,
                    "epoch": None,
                    "action": "no restart: fixed-delay: failure 4 exceeds 3 attempts",
                },
            ],
            "truncated": True,
        }
    }
    everything = client.get("/jobs/job-1/exceptions").json()["exceptionHistory"]
    assert (len(everything["entries"]), everything["truncated"]) == (3, False)
    # Flink's clients ask with maxExceptions; it is bounded as limit is.
    flinks = client.get("/jobs/job-1/exceptions", params={"maxExceptions": 2})
    assert flinks.json() == response.json()
    refused = client.get("/jobs/job-1/exceptions", params={"maxExceptions": 0})
    assert (refused.status_code, refused.json()) == (
        400,
        {"errors": ["maxExceptions: Input should be greater than or equal to 1"]},
    )


def test_checkpoint_config_uses_flinks_names_and_lists_what_may_change(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s, checkpoint_config={"interval_ms": 5000, "retained": 2})
        s.commit()

    response = client.get("/jobs/job-1/checkpoints/config")

    assert response.status_code == 200
    assert response.json() == {
        "mode": "exactly_once",
        "interval": 5000,  # current value, changed since registration
        "timeout": 60_000,  # as registered
        "min_pause": 0,
        "max_concurrent": 1,
        "tolerable_failed_checkpoints": 2,
        "retained": 2,
        "state_backend": "rocksdb",
        "incremental": True,
        "checkpoint_storage": "filesystem",
        "checkpoint_dir": "file:///tmp/chk",
        "changeable": [
            "interval",
            "timeout",
            "min_pause",
            "tolerable_failed_checkpoints",
            "retained",
        ],
    }


def test_checkpoint_config_falls_back_to_flinks_defaults(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s, checkpoint_config={}, config={})
        s.commit()

    body = client.get("/jobs/job-1/checkpoints/config").json()

    assert {k: body[k] for k in ("mode", "interval", "timeout", "max_concurrent", "retained")} == {
        "mode": "exactly_once",
        "interval": 0,
        "timeout": 600_000,
        "max_concurrent": 1,
        "retained": 1,
    }
    assert body["state_backend"] is None
    assert body["incremental"] is False


def test_restart_strategy_has_flinks_keys_and_a_description(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s)
        add_job(s, "default", restart_strategy={})
        s.commit()

    assert client.get("/jobs/job-1/restart-strategy").json() == {
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": 3,
        "restart-strategy.fixed-delay.delay": "10 s",
        "description": "fixed-delay: up to 3 restarts, 10 s apart",
    }
    assert client.get("/jobs/default/restart-strategy").json() == {
        "description": "exponential-delay: 1 s x 1.5 up to 1 min, jitter 0.1, reset after 1 h "
        "running, no attempt limit"
    }


def test_the_graph_of_the_builder_is_what_the_detail_shows(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    with sessions() as s:
        add_job(s, config={})
        s.commit()

    vertices = client.get("/jobs/job-1").json()["vertices"]

    assert [(v["id"], v["parallelism"], v["maxParallelism"]) for v in vertices] == [
        (v["id"], v["parallelism"], None) for v in GRAPH["vertices"]
    ]
