"""What links a job and its checkpoints to the Spark UI: the Spark application that a driver
names when it reports RUNNING, and the epoch whose sources injected each checkpoint's barrier."""

from __future__ import annotations

from typing import Any

from service_harness import TASKS, Harness

from sparkpoint import protocol as p
from sparkpoint_server.storage import checkpoint_stats, queries

APP_1 = {"spark_application_id": "local-1700000000001", "spark_ui_url": "http://driver-1:4040"}
APP_2 = {"spark_application_id": "local-1700000000002", "spark_ui_url": None}  # its UI is off
NO_APP = {"ui-url": None, "application-id": None}


def _spark(h: Harness) -> dict[str, Any]:
    with h.sessions() as s:
        details = queries.job_details(s, h.job_id, h.clock.now_ms())
    # The application only: its executors are tested in tests/server/api/test_api_executors.py.
    return {k: v for k, v in details["spark"].items() if k != "executors"}


def _carried(entry: dict[str, Any]) -> tuple[int, int | None, str | None]:
    return entry["id"], entry["epoch"], entry["spark-job-group"]


def test_running_names_the_drivers_spark_application(harness: Harness) -> None:
    harness.register()
    assert _spark(harness) == NO_APP  # registered, Spark not up yet
    harness.running(1, **APP_1)
    assert _spark(harness) == {
        "ui-url": "http://driver-1:4040",
        "application-id": "local-1700000000001",
    }


def test_a_status_without_the_spark_fields_keeps_the_application(harness: Harness) -> None:
    harness.register()
    harness.running(1)  # a driver that does not name its application
    assert _spark(harness) == NO_APP
    harness.running(1, **APP_1)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.FINISHED, previous=p.JobStatus.RUNNING))
    assert _spark(harness) == {
        "ui-url": "http://driver-1:4040",
        "application-id": "local-1700000000001",
    }


def test_a_restarted_driver_names_its_new_application(harness: Harness) -> None:
    harness.register()
    harness.running(1, **APP_1)
    harness.register(incarnation="driver-2")  # the driver process was restarted
    assert _spark(harness) == NO_APP  # the old application is gone, the new one not yet up
    harness.running(2, **APP_2)
    harness.running(1, **APP_1)  # a late event of the old driver's attempt: refused
    assert _spark(harness) == {"ui-url": None, "application-id": "local-1700000000002"}


def test_a_checkpoint_names_the_epoch_whose_sources_injected_its_barrier(
    harness: Harness,
) -> None:
    harness.start()
    cid = harness.trigger_periodic()
    with harness.sessions() as s:
        pending = checkpoint_stats.checkpoint_statistics(s, harness.job_id, 10)
    assert _carried(pending["history"][0]) == (cid, None, None)  # no barrier injected yet
    # One accepted epoch's events come together: the barriers, then the acknowledgements.
    acks = [harness.ack(1, cid, op, i) for op, n in TASKS.items() for i in range(n)]
    harness.send(1, *harness.barriers(cid, epoch=7), *acks)
    with harness.sessions() as s:
        stats = checkpoint_stats.checkpoint_statistics(s, harness.job_id, 10)
        details = checkpoint_stats.checkpoint_details(s, harness.job_id, cid)
    expected = (cid, 7, "sparkpoint-pv-a1-e7")
    assert stats["history"][0]["status"] == "COMPLETED"
    assert _carried(stats["history"][0]) == expected
    assert _carried(stats["latest"]["completed"]) == expected
    assert _carried(details) == expected
