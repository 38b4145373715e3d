"""The "Configuration" area of a job's overview: the checkpointing form (here) and the restart
strategy form (:mod:`~sparkpoint_dashboard.components.restart_form`).

Both forms are filled from the API once when the page opens (never on a refresh: what the
operator types survives), show the current values on every refresh, and send a change only
after a confirmation. Each outcome is recorded in ``ids.OPERATIONS`` like an action's.
"""

from __future__ import annotations

import time
from typing import Any

from dash import Dash, Input, Output, Patch, State, dcc, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components import operations as ops
from sparkpoint_dashboard.components import restart_form
from sparkpoint_dashboard.components.operations import NO_TOKEN
from sparkpoint_dashboard.components.widgets import fetch, message
from sparkpoint_dashboard.units import fmt_ms

# ----------------------------------------------------------------------------- checkpoint config

#: The fields a running job may change: (API name, input id, label, unit).
CONFIG_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("interval", ids.CFG_INTERVAL, "Interval", "ms"),
    ("timeout", ids.CFG_TIMEOUT, "Timeout", "ms"),
    ("min_pause", ids.CFG_MIN_PAUSE, "Minimum pause", "ms"),
    ("tolerable_failed_checkpoints", ids.CFG_TOLERABLE, "Tolerable failed checkpoints", "in a row"),
    ("retained", ids.CFG_RETAINED, "Retained checkpoints", "checkpoints"),
)
SHORT = {
    "interval": "interval",
    "timeout": "timeout",
    "min_pause": "min pause",
    "tolerable_failed_checkpoints": "tolerable failed checkpoints",
    "retained": "retained",
}
MS_FIELDS = {"interval", "timeout", "min_pause"}


def config_form_values(config: dict[str, Any]) -> list[Any]:
    """The form's values (in :data:`CONFIG_FIELDS` order) from ``GET .../checkpoints/config``."""
    return [config.get(name) for name, *_ in CONFIG_FIELDS]


def _with_unit(name: str, value: Any) -> str:
    return f"{value} ms" if name in MS_FIELDS else str(value)


def parse_config_form(values: list[Any]) -> tuple[dict[str, int], list[str]]:
    """The form's values as integers by API name, and what is wrong with the others."""
    wanted: dict[str, int] = {}
    problems: list[str] = []
    for (name, _id, label, _unit), value in zip(CONFIG_FIELDS, values, strict=True):
        number: int | None = None
        if isinstance(value, bool):
            number = None
        elif isinstance(value, int):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str) and value.strip().isdigit():
            number = int(value.strip())
        if number is None or number < 0:
            shown = "empty" if value in (None, "") else repr(value)
            unit_text = " (ms)" if name in MS_FIELDS else ""
            problems.append(f"{label}: {shown} is not a whole number ≥ 0{unit_text}")
        else:
            wanted[name] = number
    return wanted, problems


def config_changes(current: dict[str, Any], wanted: dict[str, int]) -> dict[str, int]:
    """The PATCH body: only the fields whose value differs from ``current``."""
    return {name: value for name, value in wanted.items() if current.get(name) != value}


def config_change_label(current: dict[str, Any], changes: dict[str, int]) -> str:
    """``"interval 1000 ms → 2000 ms, retained 5 → 10"``."""
    return ", ".join(
        f"{SHORT[name]} {_with_unit(name, current.get(name))} → {_with_unit(name, value)}"
        for name, value in changes.items()
    )


def plan_config(
    job_id: str, token: str | None, values: list[Any], loaded: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, str | None]:
    """Check the form against the configuration it was filled from: ``(plan, None)`` or
    ``(None, why nothing is sent)``. Only the fields the operator changed are sent."""
    if not token or not token.strip():
        return None, NO_TOKEN
    if not loaded or loaded.get("job_id") != job_id:
        return None, "The current configuration is not loaded yet; try again in a moment."
    wanted, problems = parse_config_form(values)
    if problems:
        return None, "; ".join(problems) + "."
    current = loaded["config"]
    changes = config_changes(current, wanted)
    if not changes:
        return None, "Nothing to change: the form shows the current configuration."
    label = config_change_label(current, changes)
    return {
        "job_id": job_id,
        "changes": changes,
        "label": f"Checkpoint configuration: {label}",
        "message": f"Change the checkpoint configuration of job {job_id}: {label}?\n\n"
        "The new values apply from the next checkpoint trigger.",
    }, None


def config_current_view(config: dict[str, Any]) -> str:
    """One line: the configuration the control plane applies now."""
    return (
        f"Now: every {fmt_ms(config.get('interval'))} ({config.get('interval')} ms), "
        f"timeout {fmt_ms(config.get('timeout'))}, min pause {fmt_ms(config.get('min_pause'))}, "
        f"{config.get('tolerable_failed_checkpoints')} tolerable failed, "
        f"{config.get('retained')} retained; {config.get('state_backend')} state backend"
        f"{' (incremental checkpoints)' if config.get('incremental') else ''}, "
        f"{config.get('checkpoint_storage')} storage at {config.get('checkpoint_dir')}."
    )


def config_fixed_view(config: dict[str, Any]) -> str:
    """Mode and max concurrent, which change only when the job (re)starts."""
    return (
        f"Mode {config.get('mode')}, at most {config.get('max_concurrent')} concurrent "
        "checkpoint(s): fixed until the job restarts."
    )


# ----------------------------------------------------------------------------- layout


def _config_form() -> html.Div:
    rows: list[Any] = []
    for _name, input_id, label, unit in CONFIG_FIELDS:
        rows += [
            html.Label(label, htmlFor=input_id),
            dcc.Input(
                id=input_id,
                type="number",
                min=0,
                step=1,
                debounce=False,
            ),
            html.Span(unit, className="unit"),
        ]
    return html.Div(rows, className="form-grid")


def view() -> html.Div:
    """The \"Configuration\" area: the checkpointing form and the restart strategy form."""
    checkpointing = html.Section(
        [
            html.H2("Checkpointing"),
            html.P(
                "Interval, timeout, minimum pause, tolerable failures and retained count change "
                "while the job runs and apply from the next trigger.",
                className="help",
            ),
            _config_form(),
            html.Div(id=ids.CFG_FIXED, className="help fixed-note"),
            html.Div(
                html.Button("Apply…", id=ids.CFG_APPLY, className="primary"),
                className="form-actions",
            ),
            html.Div(id=ids.CFG_FEEDBACK, className="form-feedback"),
            html.Div(id=ids.CFG_CURRENT, className="help current"),
            dcc.ConfirmDialog(id=ids.CFG_CONFIRM),
            dcc.Store(id=ids.CFG_PENDING),
            dcc.Store(id=ids.CFG_LOADED),
        ],
        className="card",
    )
    return html.Div(
        [
            html.Div(id=ids.CFG_ENDED_NOTE, className="ended-note"),
            html.Div([checkpointing, restart_form.card()], className="grid-2"),
        ]
    )


# ----------------------------------------------------------------------------- callbacks


def _now_ms() -> int:
    return int(time.time() * 1000)


def _job_id(route: dict[str, Any] | None) -> str | None:
    return route.get("job_id") if route and route.get("page") == "job" else None


def register(app: Dash, client: ApiClient) -> None:
    config_inputs = [Output(input_id, "value") for _n, input_id, _l, _u in CONFIG_FIELDS]
    config_states = [State(input_id, "value") for _n, input_id, _l, _u in CONFIG_FIELDS]

    @app.callback(
        *config_inputs,
        Output(ids.CFG_LOADED, "data"),
        Input(ids.ROUTE, "data"),
        Input(ids.REFRESH, "n_intervals"),
        State(ids.CFG_LOADED, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _fill_config(route: Any, _n: Any, loaded: Any, token: str | None) -> Any:
        job_id = _job_id(route)
        unchanged = (no_update,) * (len(CONFIG_FIELDS) + 1)
        if job_id is None or (loaded and loaded.get("job_id") == job_id):
            return unchanged  # filled once; a refresh never overwrites what the operator types
        answer, _error = fetch(lambda: client.checkpoint_config(job_id, token))
        if answer is None:
            return unchanged
        return *config_form_values(answer), {"job_id": job_id, "config": answer}

    @app.callback(
        Output(ids.CFG_CURRENT, "children"),
        Output(ids.CFG_FIXED, "children"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _show_config(_n: Any, route: Any, token: str | None) -> Any:
        job_id = _job_id(route)
        if job_id is None:
            return no_update, no_update
        answer, error = fetch(lambda: client.checkpoint_config(job_id, token))
        if answer is None:
            return (message(error) if error else no_update), no_update
        return config_current_view(answer), config_fixed_view(answer)

    @app.callback(
        *(Output(input_id, "disabled") for _n, input_id, _l, _u in CONFIG_FIELDS),
        Output(ids.CFG_APPLY, "disabled"),
        Output(ids.CFG_ENDED_NOTE, "children"),
        Input(ids.JOB_ENDED, "data"),
    )
    def _disable(reason: str | None) -> Any:
        """An ended job's forms: every input and button disabled, the reason above them."""
        note = message(reason, "info") if reason else None
        return (*(bool(reason),) * (len(CONFIG_FIELDS) + 1), note)

    @app.callback(
        Output(ids.CFG_PENDING, "data"),
        Output(ids.CFG_CONFIRM, "message"),
        Output(ids.CFG_CONFIRM, "displayed"),
        Output(ids.CFG_FEEDBACK, "children"),
        Input(ids.CFG_APPLY, "n_clicks"),
        *config_states,
        State(ids.CFG_LOADED, "data"),
        State(ids.TOKEN_INPUT, "value"),
        State(ids.ROUTE, "data"),
        prevent_initial_call=True,
    )
    def _plan_config(clicks: Any, *args: Any) -> Any:
        *values, loaded, token, route = args
        job_id = _job_id(route)
        if not clicks or job_id is None:
            return no_update, no_update, no_update, no_update
        plan, error = plan_config(job_id, token, list(values), loaded)
        if plan is None:
            return None, no_update, False, message(error)
        return plan, plan["message"], True, None

    @app.callback(
        Output(ids.OPERATIONS, "data", allow_duplicate=True),
        Output(ids.CFG_FEEDBACK, "children", allow_duplicate=True),
        Output(ids.CFG_LOADED, "data", allow_duplicate=True),
        Output(ids.CFG_CURRENT, "children", allow_duplicate=True),
        Input(ids.CFG_CONFIRM, "submit_n_clicks"),
        State(ids.CFG_PENDING, "data"),
        State(ids.TOKEN_INPUT, "value"),
        prevent_initial_call=True,
    )
    def _apply_config(submitted: Any, plan: Any, token: str | None) -> Any:
        if not submitted or not plan:
            return no_update, no_update, no_update, no_update
        record, feedback, answer = ops.execute_change(
            lambda p, t: client.patch_checkpoint_config(p["job_id"], p["changes"], t),
            plan,
            token,
            "config",
            _now_ms(),
        )
        patch = Patch()
        patch.append(record)
        if answer is None:
            return patch, feedback, no_update, no_update
        loaded = {"job_id": plan["job_id"], "config": answer}
        return patch, feedback, loaded, config_current_view(answer)

    restart_form.register(app, client)
