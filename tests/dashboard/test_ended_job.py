"""A FINISHED, CANCELED or FAILED job: actions and forms disabled with the reason; the restore
dropdown keeps its value while the retained set changes."""

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
    assert "--from-checkpoint PATH" in reason  # the option that exists


@pytest.mark.parametrize("state", ["CREATED", "RUNNING", "RESTARTING", "FAILING", None])
def test_a_job_that_runs_or_may_run_again_can_be_steered(state: str | None) -> None:
    assert actions.ended_reason(state) is None


def candidates(*values: str) -> dict[str, dict[str, object]]:
    return {v: {"id": int(v.split(":")[1])} for v in values}


def test_the_restore_choice_survives_new_options_while_it_is_retained() -> None:
    kept = actions.restore_value_kept("savepoint:4", candidates("checkpoint:9", "savepoint:4"))
    assert kept == ("savepoint:4", None)
    assert actions.restore_value_kept(None, candidates("checkpoint:9")) == (None, None)


def test_a_choice_that_was_subsumed_is_cleared_with_a_note() -> None:
    value, note = actions.restore_value_kept("checkpoint:3", candidates("checkpoint:9"))
    assert value is None
    assert note is not None and note.startswith("checkpoint 3 is no longer retained")


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
    # The restore choices' callback writes the dropdown's value with its options.
    assert f"{ids.ACT_RESTORE_SELECT}.value" in outputs_of(app, ids.REFRESH)
