"""The dashboard in headless Chromium against a real control plane and a real PV job: what
the pages show.

One job serves every test, in this order: the pages show what the API says (jobs, a job's
name shown as text even when it is markdown, overview, checkpoints, one checkpoint's
timeline). The browser console stays free of errors, and each page is saved to
``docs/screenshots/``. The very last test stops the control plane: the banner says so, the
page keeps its data. The actions (savepoint, restart strategy, restore) are in
``test_dashboard_actions_browser.py``.
"""

from __future__ import annotations

import re
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkpoint import protocol as p
from sparkpoint.transport import RedisEventSink, Streams, redis_client
from sparkpoint_dashboard import ids
from tests.e2e.control_plane import REDIS_URL, ServerProcess

from .conftest import Job
from .dashboard_page import DashboardPage
from .job_checks import assert_screenshot, checkpoints_answer, job_path, running_badge

pytestmark = [pytest.mark.browser, pytest.mark.spark]


# ----------------------------------------------------------------------------- helpers


def completed_ids(answer: dict[str, Any]) -> set[int]:
    return {h["id"] for h in answer["history"] if h["status"] == "COMPLETED"}


def completed_count_shown(page: DashboardPage) -> int | None:
    """The number on the "Completed" card of the checkpoints page."""
    value = page.driver.execute_script(
        "for (const card of document.querySelectorAll(arguments[0])) {"
        "  const label = card.querySelector('.stat-label');"
        "  if (label && label.innerText.trim().toLowerCase() === 'completed') {"
        "    return card.querySelector('.stat-value').innerText.trim(); } }"
        "return null;",
        f"#{ids.CP_COUNTS} .stat",
    )
    digits = (value or "").replace(",", "")
    return int(digits) if digits.isdigit() else None


def has_data(page: DashboardPage, element_id: str) -> bool:
    """Whether the grid or graph ``element_id`` shows rows or a drawn figure."""
    return bool(page.grid_rows(element_id) or page.figure(element_id))


# ----------------------------------------------------------------------------- the pages


def test_jobs_page_lists_the_running_job(page: DashboardPage, job: Job) -> None:
    page.open("/", ids.JOBS_GRID)

    def row() -> dict[str, Any] | None:
        rows = [r for r in page.grid_rows(ids.JOBS_GRID) if r["_links"].get("job") == job_path(job)]
        return rows[0] if rows and rows[0].get("status") == "RUNNING" else None

    shown = page.wait("the job's row, RUNNING", row)
    assert shown["job"].startswith("pv-count")
    assert shown["attempt"] == "1"
    last = re.fullmatch(r"#(\d+) (COMPLETED|IN_PROGRESS)", shown["last_checkpoint"])
    assert last, shown
    assert shown["_links"]["last_checkpoint"] == f"{job_path(job)}/checkpoints/{last[1]}"
    assert_screenshot(page.screenshot("jobs"))


HOSTILE_NAME = "x\\](http://evil.example/phish) \\[ <http://evil.example/auto>"


def _register_hostile_job(server: ServerProcess, workdir: Path) -> str:
    """A job whose name is markdown and an autolink, registered through the events stream as
    any driver would (its configuration is refused: it is FAILED at once, and listed)."""
    job_id = f"hostile-{uuid.uuid4().hex[:8]}"
    payload = p.JobRegistered(
        job_name=HOSTILE_NAME,
        vertices=[p.VertexModel(id="src", name="src", parallelism=1, operators=["src"])],
        edges=[],
        config={"checkpoint_dir": str(workdir / "hostile")},
    )
    client = redis_client(REDIS_URL)
    try:
        RedisEventSink(client, Streams(server.prefix), signer=server.signer()).publish(
            [p.envelope(job_id, 0, int(time.time() * 1000), payload)]
        )
    finally:
        client.close()
    return job_id


def test_a_job_name_is_shown_as_text_never_as_a_link(
    page: DashboardPage, job: Job, server: ServerProcess, workdir: Path
) -> None:
    hostile = _register_hostile_job(server, workdir)
    page.open("/", ids.JOBS_GRID)

    def row() -> dict[str, Any] | None:
        rows = page.grid_rows(ids.JOBS_GRID)
        return next((r for r in rows if r["_links"].get("job") == f"/jobs/{hostile}"), None)

    shown = page.wait("the hostile job's row", row)
    assert shown["job"] == f"{HOSTILE_NAME} · {hostile[:8]}…"
    hrefs = page.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(a => a.getAttribute('href'))",
        f"#{ids.JOBS_GRID} a",
    )
    assert hrefs and all(h.startswith("/jobs/") for h in hrefs), hrefs
    assert "evil.example" not in " ".join(hrefs)


def test_overview_shows_the_job_running(page: DashboardPage, job: Job, api: httpx.Client) -> None:
    page.open(job_path(job), ids.JOB_STATUS_BADGE, ids.JOB_THROUGHPUT_CHART)
    badge = page.wait("the RUNNING badge", lambda: page.texts(running_badge()))
    assert badge == ["RUNNING · attempt 1"]
    assert page.text(ids.JOB_TITLE) == f"pv-count ({job.id})"
    # The throughput chart draws the job's heartbeats (records/s on the y axis).
    figure = page.wait(
        "the throughput chart's points",
        lambda: (
            (f := page.figure(ids.JOB_THROUGHPUT_CHART))
            and any(len(t["x"]) >= 2 for t in f["traces"])
            and f
        ),
    )
    assert figure["traces"]
    assert api.get(f"/jobs/{job.id}").json()["state"] == "RUNNING"
    assert_screenshot(page.screenshot("job"))


def test_checkpoints_page_shows_the_completed_checkpoints(
    page: DashboardPage, job: Job, api: httpx.Client
) -> None:
    page.open(f"{job_path(job)}/checkpoints", ids.CP_HISTORY_GRID, ids.CP_COUNTS)
    recent: list[dict[str, Any]] = []  # the API's answers of the last seconds (refresh lag)

    def api_now() -> list[dict[str, Any]]:
        recent.append(checkpoints_answer(api, job))
        del recent[:-4]
        return recent

    def shown_rows() -> list[dict[str, Any]]:
        """The rendered rows (newest first), with the checkpoint id their link shows."""
        rows = page.grid_rows(ids.CP_HISTORY_GRID)
        for row in rows:
            row["id"] = int(row["link"].lstrip("#")) if row.get("link", "").startswith("#") else 0
        return rows

    def rows_match_the_api() -> bool:
        answers, rows = api_now(), shown_rows()
        if not rows:
            return False
        shown = {r["id"] for r in rows}
        completed = {r["id"] for r in rows if r.get("status") == "COMPLETED"}
        # The grid renders the rows in view: compare the ids between its first and last.
        return any(
            completed == {i for i in completed_ids(a) if min(shown) <= i <= max(shown)}
            for a in answers
        )

    page.wait("the history grid to show the API's completed checkpoints", rows_match_the_api)
    rows = shown_rows()
    completed = [r for r in rows if r["status"] == "COMPLETED"]
    assert len(completed) >= 2
    for row in completed:
        assert row["_links"]["link"] == f"{job_path(job)}/checkpoints/{row['id']}"
        assert row["acknowledged"] == "4/4"
        assert row["attempt"] == "1"
    assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)  # newest first

    def data_matches_the_api() -> bool:
        """Every row (rendered or not): the completed ones are the API's."""
        answers, data = api_now(), page.grid_data(ids.CP_HISTORY_GRID)
        oldest = min((int(d["id"]) for d in data), default=0)
        completed = {int(d["id"]) for d in data if d["status"] == "COMPLETED"}
        return bool(data) and any(
            completed == {i for i in completed_ids(a) if i >= oldest} for a in answers
        )

    page.wait(
        "the history grid's data to hold the API's completed checkpoints", data_matches_the_api
    )
    page.wait(
        "the Completed card to show the API's count",
        lambda: completed_count_shown(page) in {a["counts"]["completed"] for a in api_now()},
    )
    page.wait(
        "the history chart's points",
        lambda: (f := page.figure(ids.CP_HISTORY_CHART)) and any(t["x"] for t in f["traces"]),
    )
    assert_screenshot(page.screenshot("checkpoints"))


def test_checkpoint_timeline_shows_every_subtask(
    page: DashboardPage, job: Job, api: httpx.Client
) -> None:
    answer = checkpoints_answer(api, job)
    checkpoint_id = answer["latest"]["completed"]["id"]
    details = api.get(f"/jobs/{job.id}/checkpoints/details/{checkpoint_id}").json()
    expected: set[tuple[str, int]] = set()
    names: dict[str, str] = {}
    for operator_id, task in details["tasks"].items():
        names[operator_id] = task["name"]
        sub = api.get(
            f"/jobs/{job.id}/checkpoints/details/{checkpoint_id}/subtasks/{operator_id}"
        ).json()
        expected |= {(operator_id, s["index"]) for s in sub["subtasks"]}
    assert len(expected) == details["num_subtasks"] == 4

    page.open(f"{job_path(job)}/checkpoints/{checkpoint_id}", ids.CK_TIMELINE)
    figure = page.wait(
        "the timeline to draw",
        lambda: (f := page.figure(ids.CK_TIMELINE)) and any(t["y"] for t in f["traces"]) and f,
    )
    categories = {str(y) for t in figure["traces"] for y in t["y"]}
    assert len(categories) == len(expected), categories
    assert categories == {timeline_label(names[op], op, i) for op, i in expected}
    assert_screenshot(page.screenshot("checkpoint"))
    page.driver.execute_script(
        "document.getElementById(arguments[0]).scrollIntoView({block: 'center'})", ids.CK_TIMELINE
    )
    assert_screenshot(page.screenshot("checkpoint-timeline"))


def timeline_label(name: str, operator_id: str, index: int) -> str:
    """The timeline's y category of one subtask."""
    return f"{name} #{index}"


# ----------------------------------------------------------------------------- the console


def test_no_page_logs_an_error_to_the_console(page: DashboardPage, job: Job) -> None:
    """Every page once more (with its data), then no error in everything the console logged
    during the module: no SEVERE entry, no AG Grid warning."""
    checkpoint_id = None
    for path, ready in (
        ("/", ids.JOBS_GRID),
        (job_path(job), ids.JOB_THROUGHPUT_CHART),
        (f"{job_path(job)}/checkpoints", ids.CP_HISTORY_GRID),
    ):
        page.open(path, ready)
        page.wait(f"data on {path}", partial(has_data, page, ready))
        if path.endswith("/checkpoints"):
            checkpoint_id = page.grid_rows(ids.CP_HISTORY_GRID)[-1]["link"].lstrip("#")
    page.open(f"{job_path(job)}/checkpoints/{checkpoint_id}", ids.CK_TIMELINE)
    page.wait("the timeline", lambda: page.figure(ids.CK_TIMELINE))
    errors = page.errors()
    assert errors == [], "\n".join(f"{e.page}: {e.level} {e.message}" for e in errors)


# ----------------------------------------------------------------------------- the banner


def test_an_unreachable_control_plane_shows_a_banner_and_the_page_keeps_its_data(
    page: DashboardPage, job: Job, server: ServerProcess
) -> None:
    """Last (it stops the control plane): the banner names the problem, the rows stay, and
    both recover when the control plane is back."""
    page.open(f"{job_path(job)}/checkpoints", ids.CP_HISTORY_GRID)
    rows = page.wait("history rows", lambda: page.grid_rows(ids.CP_HISTORY_GRID))
    assert page.text(ids.BANNER) == ""

    server.kill()
    banner = page.wait(
        "the banner", lambda: "not reachable" in page.text(ids.BANNER) and page.text(ids.BANNER)
    )
    assert server.url in banner
    # What it had, not a blank page: the rows of before (a refresh in flight when the server
    # died may have added the next checkpoint), unchanged while the control plane stays away.
    kept = page.grid_rows(ids.CP_HISTORY_GRID)
    assert len(kept) >= len(rows)
    assert int(kept[0]["_row_id"]) >= int(rows[0]["_row_id"])
    time.sleep(3)  # three refresh intervals, each failing
    assert page.grid_rows(ids.CP_HISTORY_GRID) == kept
    page.screenshot("unreachable")

    server.start()
    page.wait("the banner to go", lambda: page.text(ids.BANNER) == "", timeout_s=60)
