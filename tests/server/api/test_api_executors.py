"""A job's Spark executors and their hosts: listed by the driver in its per-epoch heartbeat,
stored by the control plane (each database, the real Redis), served by ``GET /jobs/{id}``."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from service_harness import Harness
from sqlalchemy import create_engine, inspect

from sparkpoint import protocol as p
from sparkpoint_server.storage.db import migrate

from .conftest import AppFactory

LOST = "worker lost: 127.0.0.1:41235 got disassociated"
EXECUTORS = [
    p.ExecutorModel(executor_id="2", host="10.0.0.7", cores=4, active=True),
    p.ExecutorModel(executor_id="1", host="10.0.0.6", cores=4, active=False, remove_reason=LOST),
]


def heartbeat(h: Harness, epoch: int, executors: list[p.ExecutorModel] | None) -> None:
    h.send(
        1,
        p.Heartbeat(
            epoch=epoch,
            records=10,
            duration_ms=5.0,
            records_per_second=2000.0,
            source_lag=0,
            host_time=0,
            executors=executors,
        ),
    )


def spark(client: TestClient, job_id: str) -> dict[str, object]:
    answer = client.get(f"/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["spark"])


def test_the_latest_heartbeat_lists_the_executors_and_their_hosts(
    harness: Harness, make_client: AppFactory
) -> None:
    harness.register()
    harness.running(1, spark_application_id="app-20261126-0001", spark_ui_url=None)
    heartbeat(harness, 0, [*EXECUTORS[:1], EXECUTORS[1].model_copy(update={"active": True})])
    heartbeat(harness, 1, EXECUTORS)

    executors = spark(make_client(), harness.job_id)["executors"]

    assert executors == [
        {"id": "2", "host": "10.0.0.7", "cores": 4, "active": True, "remove-reason": None},
        {"id": "1", "host": "10.0.0.6", "cores": 4, "active": False, "remove-reason": LOST},
    ]


def test_a_driver_that_lists_none_has_null_executors(
    harness: Harness, make_client: AppFactory
) -> None:
    harness.register()
    harness.running(1, spark_application_id="app-20261126-0001", spark_ui_url=None)
    heartbeat(harness, 0, None)

    assert spark(make_client(), harness.job_id)["executors"] is None


def test_a_restarted_driver_forgets_the_previous_applications_executors(
    harness: Harness, make_client: AppFactory
) -> None:
    harness.register("driver-1")
    harness.running(1, spark_application_id="app-20261126-0001", spark_ui_url=None)
    heartbeat(harness, 0, EXECUTORS)
    harness.register("driver-2")

    assert spark(make_client(), harness.job_id)["executors"] is None


def test_0008_adds_a_nullable_executors_column(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate(url, "0007")
    migrate(url)
    engine = create_engine(url)
    [column] = [c for c in inspect(engine).get_columns("jobs") if c["name"] == "spark_executors"]
    engine.dispose()
    assert column["nullable"] is True
