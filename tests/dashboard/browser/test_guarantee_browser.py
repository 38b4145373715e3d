"""The job header's end-to-end guarantee in headless Chromium against a real control plane.

The jobs register as a driver does (the ``job_registered`` that :func:`registration` builds
from a real job graph, signed and sent through Redis); no Spark runs: the header shows what
the registration said.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sparkpoint import protocol as p
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.connectors.wal_sink import JsonLinesWriteAheadSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime.authority import registration
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.transport import RedisEventSink, Streams, redis_client
from sparkpoint_dashboard import ids
from sparkpoint_dashboard.routing import job_path
from sparkpoint_dashboard.theme import AMBER, GREY
from tests.e2e.control_plane import REDIS_URL, ServerProcess
from tests.support.waiting import wait_for

from .dashboard_page import DashboardPage

pytestmark = [pytest.mark.browser]

BADGE = f"#{ids.JOB_GUARANTEE} .badge"
REASON = f"#{ids.JOB_GUARANTEE} .guarantee-reason"


def send(server: ServerProcess, job_id: str, event: p.JobRegistered) -> None:
    sink = RedisEventSink(
        redis_client(REDIS_URL), Streams(prefix=server.prefix), signer=server.signer()
    )
    sink.publish([p.envelope(job_id, 0, 0, event)])


def wal_job_registration(workdir: Path, job_id: str) -> p.JobRegistered:
    """What the driver of events -> count -> write-ahead-log sink ``audit`` registers."""
    options = JobOptions(
        job_id=job_id,
        checkpoint_dir=f"file://{workdir / 'chk-guarantee'}",
        local_dir=str(workdir / "local-guarantee"),
    )
    env = StreamExecutionEnvironment(options)
    events = env.from_source(GeneratorSource(events=100), uid="events")
    sink = JsonLinesWriteAheadSink(str(workdir / "audit.jsonl"))
    events.key_by("app_id").count(uid="pv", output="pv").sink_to(sink, uid="audit")
    driver = JobDriver(env.graph, options)
    return registration(driver.job, driver.restart, incarnation="driver-1")


def badge(page: DashboardPage) -> tuple[str, str, str] | None:
    """The guarantee badge's text, background colour and tooltip, read at one instant (the
    header re-renders at every refresh)."""
    found = page.driver.execute_script(
        "const b = document.querySelector(arguments[0]);"
        "return b && [b.textContent, getComputedStyle(b).backgroundColor, b.title];",
        BADGE,
    )
    return tuple(found) if found else None


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def test_a_job_with_a_write_ahead_log_sink_shows_at_least_once_and_why(
    page: DashboardPage, server: ServerProcess, api: httpx.Client, workdir: Path
) -> None:
    event = wal_job_registration(workdir, "wal-job")
    assert event.guarantee is not None and event.guarantee.reason is not None
    send(server, "wal-job", event)
    wait_for("the job to be registered", lambda: api.get("/jobs/wal-job").status_code == 200)

    page.open(job_path("wal-job"), ids.JOB_GUARANTEE)
    shown = page.wait("the guarantee badge", lambda: badge(page))

    assert shown == (
        "AT-LEAST-ONCE",
        rgb(AMBER),
        f"end-to-end guarantee: {event.guarantee.reason}",
    )
    assert page.texts(REASON) == [event.guarantee.reason]
    assert page.texts(REASON)[0].startswith("sink 'audit' writes a completed checkpoint's")
    page.screenshot("job-guarantee-at-least-once")
    assert page.errors() == []


def test_a_job_whose_driver_reported_none_shows_an_unknown_guarantee(
    page: DashboardPage, server: ServerProcess, api: httpx.Client
) -> None:
    vertex = p.VertexModel(id="source", name="source", parallelism=1, operators=["source"])
    send(server, "old-job", p.JobRegistered(job_name="old", vertices=[vertex], edges=[], config={}))
    wait_for("the job to be registered", lambda: api.get("/jobs/old-job").status_code == 200)

    page.open(job_path("old-job"), ids.JOB_GUARANTEE)
    shown = page.wait("the guarantee badge", lambda: badge(page))

    assert shown[:2] == ("GUARANTEE UNKNOWN", rgb(GREY))
    assert "did not report" in page.texts(REASON)[0]
    assert page.errors() == []
