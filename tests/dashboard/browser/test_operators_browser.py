"""The Operators tab (per-operator checkpoint timelines) in headless Chromium against a real
control plane and a real dashboard process.

The checkpoint statistics are written into the control plane's database before the page is
opened (as the ingest writes them: a job, its checkpoints, its subtasks' acknowledgements), so
that one operator is known to hold checkpoints 18 to 24 up; no Spark runs, which keeps the
module well under a minute. The API and the dashboard read them as they read a real job's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.routing import checkpoint_path, operators_path
from sparkpoint_server.config import normalize_database_url
from sparkpoint_server.storage.db import create_db_engine, session_factory
from tests.e2e.control_plane import ServerProcess
from tests.server.api.builders import add_checkpoint, add_job, add_subtask
from tests.support.waiting import wait_for

from .dashboard_page import DashboardPage

pytestmark = [pytest.mark.browser]

JOB = "operators-job"
CHECKPOINTS = 30
SLOW = range(18, 25)  # the checkpoints the window operator holds up (its subtask 3)
FAILED, IN_PROGRESS = 12, 30
GRAPH = {
    "vertices": [
        {"id": "source", "name": "events -> parse", "parallelism": 2, "operators": ["a"]},
        {"id": "window", "name": "pv per minute", "parallelism": 4, "operators": ["b"]},
        {"id": "sink", "name": "upsert pv", "parallelism": 1, "operators": ["c"]},
    ],
    "edges": [["source", "window"], ["window", "sink"]],
}


def window_ms(cid: int, subtask: int) -> float:
    """The window operator's subtasks: 40-46 ms, but subtask 3 takes 400+ ms in :data:`SLOW`."""
    return 400.0 + 20 * (cid - SLOW[0]) if cid in SLOW and subtask == 3 else 40.0 + 2 * subtask


def seed(server: ServerProcess) -> int:
    """The job, its 30 checkpoints and their acknowledgements; the first trigger time."""
    url = os.environ.get("DATABASE_URL")
    url = normalize_database_url(url) if url else f"sqlite:///{server.data_dir / 'sparkpoint.db'}"
    engine = create_db_engine(url)
    t0 = int(time.time() * 1000) - 120_000
    try:
        with session_factory(engine)() as s:
            add_job(s, JOB, graph=GRAPH, status="FINISHED", start_time=t0, end_time=t0 + 60_000)
            s.flush()
            for cid in range(1, CHECKPOINTS + 1):
                trigger = t0 + 1000 * cid
                durations: dict[str, list[float]] = {
                    "source": [15.0, 18.0],
                    "window": [window_ms(cid, i) for i in range(4)],
                    "sink": [70.0],
                }
                if cid == FAILED:
                    del durations["sink"]  # declined before the sink saw the barrier
                if cid == IN_PROGRESS:
                    durations = {"source": durations["source"]}
                e2e = max(d for ds in durations.values() for d in ds)
                status = {FAILED: "FAILED", IN_PROGRESS: "IN_PROGRESS"}.get(cid, "COMPLETED")
                done = status == "COMPLETED"
                add_checkpoint(
                    s,
                    cid,
                    job_id=JOB,
                    status=status,
                    trigger_timestamp=trigger,
                    latest_ack_timestamp=trigger + int(e2e) if done else None,
                    end_to_end_duration=e2e if done else None,
                    num_subtasks=7,
                    failure_reason="CHECKPOINT_DECLINED" if cid == FAILED else None,
                )
                for operator, subtasks in durations.items():
                    for index, ms in enumerate(subtasks):
                        add_subtask(
                            s,
                            cid,
                            operator,
                            index,
                            job_id=JOB,
                            ack_timestamp=trigger + int(ms),
                            end_to_end_duration=ms,
                            sync_duration=ms / 10,
                            async_duration=ms / 2,
                            alignment_duration=ms / 5 if operator == "window" else 0.0,
                            start_delay=1.0,
                            barrier_timestamp=trigger + 1,
                        )
            s.commit()
    finally:
        engine.dispose()
    return t0


@pytest.fixture(scope="module")
def seeded(server: ServerProcess, api: httpx.Client) -> Iterator[int]:
    t0 = seed(server)
    path = f"/jobs/{JOB}/checkpoints/operators"
    wait_for("the API to serve the timelines", lambda: api.get(path).status_code == 200)
    yield t0


_HEAT_JS = """
const gd = document.querySelector('#' + CSS.escape(arguments[0]) + ' .js-plotly-plot');
if (!gd || !gd.data || !gd.data.length || gd.data[0].type !== 'heatmap') { return null; }
const t = gd.data[0];
return {x: Array.from(t.x), y: Array.from(t.y), z: t.z.map(r => Array.from(r)),
        customdata: t.customdata, colorbar: t.colorbar.title.text};
"""

# Where a heat strip cell is, relative to the centre of the plot's element (Selenium's offsets).
_CELL_JS = """
const gd = document.querySelector('#' + CSS.escape(arguments[0]) + ' .js-plotly-plot');
const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
const box = gd.getBoundingClientRect();
return [xa._offset + xa.d2p(arguments[1]) - box.width / 2,
        ya._offset + ya.d2p(arguments[2]) - box.height / 2];
"""


def heat(page: DashboardPage) -> dict[str, Any] | None:
    found = page.driver.execute_script(_HEAT_JS, ids.OT_HEAT_STRIP)
    return found if found else None


def hover_texts(page: DashboardPage) -> list[str]:
    """The text of each hover label Plotly shows (SVG: ``textContent``, lines run together)."""
    found = page.driver.execute_script(
        "return [...document.querySelectorAll('.hoverlayer .hovertext')].map(e => e.textContent)"
    )
    return [str(t) for t in found or []]


def hover_cell(page: DashboardPage, column: str, row: str) -> ActionChains:
    """Move the mouse onto the heat strip's cell; the chain, to click it next."""
    dx, dy = page.driver.execute_script(_CELL_JS, ids.OT_HEAT_STRIP, column, row)
    plot = page.driver.find_element(By.CSS_SELECTOR, f"#{ids.OT_HEAT_STRIP} .js-plotly-plot")
    chain = ActionChains(page.driver).move_to_element_with_offset(plot, int(dx), int(dy))
    chain.perform()
    return chain


def test_the_heat_strip_shows_which_operator_holds_checkpoints_up_and_opens_one(
    page: DashboardPage, seeded: int
) -> None:
    page.open(operators_path(JOB), ids.OT_HEAT_STRIP, ids.OT_METRICS_CHART)
    strip = page.wait("the heat strip", lambda: heat(page))

    assert strip["y"] == ["events -> parse", "pv per minute", "upsert pv"]
    assert strip["x"] == [f"#{n}" for n in range(1, CHECKPOINTS + 1)]
    assert strip["colorbar"] == "end-to-end (ms)"
    window, sink = strip["z"][1], strip["z"][2]
    assert [window[n - 1] for n in SLOW] == [400.0 + 20 * k for k in range(len(SLOW))]
    assert window[0] == 46.0 and sink[0] == 70.0
    assert sink[FAILED - 1] is None and sink[IN_PROGRESS - 1] is None  # no acknowledgement
    cell = strip["customdata"][1][20]  # pv per minute, checkpoint 21
    assert cell[11] == "#3 (460 ms)"  # its slowest subtask
    assert cell[-1] == checkpoint_path(JOB, 21)
    holdups = page.wait("the hold-up counts", lambda: page.text(ids.OT_HOLDUPS))
    assert holdups == (
        "Last to acknowledge: upsert pv in 21 of 30 checkpoints · pv per minute in 8 of 30 "
        "checkpoints · events -> parse in 1 of 30 checkpoints"
    )

    metrics = page.wait("the metrics chart", lambda: page.figure(ids.OT_METRICS_CHART))
    names = [t["name"] for t in metrics["traces"]]
    assert names == ["events -> parse", "pv per minute", "upsert pv"] * 4
    assert metrics["traces"][1]["y"][20] == 460.0  # end-to-end row, window, checkpoint 21

    hover_cell(page, "#21", "pv per minute")
    hover = page.wait("the cell's hover", lambda: hover_texts(page))
    assert "pv per minute · checkpoint #21 (COMPLETED)" in hover[0]
    assert "end-to-end 460 ms, 100% of the checkpoint's 460 ms" in hover[0]
    assert "slowest subtask #3 (460 ms)" in hover[0]
    page.screenshot("operators-heat-strip")

    hover_cell(page, "#21", "pv per minute").click().perform()
    page.wait(
        "the checkpoint's page",
        lambda: page.driver.current_url.endswith(checkpoint_path(JOB, 21)),
    )
    page.path = checkpoint_path(JOB, 21)
    page.wait("the per-subtask timeline", lambda: page.figure(ids.CK_TIMELINE))
    assert page.errors() == []


def test_colour_by_share_shows_each_operator_against_its_checkpoint(
    page: DashboardPage, seeded: int
) -> None:
    page.open(operators_path(JOB), ids.OT_COLOUR_BY)
    page.wait("the heat strip", lambda: heat(page))

    page.choose(ids.OT_COLOUR_BY, "share")
    strip = page.wait(
        "the heat strip by share",
        lambda: (h := heat(page)) and h["colorbar"] == "share of the checkpoint" and h,
    )

    window, sink = strip["z"][1], strip["z"][2]
    assert window[20] == 1.0 and sink[20] == pytest.approx(70 / 460)
    assert sink[0] == 1.0 and window[0] == pytest.approx(46 / 70)
    page.screenshot("operators-heat-strip-share")
    page.driver.execute_script(
        "document.getElementById(arguments[0]).scrollIntoView()", ids.OT_METRICS_CHART
    )
    page.screenshot("operators-metrics")
    assert page.errors() == []
