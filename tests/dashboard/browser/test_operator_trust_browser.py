"""What an operator reads at 3 a.m., in headless Chromium against a real control plane: an ended
job's disabled actions, restores among the failures, chart labels and legends that do not
collide, the per-subtask timeline at 1440x900, the savepoints page, and a restore choice that
survives a change of the retained set.

No Spark runs: the jobs' history (statuses, checkpoints, a savepoint, restores, heartbeats) is
written into the control plane's own database, as its ingest would have written it, and the
dashboard reads it through the REST API. Screenshots go to ``docs/screenshots/``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.routing import checkpoint_path, job_path, jobs_path, savepoints_path
from sparkpoint_dashboard.units import DASH
from sparkpoint_server.storage.models import Checkpoint
from tests.e2e.control_plane import ServerProcess
from tests.server.api.builders import (
    add_checkpoint,
    add_exception,
    add_heartbeat,
    add_job,
    add_operation,
    add_status,
    add_subtask,
)
from tests.support.waiting import wait_for

from .dashboard_page import WIDTH, DashboardPage

pytestmark = [pytest.mark.browser]

ENDED, STEERED = "ended-job", "steered-job"
NOW = int(time.time() * 1000)
T = NOW - 600_000  # the jobs started ten minutes ago
SAVEPOINT = "file:///var/sparkpoint/savepoints/savepoint-endedjob-4-a-long-directory-name"
EPOCHS = 60
EXPIRED = 6
EXPIRED_MESSAGE = (
    f"checkpoint {EXPIRED} of job {ENDED} expired before completing after 2000 ms: 0/5 "
    "subtasks acknowledged; missing: count[0], count[1], count[2], source[0], source[1]. No "
    "epoch ended between the trigger and the expiry: the last to end, epoch 27, ended 2000 ms "
    "before the trigger and 4000 ms before the expiry; a barrier travels with an epoch"
)


@pytest.fixture(scope="module")
def sessions(server: ServerProcess) -> Iterator[sessionmaker[Session]]:
    engine = create_engine(f"sqlite:///{server.data_dir / 'sparkpoint.db'}")
    yield sessionmaker(engine)
    engine.dispose()


def checkpoint(s: Session, job_id: str, n: int, at: int, **overrides: Any) -> None:
    values: dict[str, Any] = {
        "trigger_timestamp": at,
        "latest_ack_timestamp": at + 40,
        "completion_timestamp": at + 50,
        "external_path": f"file:///var/sparkpoint/chk/{job_id}/chk-{n}",
    }
    add_checkpoint(s, n, job_id, **{**values, **overrides})
    for operator, parallelism in (("source", 2), ("count", 3)):
        for i in range(parallelism):
            add_subtask(
                s,
                n,
                operator,
                i,
                job_id,
                barrier_timestamp=at + 5 + i,
                ack_timestamp=at + 30 + 3 * i,
            )


@pytest.fixture(scope="module")
def history(sessions: sessionmaker[Session], api: httpx.Client) -> None:
    """``ended-job``: ran, failed once, restarted, was restored from savepoint 4 on request,
    a second restore restarted it again, then FINISHED. ``steered-job``: RUNNING with
    checkpoints 1-2 retained."""
    restore_at, failure_at, second_at = T + 200_000, T + 100_000, T + 300_000
    with sessions() as s:
        add_job(s, ENDED, status="FINISHED", attempt=4, restarts=3, start_time=T, end_time=NOW)
        add_job(s, STEERED, start_time=T, created_at=T, updated_at=T)
        s.flush()
        for job_id, statuses in (
            (
                ENDED,
                [
                    (T, "CREATED", None, 1),
                    (T + 1000, "RUNNING", None, 1),
                    (failure_at, "RESTARTING", "TaskFailed: boom", 1),
                    (failure_at + 1500, "RUNNING", None, 2),
                    (restore_at + 100, "RESTARTING", "restore of savepoint 4 requested", 2),
                    (restore_at + 900, "RUNNING", None, 3),
                    (second_at + 100, "RESTARTING", "restore of checkpoint 5 requested", 3),
                    (second_at + 900, "RUNNING", None, 4),
                    (NOW - 1000, "FINISHED", "end of input", 4),
                ],
            ),
            (STEERED, [(T, "CREATED", None, 1), (T + 1000, "RUNNING", None, 1)]),
        ):
            for at, status, cause, attempt in statuses:
                add_status(s, status, at, job_id, cause=cause, attempt=attempt)
        add_exception(s, failure_at - 900, ENDED, cause="TaskFailed: boom", action="restart in 1 s")
        for epoch in range(1, EPOCHS + 1):
            at = T + epoch * 9_000
            attempt = 1 if at < failure_at else 2 if at < restore_at else 3 if at < second_at else 4
            add_heartbeat(s, attempt, epoch, ENDED, timestamp=at, records=1234, source_lag=77)
        for n in (1, 2, 3, 5):
            checkpoint(s, ENDED, n, T + n * 40_000)
        checkpoint(s, ENDED, 4, T + 160_000, kind="savepoint", external_path=SAVEPOINT)
        add_checkpoint(  # expired: nothing acknowledged in its 2 s, an epoch ran past them
            s,
            EXPIRED,
            ENDED,
            status="FAILED",
            attempt=3,
            trigger_timestamp=T + 245_000,
            completion_timestamp=T + 247_000,
            failure_reason="CHECKPOINT_EXPIRED",
            failure_message=EXPIRED_MESSAGE,
            discarded=True,
        )
        for n, rid, at, attempt in ((4, "req-sp4", restore_at, 3), (5, "req-cp5", second_at, 4)):
            add_operation(
                s,
                rid,
                "restore",
                ENDED,
                status="COMPLETED",
                checkpoint_id=n,
                attempt=attempt,
                location=SAVEPOINT if n == 4 else f"file:///var/sparkpoint/chk/{ENDED}/chk-5",
                created_at=at,
                updated_at=at + 900,
            )
        for n in (1, 2):
            checkpoint(s, STEERED, n, NOW - 60_000 + n * 1000)
        s.commit()
    wait_for("the jobs through the API", lambda: api.get(f"/jobs/{ENDED}").status_code == 200)


def disabled(page: DashboardPage, element_id: str) -> bool:
    return not page.by_id(element_id).is_enabled()


def rect(page: DashboardPage, selector: str) -> dict[str, float] | None:
    found = page.driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "if (!e) { return null; } const r = e.getBoundingClientRect();"
        "return {left: r.left, right: r.right, top: r.top, bottom: r.bottom};",
        selector,
    )
    return dict(found) if found else None


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return not (
        a["right"] <= b["left"]
        or b["right"] <= a["left"]
        or a["bottom"] <= b["top"]
        or b["bottom"] <= a["top"]
    )


def annotation_rects(page: DashboardPage, graph_id: str) -> list[dict[str, float]]:
    found = page.driver.execute_script(
        "return [...document.querySelectorAll('#' + arguments[0] + ' g.annotation')]"
        ".map(e => { const r = e.getBoundingClientRect();"
        " return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; })",
        graph_id,
    )
    return [dict(r) for r in found or []]


def test_an_ended_job_disables_its_actions_and_forms_and_says_why(
    page: DashboardPage, history: None
) -> None:
    page.open(job_path(ENDED), ids.ACT_ENDED_NOTE, ids.CFG_ENDED_NOTE)
    note = page.wait("the reason", lambda: page.text(ids.ACT_ENDED_NOTE))

    assert note.startswith("The job is FINISHED: it no longer runs")
    assert page.text(ids.CFG_ENDED_NOTE) == note
    controls = [
        ids.ACT_CHECKPOINT,
        ids.ACT_SAVEPOINT,
        ids.ACT_STOP,
        ids.ACT_CANCEL,
        ids.ACT_RESTORE,
        ids.ACT_SAVEPOINT_DIR,
        ids.CFG_INTERVAL,
        ids.CFG_APPLY,
        ids.RS_APPLY,
    ]
    page.wait("every control disabled", lambda: all(disabled(page, c) for c in controls))
    looks = page.driver.execute_script(
        "return [arguments[0], arguments[1]].map(i => getComputedStyle("
        "document.getElementById(i)).cursor)",
        ids.ACT_CHECKPOINT,
        ids.ACT_CANCEL,
    )
    assert looks == ["not-allowed", "not-allowed"]  # they look disabled too
    radios = page.by_id(ids.RS_TYPE).find_elements(By.CSS_SELECTOR, "input")
    assert radios and not any(r.is_enabled() for r in radios)
    page.screenshot("job-ended-actions-disabled")
    assert page.errors() == []


def test_failures_and_restarts_list_requested_restores_as_restores(
    page: DashboardPage, history: None
) -> None:
    page.open(job_path(ENDED), ids.JOB_EXCEPTIONS_GRID, ids.JOB_CARDS)
    rows = page.wait(
        "three rows", lambda: (r := page.grid_data(ids.JOB_EXCEPTIONS_GRID)) and len(r) >= 3 and r
    )

    assert [r["kind"] for r in rows] == [
        "RESTORE (requested)",
        "RESTORE (requested)",
        "TASK_FAILURE",
    ]
    assert rows[1]["cause"].startswith(f"restore of savepoint 4 at {SAVEPOINT} requested")
    assert rows[1]["decision"] == "restored: the job runs again as attempt 3"
    assert not any("JOB_FAILOVER_REGION" in str(r) for r in rows)
    cards = dict(
        zip(  # the labels' text as shown (CSS writes them in capitals)
            page.texts(f"#{ids.JOB_CARDS} .stat-label"),
            page.texts(f"#{ids.JOB_CARDS} .stat-value"),
            strict=True,
        )
    )
    cards = {label.lower(): value for label, value in cards.items()}
    assert cards["restarts"] == "3"
    assert cards["records"] == f"{1234 * EPOCHS:,} records"  # the job's summary's number
    assert cards["source lag"] == DASH
    assert "not read yet" not in page.text(ids.JOB_CARDS)
    assert "the job is FINISHED" in page.text(ids.JOB_CARDS)
    page.driver.execute_script(
        "document.getElementById(arguments[0]).scrollIntoView()", ids.JOB_EXCEPTIONS_GRID
    )
    page.screenshot("job-failures-and-restores")
    assert page.errors() == []


def test_restart_labels_do_not_overlap_and_the_toolbar_leaves_the_legend_free(
    page: DashboardPage, history: None
) -> None:
    page.open(job_path(ENDED), ids.JOB_THROUGHPUT_CHART)
    graph = ids.JOB_THROUGHPUT_CHART
    labels = page.wait(
        "three restart labels", lambda: len(r := annotation_rects(page, graph)) == 3 and r
    )
    texts = page.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)",
        f"#{graph} g.annotation",
    )

    assert sorted(texts) == ["restart → attempt 2", "restore → attempt 3", "restore → attempt 4"]
    assert not any(overlap(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :])
    for chart in (ids.JOB_THROUGHPUT_CHART, ids.JOB_STATUS_CHART):
        ActionChains(page.driver).move_to_element(page.by_id(chart)).perform()  # shows the bar
        bar = page.wait("the toolbar", partial(rect, page, f"#{chart} .modebar"))
        legend = page.wait("the legend", partial(rect, page, f"#{chart} .legend"))
        assert not overlap(bar, legend), (chart, bar, legend)
    page.screenshot("job-restart-labels-and-legends")
    assert page.errors() == []


def test_the_per_subtask_timeline_is_in_view_at_1440x900(
    page: DashboardPage, history: None
) -> None:
    page.driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )
    try:
        page.open(checkpoint_path(ENDED, 3), ids.CK_TIMELINE)
        page.wait(
            "the timeline drawn",
            lambda: (f := page.figure(ids.CK_TIMELINE)) and len(f["y_categories"]) == 5,
        )
        box = rect(page, f"#{ids.CK_TIMELINE} .main-svg")
        assert box is not None
        page.screenshot("checkpoint-timeline-1440x900")
        assert page.driver.execute_script("return window.scrollY") == 0
        assert box["top"] >= 0 and box["bottom"] <= 900, box
    finally:
        page.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
        )
    assert page.errors() == []


def test_an_expired_checkpoint_shows_its_timeout_on_the_timeline_and_why_it_expired(
    page: DashboardPage, history: None
) -> None:
    page.open(checkpoint_path(ENDED, EXPIRED), ids.CK_TIMELINE, ids.CK_SUMMARY)
    figure = page.wait(
        "the timeline drawn",
        lambda: (f := page.figure(ids.CK_TIMELINE)) and len(f["y_categories"]) == 5 and f,
    )
    [hatched] = [t for t in figure["traces"] if t["name"] == "not acknowledged"]
    assert hatched["x"] == [2000] * 5  # to the expiry, not a 1 ms axis
    assert "No epoch ended between the trigger and the expiry" in page.text(ids.CK_FAILURE)
    assert "2.00 s" in page.text(ids.CK_SUMMARY) and "trigger to failure" in page.text(
        ids.CK_SUMMARY
    )
    page.wait(
        "the Spark line",
        lambda: "before it failed" in page.text(ids.CK_SPARK_LINK),
    )
    page.screenshot("checkpoint-expired")
    assert page.errors() == []


def test_the_savepoints_page_lists_where_how_large_whose_when_and_its_restores(
    page: DashboardPage, history: None
) -> None:
    page.open(savepoints_path(), ids.SP_GRID)
    rows = page.wait("the savepoint", lambda: page.grid_rows(ids.SP_GRID))

    assert len(rows) == 1
    row = rows[0]
    assert row["job"] == ENDED and row["_links"]["job"] == job_path(ENDED)
    assert row["savepoint"] == "#4" and row["_links"]["savepoint"] == checkpoint_path(ENDED, 4)
    assert row["size"] == "1000 B"
    assert row["restored"] == "1"
    assert "restored as attempt 3 (request req-sp4)" in row["restores"]
    # The location is cut in its cell; hovering shows all of it.
    cell = page.driver.find_element(
        By.CSS_SELECTOR, f"#{ids.SP_GRID} .ag-row .ag-cell[col-id=location]"
    )
    ActionChains(page.driver).move_to_element(cell).perform()
    tip = page.wait("the tooltip", lambda: page.texts(".ag-tooltip"))
    assert tip == [SAVEPOINT]
    page.screenshot("savepoints-page")
    assert page.errors() == []


def hover_shows(page: DashboardPage, grid_id: str, row_id: str, column: str, text: str) -> None:
    """Rest the mouse on one cell of a grid; its tooltip must come and say ``text``."""
    cell = page.driver.find_element(
        By.CSS_SELECTOR, f"#{grid_id} .ag-row[row-id='{row_id}'] .ag-cell[col-id={column}]"
    )
    ActionChains(page.driver).move_to_element(cell).perform()
    page.wait(f"the tooltip {text!r} on {column}", lambda: page.texts(".ag-tooltip") == [text])


def test_every_grid_cell_shows_its_whole_text_on_hover(page: DashboardPage, history: None) -> None:
    page.open(jobs_path(), ids.JOBS_GRID)
    rows = page.wait("the jobs", lambda: page.grid_rows(ids.JOBS_GRID))
    ended = next(r for r in rows if r["_links"].get("job") == job_path(ENDED))
    # Columns without a tooltip of their own: a link, and a formatted value.
    for column in ("job", "last_checkpoint", "uptime"):
        hover_shows(page, ids.JOBS_GRID, ended["_row_id"], column, ended[column])
    assert page.errors() == []


def test_the_restore_choice_survives_a_new_checkpoint_and_is_marked_gone_when_subsumed(
    page: DashboardPage, history: None, sessions: sessionmaker[Session]
) -> None:
    page.open(job_path(STEERED), ids.ACT_RESTORE_SELECT)
    page.wait(
        "two choices",
        lambda: page.options(ids.ACT_RESTORE_SELECT) == ["checkpoint:2", "checkpoint:1"],
    )
    page.choose(ids.ACT_RESTORE_SELECT, "checkpoint:1")
    chosen = page.chosen_label(ids.ACT_RESTORE_SELECT)
    assert chosen.startswith("#1 checkpoint")

    with sessions() as s:  # a new checkpoint completes: the retained set changes
        checkpoint(s, STEERED, 3, NOW)
        s.commit()
    page.wait(
        "the new choice",
        lambda: page.options(ids.ACT_RESTORE_SELECT)[:1] == ["checkpoint:3"],
    )
    # The options and the value come from one callback: the new options carry the value.
    assert page.chosen_label(ids.ACT_RESTORE_SELECT) == chosen
    page.screenshot("restore-choice-kept")

    with sessions() as s:  # checkpoint 1 is subsumed and discarded
        s.execute(
            update(Checkpoint)
            .where(Checkpoint.job_id == STEERED, Checkpoint.checkpoint_id == 1)
            .values(discarded=True)
        )
        s.commit()
    note = page.wait("the note", lambda: page.text(ids.ACT_RESTORE_NOTE))
    assert note.startswith("checkpoint 1 is no longer retained")
    # Still shown, marked gone, not silently cleared; clearing it clears the note.
    assert page.chosen_label(ids.ACT_RESTORE_SELECT) == "#1 checkpoint · no longer retained"
    page.screenshot("restore-choice-gone")
    page.by_id(ids.ACT_RESTORE_SELECT).find_element(By.CSS_SELECTOR, ".dash-dropdown-clear").click()
    page.wait("the note to go", lambda: page.text(ids.ACT_RESTORE_NOTE) == "")
    assert page.chosen_label(ids.ACT_RESTORE_SELECT) == "checkpoint or savepoint to restore"
    assert page.errors() == []
