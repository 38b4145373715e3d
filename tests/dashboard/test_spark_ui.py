"""The Spark UI client: URLs, the jobs of a group, the caching of answers and of failures."""

from __future__ import annotations

from typing import Any

import httpx

from sparkpoint_dashboard.spark_ui import (
    SparkJob,
    SparkUi,
    job_page_url,
    jobs_api_url,
    jobs_of_group,
    settled,
)

UI = "http://192.0.2.2:4040/"
APP = "local-1795659702825"
JOBS = [
    {"jobId": 19, "jobGroup": "sparkpoint-pv-a1-e10", "status": "RUNNING"},
    {"jobId": 18, "jobGroup": "sparkpoint-pv-a1-e9", "status": "SUCCEEDED"},
    {"jobId": 17, "jobGroup": "sparkpoint-pv-a1-e9", "status": "FAILED"},
    {"jobId": 16, "status": "SUCCEEDED"},  # no group
]


def test_urls() -> None:
    assert jobs_api_url(UI, APP) == f"http://192.0.2.2:4040/api/v1/applications/{APP}/jobs"
    assert (
        jobs_api_url("http://h:4040", "app/1") == "http://h:4040/api/v1/applications/app%2F1/jobs"
    )
    assert job_page_url(UI, 18) == "http://192.0.2.2:4040/jobs/job/?id=18"


def test_jobs_of_a_group_oldest_first() -> None:
    assert jobs_of_group(JOBS, "sparkpoint-pv-a1-e9") == [
        SparkJob(17, "FAILED"),
        SparkJob(18, "SUCCEEDED"),
    ]
    assert jobs_of_group(JOBS, "sparkpoint-pv-a1-e10") == [SparkJob(19, "RUNNING")]
    assert jobs_of_group(JOBS, "sparkpoint-pv-a1-e1") == []


class _Fake:
    """A Spark UI answering ``answer`` (or raising it), counting calls, on a settable clock."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, float]] = []
        self.now = 100.0

    def get_json(self, url: str, timeout_s: float) -> Any:
        self.calls.append((url, timeout_s))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def ui(self) -> SparkUi:
        return SparkUi(
            allowed_hosts=["192.0.2.2"],
            timeout_s=0.8,
            ttl_s=5.0,
            unreachable_ttl_s=30.0,
            get_json=self.get_json,
            clock=lambda: self.now,
        )


def test_answers_are_reused_for_a_few_seconds() -> None:
    fake = _Fake(JOBS)
    ui = fake.ui()
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e10") == [SparkJob(19, "RUNNING")]
    assert fake.calls == [(jobs_api_url(UI, APP), 0.8)]
    fake.now += 4.9
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e10") == [SparkJob(19, "RUNNING")]
    assert len(fake.calls) == 1
    fake.now += 0.2
    fake.answer = [{**JOBS[0], "status": "SUCCEEDED"}]
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e10") == [SparkJob(19, "SUCCEEDED")]
    assert len(fake.calls) == 2


def test_the_jobs_of_a_finished_group_are_kept() -> None:
    fake = _Fake(JOBS)
    ui = fake.ui()
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e9") == [
        SparkJob(17, "FAILED"),
        SparkJob(18, "SUCCEEDED"),
    ]
    fake.now += 3600
    fake.answer = httpx.ConnectError("connection refused")  # the driver is gone
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e9") == [
        SparkJob(17, "FAILED"),
        SparkJob(18, "SUCCEEDED"),
    ]
    assert len(fake.calls) == 1


def test_an_unreachable_ui_is_none_and_not_asked_again_for_a_while() -> None:
    fake = _Fake(httpx.ConnectTimeout("timed out"))
    ui = fake.ui()
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e9") is None
    fake.now += 29.0
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e9") is None
    assert len(fake.calls) == 1
    fake.now += 2.0
    fake.answer = JOBS
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e9") == [
        SparkJob(17, "FAILED"),
        SparkJob(18, "SUCCEEDED"),
    ]
    assert len(fake.calls) == 2


def test_an_answer_that_is_not_a_job_list_counts_as_unreachable() -> None:
    assert _Fake({"message": "no such app"}).ui().group_jobs(UI, APP, "g") is None
    assert _Fake(ValueError("not JSON")).ui().group_jobs(UI, APP, "g") is None


def test_a_slow_ui_is_asked_again_soon() -> None:
    fake = _Fake(httpx.ReadTimeout("driver busy"))
    ui = fake.ui()
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e9") is None
    fake.now += 4.9
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e9") is None
    assert len(fake.calls) == 1
    fake.now += 0.2
    fake.answer = JOBS
    assert ui.group_jobs(UI, APP, "sparkpoint-pv-a1-e9") == [
        SparkJob(17, "FAILED"),
        SparkJob(18, "SUCCEEDED"),
    ]
    assert len(fake.calls) == 2


def test_settled_when_every_job_finished_or_none_is_left() -> None:
    assert settled([SparkJob(17, "FAILED"), SparkJob(18, "SUCCEEDED")])
    assert settled([])  # the UI forgot the group: it will not come back
    assert not settled([SparkJob(18, "SUCCEEDED"), SparkJob(19, "RUNNING")])
    assert not settled(None)  # not reachable: ask again later
