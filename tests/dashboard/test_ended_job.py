"""A FINISHED, CANCELED or FAILED job: actions and forms disabled with the reason; the restore
dropdown keeps its value while the retained set changes, and says when the value went."""

from __future__ import annotations

import pytest
from dash import Dash

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.app import build_app
from sparkpoint_dashboard.components import actions, restart_form
from sparkpoint_dashboard.settings import load_settings


@pytest.mark.parametrize("state", ["FINISHED", "CANCELED", "FAILED"])
def test_an_ended_job_cannot_be_steered_and_the_reason_says_why(state: str) -> None:
    reason = actions.ended_reason(state)
    assert reason is not None
    assert reason.startswith(f"The job is {state}: it no longer runs")
    assert "--from-checkpoint PATH" in reason and "--job-id" in reason  # options that exist


@pytest.mark.parametrize("state", ["CREATED", "RUNNING", "RESTARTING", "FAILING", None])
def test_a_job_that_runs_or_may_run_again_can_be_steered(state: str | None) -> None:
    assert actions.ended_reason(state) is None


def candidates(*values: str) -> dict[str, dict[str, object]]:
    return {
        v: {
            "id": int(v.split(":")[1]),
            "savepoint": v.startswith("savepoint"),
            "time": 0,
            "size": 1,
        }
        for v in values
    }


def test_the_restore_options_are_the_retained_set_while_the_choice_is_in_it() -> None:
    retained = candidates("checkpoint:9", "savepoint:4")
    for chosen in ("savepoint:4", None):
        assert actions.restore_select(chosen, retained) == (
            actions.restore_options(retained),
            None,
        )


def test_a_subsumed_choice_stays_disabled_marked_gone_with_a_note() -> None:
    """Kept in the options, so the dropdown does not clear it without a word."""
    options, note = actions.restore_select("checkpoint:3", candidates("checkpoint:9"))
    assert options == [
        *actions.restore_options(candidates("checkpoint:9")),
        {"label": "#3 checkpoint · no longer retained", "value": "checkpoint:3", "disabled": True},
    ]
    assert note == (
        "checkpoint 3 is no longer retained (newer checkpoints subsumed it): choose another one."
    )
    options, note = actions.restore_select("savepoint:4", {})
    assert options == [
        {"label": "#4 savepoint · no longer retained", "value": "savepoint:4", "disabled": True}
    ]
    assert note == "savepoint 4 is no longer retained: choose another one."


def test_restart_form_choices_and_inputs_can_be_disabled() -> None:
    assert all(o["disabled"] for o in restart_form.type_options(disabled=True))
    assert not any(o["disabled"] for o in restart_form.type_options())
    inputs = restart_form.restart_params_view(
        "fixed-delay", {"restart-strategy.fixed-delay.attempts": "3"}, disabled=True
    )
    assert "disabled=True" in str(inputs)


@pytest.fixture(scope="module")
def app() -> Dash:
    return build_app(load_settings(api_url="http://127.0.0.1:9", dashboard_refresh_ms=1500))


def outputs_of(app: Dash, input_id: str) -> set[str]:
    """Every ``id.prop`` written by the callbacks that ``input_id`` triggers."""
    out: set[str] = set()
    for key, spec in app.callback_map.items():
        if any(dep["id"] == input_id for dep in spec["inputs"]):
            out |= {part for part in key.strip(".").split("...") if part}
    return out


def test_the_ended_store_disables_every_action_and_form_control(app: Dash) -> None:
    written = outputs_of(app, ids.JOB_ENDED)
    controls = [
        *actions.BUTTONS,
        ids.ACT_SAVEPOINT_DIR,
        ids.ACT_RESTORE_SELECT,
        ids.CFG_INTERVAL,
        ids.CFG_TIMEOUT,
        ids.CFG_MIN_PAUSE,
        ids.CFG_TOLERABLE,
        ids.CFG_RETAINED,
        ids.CFG_APPLY,
        ids.RS_APPLY,
    ]
    assert {f"{c}.disabled" for c in controls} <= written
    assert {f"{ids.ACT_ENDED_NOTE}.children", f"{ids.CFG_ENDED_NOTE}.children"} <= written
    assert {f"{ids.RS_TYPE}.options", f"{ids.RS_PARAMS}.children"} <= written


def test_only_a_choice_sets_the_restore_dropdowns_value(app: Dash) -> None:
    """A callback that wrote the value would write the one it read when it started: a refresh
    (it takes a while) would undo a choice made meanwhile. The options follow the value as an
    input, so a choice made while they are computed computes them again (Dash drops the older
    answer) and they always hold the value shown."""
    writers = [key for key in app.callback_map if f"{ids.ACT_RESTORE_SELECT}.value" in key]
    assert writers == []
    assert f"{ids.ACT_RESTORE_SELECT}.options" in outputs_of(app, ids.ACT_RESTORE_SELECT)
    assert f"{ids.ACT_RESTORE_SELECT}.options" not in outputs_of(app, ids.REFRESH)
