"""The restart strategy form of a job's overview (Flink's ``restart-strategy.*`` options).

The type is chosen with radio buttons; each option of that type has a text input whose id is
``{"type": ids.RS_PARAM, "key": <Flink key>}``. The form is filled once when the page opens,
sent only after a confirmation as a full strategy (``PUT .../restart-strategy``), and the
control plane judges the values: its 400 names the key of a wrong one.
"""

from __future__ import annotations

import math
import time
from typing import Any

from dash import ALL, Dash, Input, Output, Patch, State, dcc, html, no_update

from sparkpoint.checkpointing.restart import DEFAULTS, TYPE_KEY
from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components import operations as ops
from sparkpoint_dashboard.components.operations import NO_TOKEN
from sparkpoint_dashboard.components.widgets import fetch, message

RESTART_TYPES = ("none", "fixed-delay", "failure-rate", "exponential-delay")
_TYPE_ALIASES = {
    "off": "none",
    "disable": "none",
    "fixeddelay": "fixed-delay",
    "failurerate": "failure-rate",
    "exponentialdelay": "exponential-delay",
}
#: Each type's options: (Flink key, label in plain words, what a value looks like).
RESTART_PARAMS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "none": (),
    "fixed-delay": (
        ("restart-strategy.fixed-delay.attempts", "Restart attempts", "a count, e.g. 3"),
        ("restart-strategy.fixed-delay.delay", "Delay before each restart", "e.g. 10 s"),
    ),
    "failure-rate": (
        (
            "restart-strategy.failure-rate.max-failures-per-interval",
            "Most failures per interval",
            "a count, e.g. 3",
        ),
        ("restart-strategy.failure-rate.failure-rate-interval", "Interval", "e.g. 5 min"),
        ("restart-strategy.failure-rate.delay", "Delay before each restart", "e.g. 10 s"),
    ),
    "exponential-delay": (
        ("restart-strategy.exponential-delay.initial-backoff", "First backoff", "e.g. 1 s"),
        ("restart-strategy.exponential-delay.max-backoff", "Longest backoff", "e.g. 1 min"),
        (
            "restart-strategy.exponential-delay.backoff-multiplier",
            "Backoff multiplier",
            "> 1, e.g. 1.5",
        ),
        (
            "restart-strategy.exponential-delay.reset-backoff-threshold",
            "Reset the backoff after running",
            "e.g. 1 h",
        ),
        ("restart-strategy.exponential-delay.jitter-factor", "Jitter factor", "0 to 1, e.g. 0.1"),
        (
            "restart-strategy.exponential-delay.attempts-before-reset-backoff",
            "Most attempts before a reset",
            "2147483647: no limit",
        ),
    ),
}


def restart_type(strategy: dict[str, Any]) -> str:
    """The strategy's type as one of :data:`RESTART_TYPES` (Flink's aliases folded)."""
    raw = str(strategy.get(TYPE_KEY) or "exponential-delay").strip().lower()
    kind = _TYPE_ALIASES.get(raw, raw)
    return kind if kind in RESTART_TYPES else "exponential-delay"


def restart_param_values(kind: str, strategy: dict[str, Any] | None) -> dict[str, str]:
    """The inputs' texts for ``kind``: the strategy's values when it is of that type, else
    Flink's defaults."""
    same = strategy is not None and restart_type(strategy) == kind
    values = {}
    for key, _label, _hint in RESTART_PARAMS[kind]:
        value = strategy.get(key) if same and strategy else None
        values[key] = _text(DEFAULTS[key] if value is None else value)
    return values


def _text(value: Any) -> str:
    return str(value)


def parse_restart_value(text: Any) -> int | float | str:
    """A number when the text is one (``"3"`` → 3, ``"1.5"`` → 1.5), else the text
    (``"10 s"``): the API's validation decides and names the key when it is wrong."""
    if isinstance(text, bool):
        return str(text)
    if isinstance(text, int | float):
        return text
    stripped = str(text).strip()
    try:
        return int(stripped)
    except ValueError:
        pass
    try:
        number = float(stripped)
    except ValueError:
        return stripped
    return number if math.isfinite(number) else stripped


def restart_body(kind: str, values: dict[str, Any]) -> dict[str, int | float | str]:
    """The PUT body: the type and its options; an empty input is left out (Flink's default)."""
    body: dict[str, int | float | str] = {TYPE_KEY: kind}
    for key, _label, _hint in RESTART_PARAMS[kind]:
        value = values.get(key)
        if value is None or str(value).strip() == "":
            continue
        body[key] = parse_restart_value(value)
    return body


def restart_label(body: dict[str, Any]) -> str:
    """``"fixed-delay (attempts 3, delay 10 s)"``."""
    kind = str(body[TYPE_KEY])
    prefix = f"restart-strategy.{kind}."
    parts = [f"{k.removeprefix(prefix)} {_text(v)}" for k, v in body.items() if k != TYPE_KEY]
    return f"{kind} ({', '.join(parts)})" if parts else kind


def plan_restart(
    job_id: str, token: str | None, kind: str | None, values: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """Check the form: ``(plan, None)`` or ``(None, why nothing is sent)``. Values are not
    judged here: the control plane's 400 names the key of a wrong one."""
    if not token or not token.strip():
        return None, NO_TOKEN
    if kind not in RESTART_TYPES:
        return None, "Choose a restart strategy type first."
    body = restart_body(kind, values)
    label = restart_label(body)
    return {
        "job_id": job_id,
        "body": body,
        "label": f"Restart strategy: {label}",
        "message": f"Replace the restart strategy of job {job_id} with {label}?\n\n"
        "It applies from the job's next failure.",
    }, None


# ----------------------------------------------------------------------------- layout


def type_options(disabled: bool = False) -> list[dict[str, Any]]:
    """The strategy choices (all disabled for a job that ended)."""
    return [{"label": t, "value": t, "disabled": disabled} for t in RESTART_TYPES]


def card() -> html.Section:
    """The restart strategy form (filled by :func:`register`'s callbacks)."""
    return html.Section(
        [
            html.H2("Restart strategy"),
            html.P(
                "What happens when the job fails: whether and when it restarts from its latest "
                "checkpoint (after a restore: the one restored, until a newer one completes). "
                "Durations as Flink writes them (10 s, 1 min, 500 ms); an empty "
                "field takes Flink's default. Applies from the next failure.",
                className="help",
            ),
            dcc.RadioItems(
                id=ids.RS_TYPE,
                options=type_options(),
                inline=True,
                className="restart-type",
            ),
            html.Div(id=ids.RS_PARAMS, className="form-grid restart-params"),
            html.Div(
                html.Button("Apply…", id=ids.RS_APPLY, className="primary"),
                className="form-actions",
            ),
            html.Div(id=ids.RS_FEEDBACK, className="form-feedback"),
            html.Div(id=ids.RS_CURRENT, className="help current"),
            dcc.ConfirmDialog(id=ids.RS_CONFIRM),
            dcc.Store(id=ids.RS_PENDING),
            dcc.Store(id=ids.RS_LOADED),
        ],
        className="card",
    )


def _data_key(key: str) -> dict[str, Any]:
    return {"data-key": key}


def restart_params_view(
    kind: str | None, values: dict[str, str], *, disabled: bool = False
) -> list[Any]:
    """The parameter inputs of ``kind``: label in plain words, the Flink key, the value."""
    if kind not in RESTART_PARAMS:
        return []
    if not RESTART_PARAMS[kind]:
        return [html.Span("No options: the first failure fails the job.", className="help")]
    rows: list[Any] = []
    for key, label, hint in RESTART_PARAMS[kind]:
        input_id = {"type": ids.RS_PARAM, "key": key}
        rows += [
            html.Label([label, html.Br(), html.Code(key)]),
            html.Div(  # data-key: how a browser test finds the input of one option
                dcc.Input(
                    id=input_id,
                    type="text",
                    value=values.get(key, ""),
                    debounce=False,
                    disabled=disabled,
                ),
                **_data_key(key),
            ),
            html.Span(hint, className="unit"),
        ]
    return rows


# ----------------------------------------------------------------------------- callbacks


def _now_ms() -> int:
    return int(time.time() * 1000)


def _job_id(route: dict[str, Any] | None) -> str | None:
    return route.get("job_id") if route and route.get("page") == "job" else None


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.RS_TYPE, "value"),
        Output(ids.RS_LOADED, "data"),
        Input(ids.ROUTE, "data"),
        Input(ids.REFRESH, "n_intervals"),
        State(ids.RS_LOADED, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _fill_restart(route: Any, _n: Any, loaded: Any, token: str | None) -> Any:
        job_id = _job_id(route)
        if job_id is None or (loaded and loaded.get("job_id") == job_id):
            return no_update, no_update
        answer, _error = fetch(lambda: client.restart_strategy(job_id, token))
        if answer is None:
            return no_update, no_update
        return restart_type(answer), {"job_id": job_id, "strategy": answer}

    @app.callback(
        Output(ids.RS_PARAMS, "children"),
        Input(ids.RS_TYPE, "value"),
        Input(ids.JOB_ENDED, "data"),
        State(ids.RS_LOADED, "data"),
    )
    def _params(kind: str | None, ended: str | None, loaded: Any) -> Any:
        strategy = (loaded or {}).get("strategy")
        if kind is None:
            return []
        values = restart_param_values(kind, strategy)
        return restart_params_view(kind, values, disabled=bool(ended))

    @app.callback(
        Output(ids.RS_TYPE, "options"),
        Output(ids.RS_APPLY, "disabled"),
        Input(ids.JOB_ENDED, "data"),
    )
    def _disable(reason: str | None) -> Any:
        """An ended job's strategy cannot change: its choices and Apply are disabled (the
        reason shows above the forms)."""
        return type_options(disabled=bool(reason)), bool(reason)

    @app.callback(
        Output(ids.RS_CURRENT, "children"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _show_restart(_n: Any, route: Any, token: str | None) -> Any:
        job_id = _job_id(route)
        if job_id is None:
            return no_update
        answer, error = fetch(lambda: client.restart_strategy(job_id, token))
        if answer is None:
            return message(error) if error else no_update
        return f"Now: {answer.get('description')}"

    @app.callback(
        Output(ids.RS_PENDING, "data"),
        Output(ids.RS_CONFIRM, "message"),
        Output(ids.RS_CONFIRM, "displayed"),
        Output(ids.RS_FEEDBACK, "children"),
        Input(ids.RS_APPLY, "n_clicks"),
        State(ids.RS_TYPE, "value"),
        State({"type": ids.RS_PARAM, "key": ALL}, "value"),
        State({"type": ids.RS_PARAM, "key": ALL}, "id"),
        State(ids.TOKEN_INPUT, "value"),
        State(ids.ROUTE, "data"),
        prevent_initial_call=True,
    )
    def _plan_restart(
        clicks: Any,
        kind: Any,
        values: list[Any],
        input_ids: list[dict[str, str]],
        token: str | None,
        route: Any,
    ) -> Any:
        job_id = _job_id(route)
        if not clicks or job_id is None:
            return no_update, no_update, no_update, no_update
        by_key = {i["key"]: v for i, v in zip(input_ids, values, strict=True)}
        plan, error = plan_restart(job_id, token, kind, by_key)
        if plan is None:
            return None, no_update, False, message(error)
        return plan, plan["message"], True, None

    @app.callback(
        Output(ids.OPERATIONS, "data", allow_duplicate=True),
        Output(ids.RS_FEEDBACK, "children", allow_duplicate=True),
        Output(ids.RS_CURRENT, "children", allow_duplicate=True),
        Output(ids.RS_LOADED, "data", allow_duplicate=True),
        Input(ids.RS_CONFIRM, "submit_n_clicks"),
        State(ids.RS_PENDING, "data"),
        State(ids.TOKEN_INPUT, "value"),
        prevent_initial_call=True,
    )
    def _apply_restart(submitted: Any, plan: Any, token: str | None) -> Any:
        if not submitted or not plan:
            return no_update, no_update, no_update, no_update
        record, feedback, answer = ops.execute_change(
            lambda p, t: client.put_restart_strategy(p["job_id"], p["body"], t),
            plan,
            token,
            "restart-strategy",
            _now_ms(),
        )
        patch = Patch()
        patch.append(record)
        if answer is None:
            return patch, feedback, no_update, no_update
        loaded = {"job_id": plan["job_id"], "strategy": answer}
        return patch, feedback, f"Now: {answer.get('description')}", loaded
