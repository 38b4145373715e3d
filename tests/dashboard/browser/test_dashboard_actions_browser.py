"""The dashboard's actions in headless Chromium against a real control plane and a real PV
job.

One job serves every test, in this order: a savepoint triggered from the page completes
(and is then disposed of from the savepoints page), an invalid restart strategy is refused
without a change, the restore choice stays while the retained set changes (and says when it
goes, once the job retains fewer), and last a restore to a retained checkpoint (it starts a
new attempt, so it comes after the tests that read attempt 1).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.routing import savepoints_path
from tests.e2e.control_plane import TOKEN
from tests.support.waiting import wait_for

from .conftest import Job
from .dashboard_page import DashboardPage, pattern_id_xpath
from .job_checks import assert_screenshot, checkpoints_answer, job_path, running_badge

pytestmark = [pytest.mark.browser, pytest.mark.spark]

RS_ATTEMPTS = {"type": ids.RS_PARAM, "key": "restart-strategy.fixed-delay.attempts"}
GONE = " · no longer retained"  # ends the label of a chosen restore point that went


# ----------------------------------------------------------------------------- helpers


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


def retain(api: httpx.Client, job: Job, count: int) -> None:
    """Set how many checkpoints the job retains (PATCH applies it at once: a lower count
    discards what it no longer keeps)."""
    answer = api.patch(f"/jobs/{job.id}/checkpoints/config", json={"retained": count})
    assert answer.status_code == 200, answer.text


def newest_retained(page: DashboardPage, api: httpx.Client, job: Job) -> int | None:
    """The newest retained checkpoint the dropdown offers, once it is at most one behind the
    API's (on a busy machine the page lags): it stays retained longest."""
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
window.answerTaken = false;
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
      // The page has taken the answer a couple of frames after it is read (the renderer
      // reads its own copy as the test's copy resolves).
      answer.clone().json().then(() => requestAnimationFrame(
        () => requestAnimationFrame(() => { window.answerTaken = true; })));
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


def test_the_savepoint_is_disposed_of_from_the_savepoints_page(
    page: DashboardPage, job: Job, api: httpx.Client
) -> None:
    """The previous test's savepoint: later checkpoints completed since, so the job no
    longer needs it; its directory goes and no list offers it any more."""
    latest = checkpoints_answer(api, job)["latest"]["savepoint"]
    assert latest is not None
    location, number = latest["external_path"], latest["id"]
    wait_for(
        "a checkpoint after the savepoint",
        lambda: checkpoints_answer(api, job)["latest"]["completed"]["id"] > number,
        timeout_s=60,
    )
    page.open(savepoints_path(), ids.SP_GRID, ids.SP_DISPOSE)
    ensure_token(page)
    page.choose(ids.SP_DISPOSE_SELECT, location)
    page.by_id(ids.SP_DISPOSE).click()
    text = page.confirm()
    assert text.startswith(f"Dispose of savepoint #{number} of {job.id}? Its directory {location}")
    said = page.wait(
        "the disposal's outcome",
        lambda: (t := page.text(ids.SP_DISPOSE_FEEDBACK)).startswith("Disposed of") and t,
        timeout_s=30,
    )
    assert said.startswith(f"Disposed of savepoint {number}: deleted {location} (")
    assert not Path(location.removeprefix("file://")).exists()
    listed = api.get("/savepoints", params={"job": job.id}).json()["savepoints"]
    assert number not in [s["id"] for s in listed]
    page.wait(
        "the list without it",
        lambda: f"{job.id}:{number}" not in [r.get("id") for r in page.grid_data(ids.SP_GRID)],
    )
    page.screenshot("savepoint-disposed")


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
    """A checkpoint a second: the choice, made while a refresh of the retained set is on its
    way, stays through new checkpoints; when it is subsumed it stays shown, marked gone, with a
    note, and Restore refuses it.

    While the choice is made and checked, the job retains 100 checkpoints, so that no machine is
    slow enough for the retained set to leave the choice out before the test looks; then it
    retains 1, and the next checkpoint subsumes the choice."""
    retain(api, job, 100)
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
    # The answer that was on its way when the choice was made (a retained set with newer
    # checkpoints in it), once the page has taken it, leaves the choice as made.
    page.wait(
        "the page to take the answer that was on its way",
        lambda: page.driver.execute_script("return window.answerTaken"),
    )
    _, label, note = page.dropdown_state(ids.ACT_RESTORE_SELECT, ids.ACT_RESTORE_NOTE)
    assert (label, note) == (chosen, ""), (
        f"the answer on its way undid the choice: {label!r} ({note!r})"
    )
    # What Restore would send is the choice shown (not only a label left on screen).
    page.by_id(ids.ACT_RESTORE).click()
    confirm = page.dismiss()
    assert confirm.startswith(f"Restore job {job.id} from checkpoint {checkpoint_id}, ")
    wait_for(
        f"a checkpoint after {checkpoint_id}",
        lambda: max(completed_retained(api, job)) > checkpoint_id,
        timeout_s=60,
    )
    retain(api, job, 1)
    gone = f"#{checkpoint_id} checkpoint{GONE}"

    def subsumed() -> bool:
        """One look at the dropdown: the choice as made (no note) while it is retained, then
        the choice marked gone (with the note); never anything else. The label decides: the
        option list may be read a render apart from it on a busy machine."""
        _, label, note = page.dropdown_state(ids.ACT_RESTORE_SELECT, ids.ACT_RESTORE_NOTE)
        if label == chosen:
            assert note == "", f"the choice is shown as made, with the note {note!r}"
            return False
        assert label == gone, f"the choice changed to {label!r} ({note!r})"
        return bool(note)

    # Subsumed: still shown, marked gone, with a note saying so. How many looks still find it
    # retained is the machine's (the page refreshes once a second).
    page.wait(f"checkpoint {checkpoint_id} to be subsumed", subsumed)
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
    # The choice stays retained however long the page and the confirmation take.
    retain(api, job, 100)
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
