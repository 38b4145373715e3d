"""The dashboard in headless Chromium against a real control plane and a real PV job.

One job serves every test, in this order: the pages show what the API says (jobs, a job's
name shown as text even when it is markdown, overview, checkpoints, one checkpoint's
timeline), a savepoint triggered from the page completes, an invalid restart strategy is
refused without a change, the restore choice stays while the retained set changes (and says
when it goes), and last a restore to a retained
checkpoint (it starts a new attempt, so it comes after the tests that read attempt 1). The
browser console stays free of errors, and each page is saved to ``docs/screenshots/``. The very
last test stops the control plane: the banner says so, the page keeps its data.
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
from selenium.webdriver.common.by import By

from sparkpoint import protocol as p
from sparkpoint.transport import RedisEventSink, Streams, redis_client
from sparkpoint_dashboard import ids
from tests.e2e.control_plane import REDIS_URL, TOKEN, ServerProcess, wait_for

from .conftest import Job
from .dashboard_page import HEIGHT, WIDTH, DashboardPage, pattern_id_xpath

pytestmark = [pytest.mark.browser, pytest.mark.spark]

RS_ATTEMPTS = {"type": ids.RS_PARAM, "key": "restart-strategy.fixed-delay.attempts"}
GONE = " · no longer retained"  # ends the label of a chosen restore point that went


# ----------------------------------------------------------------------------- helpers


def job_path(job: Job) -> str:
    return f"/jobs/{job.id}"


def checkpoints_answer(api: httpx.Client, job: Job) -> dict[str, Any]:
    answer = api.get(f"/jobs/{job.id}/checkpoints", params={"limit": 1000})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def completed_ids(answer: dict[str, Any]) -> set[int]:
    return {h["id"] for h in answer["history"] if h["status"] == "COMPLETED"}


def completed_retained(api: httpx.Client, job: Job) -> set[int]:
    """The ids of the job's retained checkpoints (completed, not discarded)."""
    history = checkpoints_answer(api, job)["history"]
    return {
        h["id"]
        for h in history
        if h["status"] == "COMPLETED" and not h.get("discarded") and not h.get("is_savepoint")
    }


def ensure_token(page: DashboardPage) -> None:
    """Type the control plane's token into the header (kept for the browser session)."""
    field = page.by_id(ids.TOKEN_INPUT)
    if field.get_attribute("value") != TOKEN:
        page.type_into(field, TOKEN)
    page.wait("the token to be taken", lambda: page.text(ids.TOKEN_STATE) == "token set")


def choose_restore(page: DashboardPage, checkpoint_id: int) -> None:
    """Choose retained checkpoint ``checkpoint_id`` in the restore dropdown (its option values
    are ``checkpoint:<id>`` and ``savepoint:<id>``)."""
    page.choose(ids.ACT_RESTORE_SELECT, f"checkpoint:{checkpoint_id}")
    chosen = page.chosen_label(ids.ACT_RESTORE_SELECT)
    assert chosen.startswith(f"#{checkpoint_id} checkpoint · "), chosen


def retained_checkpoints(page: DashboardPage) -> list[int]:
    """The checkpoint ids the restore dropdown offers, newest first (a gone choice kept in it
    excluded: its label says so)."""
    options, _label, _note = page.dropdown_state(ids.ACT_RESTORE_SELECT, ids.ACT_RESTORE_NOTE)
    return [
        int(value.split(":")[1])
        for value, label in options.items()
        if value.startswith("checkpoint:") and not label.endswith(GONE)
    ]


def newest_retained(page: DashboardPage, api: httpx.Client, job: Job) -> int | None:
    """The newest retained checkpoint the dropdown offers, once it is at most one behind the
    API's (on a busy machine the page lags): it stays retained longest, 5 are kept and one
    completes a second."""
    offered = retained_checkpoints(page)
    newest = max(completed_retained(api, job), default=None)
    if not offered or newest is None or offered[0] < newest - 1:
        return None
    return offered[0]


# Chooses ``arguments[1]`` in the open restore dropdown at the worst moment: while the answer
# of a refresh that changes the retained set (the callback writing ``arguments[0]``) is on its
# way back, its request sent before the choice. The answer is handed to Dash once the page
# shows the choice.
CHOOSE_DURING_A_REFRESH_JS = """
const [output, value] = arguments;
const realFetch = window.fetch;
window.choiceMade = false;
window.fetch = async (url, init) => {
  const answer = await realFetch(url, init);
  const body = JSON.parse((init && init.body) || '{}');
  if (String(url).includes('_dash-update-component') && String(body.output).includes(output)
      && answer.status === 200) {
    const input = document.querySelector(
      `.dash-dropdown-options [role=option] input[value="${value}"]`);
    if (input) {
      window.fetch = realFetch;
      input.closest('label').click();
      // The page shows the choice (two frames) before it takes the answer.
      await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
      window.choiceMade = true;
    }
  }
  return answer;
};
"""


def choose_restart_type(page: DashboardPage, strategy: str) -> None:
    """Choose a restart strategy type (``none``, ``fixed-delay``, ...) in the form."""
    page.choose(ids.RS_TYPE, strategy)


def finished_operation(page: DashboardPage, kind: str, timeout_s: float) -> str:
    """Wait for the newest entry of ``kind`` in the operations log to finish (the log marks
    each entry with ``data-kind`` and ``data-status``); its text, asserting it COMPLETED."""

    def newest() -> dict[str, str] | None:
        entry = page.driver.execute_script(
            "const e = document.querySelector(arguments[0]);"
            "return e && {status: e.dataset.status, text: e.innerText};",
            f"#{ids.OPERATIONS_LOG} .operation[data-kind='{kind}']",
        )
        return entry if entry and entry["status"] != "IN_PROGRESS" else None

    entry = page.wait(f"the {kind} to finish in the operations log", newest, timeout_s)
    assert entry["status"] == "COMPLETED", entry["text"]
    return entry["text"]


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


def running_badge() -> str:
    """The job header's status badge while the job is RUNNING."""
    return f"#{ids.JOB_STATUS_BADGE} .badge[data-status='RUNNING']"


def assert_screenshot(path: Path) -> None:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    assert (width, height) == (WIDTH, HEIGHT), path


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


# ----------------------------------------------------------------------------- actions


def test_a_savepoint_triggered_from_the_page_completes(
    page: DashboardPage, job: Job, api: httpx.Client, workdir: Path
) -> None:
    target = workdir / "savepoints"  # under the server's storage roots
    page.open(job_path(job), ids.ACT_SAVEPOINT, ids.OPERATIONS_LOG)
    ensure_token(page)
    page.type_into(page.by_id(ids.ACT_SAVEPOINT_DIR), str(target))
    page.by_id(ids.ACT_SAVEPOINT).click()
    text = page.confirm()
    assert text == f"Trigger a savepoint of job {job.id} into {target}? The job keeps running."
    entry = finished_operation(page, "savepoint", timeout_s=90)
    latest = checkpoints_answer(api, job)["latest"]["savepoint"]
    assert latest is not None
    location = latest["external_path"]
    assert location.startswith(f"file://{target}/")
    assert (Path(location.removeprefix("file://")) / "_metadata").is_file()
    assert f"savepoint {latest['id']} completed at {location}" in entry
    assert_screenshot(page.screenshot("job-operations"))


def test_an_invalid_restart_strategy_is_refused_and_changes_nothing(
    page: DashboardPage, job: Job, api: httpx.Client
) -> None:
    before = api.get(f"/jobs/{job.id}/restart-strategy").json()
    page.open(job_path(job), ids.RS_TYPE, ids.RS_APPLY)
    ensure_token(page)
    # The form is filled from the API once: choose after that, or the fill would undo it.
    page.wait(
        "the form to show the current type",
        lambda: page.exists_css(f"#{ids.RS_TYPE} input:checked"),
    )
    choose_restart_type(page, "fixed-delay")
    attempts = page.wait(
        "the attempts field of fixed-delay",
        lambda: page.driver.find_elements(By.XPATH, pattern_id_xpath(RS_ATTEMPTS)),
    )[0]
    page.type_into(attempts, "-3")
    page.by_id(ids.RS_APPLY).click()
    text = page.confirm()
    assert text.startswith(f"Replace the restart strategy of job {job.id} with fixed-delay (")
    assert "attempts -3" in text
    error = page.wait(
        "an error naming restart-strategy.fixed-delay.attempts",
        lambda: [
            t
            for t in page.texts(f"#{ids.RS_FEEDBACK} .notice-error")
            if "restart-strategy.fixed-delay.attempts" in t
        ],
    )
    assert "nothing changed" in error[0]
    assert api.get(f"/jobs/{job.id}/restart-strategy").json() == before


def test_the_restore_choice_stays_while_the_retained_set_changes_and_says_when_it_goes(
    page: DashboardPage, job: Job, api: httpx.Client
) -> None:
    """A checkpoint a second, 5 retained: the choice, made while a refresh of the retained set
    is on its way, stays through new checkpoints; when it is subsumed it stays shown, marked
    gone, with a note, and Restore refuses it."""
    page.open(f"{job_path(job)}/checkpoints", ids.ACT_RESTORE_SELECT)
    ensure_token(page)
    checkpoint_id = page.wait(
        "the newest retained checkpoint", partial(newest_retained, page, api, job)
    )
    page.by_id(ids.ACT_RESTORE_SELECT).click()  # open: the choice is clicked from the list
    page.driver.execute_script(
        CHOOSE_DURING_A_REFRESH_JS, f"{ids.ACT_RESTORE_CHOICES}.data", f"checkpoint:{checkpoint_id}"
    )
    page.wait(
        "the choice made during a refresh",
        lambda: page.driver.execute_script("return window.choiceMade"),
    )
    chosen = page.chosen_label(ids.ACT_RESTORE_SELECT)
    assert chosen.startswith(f"#{checkpoint_id} checkpoint · "), chosen
    # What Restore would send is the choice shown (not only a label left on screen).
    page.by_id(ids.ACT_RESTORE).click()
    assert page.dismiss().startswith(f"Restore job {job.id} from checkpoint {checkpoint_id}, ")

    gone = f"#{checkpoint_id} checkpoint{GONE}"
    sets_kept_through: set[tuple[int, ...]] = set()

    def subsumed() -> bool:
        """One look at the dropdown (its options, its label and the note read at once): the
        choice while it is retained, then the choice marked gone; never anything else."""
        options, label, note = page.dropdown_state(ids.ACT_RESTORE_SELECT, ids.ACT_RESTORE_NOTE)
        retained = tuple(
            int(v.split(":")[1])
            for v, text in options.items()
            if v.startswith("checkpoint:") and not text.endswith(GONE)
        )
        if checkpoint_id in retained:
            assert (label, note) == (chosen, ""), f"the choice changed to {label!r} ({note!r})"
            sets_kept_through.add(retained)
            return False
        assert label == gone, f"checkpoint {checkpoint_id} went; the dropdown shows {label!r}"
        return bool(note)

    # Subsumed once 5 newer ones completed: still shown, marked gone, with a note saying so.
    page.wait(f"checkpoint {checkpoint_id} to be subsumed", subsumed)
    assert len(sets_kept_through) >= 2, sets_kept_through  # it stayed while the set changed
    assert checkpoint_id not in completed_retained(api, job)
    assert page.text(ids.ACT_RESTORE_NOTE) == (
        f"checkpoint {checkpoint_id} is no longer retained (newer checkpoints subsumed it): "
        "choose another one."
    )
    page.by_id(ids.ACT_RESTORE).click()
    refused = f"checkpoint {checkpoint_id} is no longer retained: choose another one."
    page.wait("Restore to refuse it", lambda: page.text(ids.ACT_FEEDBACK) == refused)
    assert not page.alert_open(timeout_s=0)


def test_a_restore_to_a_retained_checkpoint_from_the_page_completes(
    page: DashboardPage, job: Job, api: httpx.Client
) -> None:
    attempt = api.get(f"/jobs/{job.id}").json()["attempt"]
    page.open(f"{job_path(job)}/checkpoints", ids.ACT_RESTORE_SELECT)
    ensure_token(page)

    checkpoint_id = page.wait(
        "the newest retained checkpoint to restore", partial(newest_retained, page, api, job)
    )
    choose_restore(page, checkpoint_id)
    page.by_id(ids.ACT_RESTORE).click()
    text = page.confirm()
    assert text.startswith(f"Restore job {job.id} from checkpoint {checkpoint_id}, taken ")
    assert "will be produced again" in text
    entry = finished_operation(page, "restore", timeout_s=120)
    assert f"the job runs again from checkpoint {checkpoint_id}" in entry
    restored = checkpoints_answer(api, job)["latest"]["restored"]
    assert restored["id"] == checkpoint_id

    def running_again() -> dict[str, Any] | None:
        state = api.get(f"/jobs/{job.id}").json()
        return state if state["state"] in ("RUNNING", "FINISHED") else None

    state = wait_for("the job to run again", running_again, timeout_s=60)
    assert state["attempt"] == attempt + 1
    # ... and the page's header says so.
    page.wait(
        f"the header to show attempt {attempt + 1}",
        lambda: (
            page.texts(running_badge()) == [f"RUNNING · attempt {attempt + 1}"]
            or state["state"] == "FINISHED"
        ),
    )


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
    assert len(page.grid_rows(ids.CP_HISTORY_GRID)) == len(rows)  # what it had, not a blank page
    page.screenshot("unreachable")

    server.start()
    page.wait("the banner to go", lambda: page.text(ids.BANNER) == "", timeout_s=60)
