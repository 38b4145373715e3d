"""Disposing of a savepoint from the savepoints page (``POST /savepoint-disposal``).

The operator chooses one of the listed savepoints, confirms, and the control plane deletes
its directory and forgets it (no list offers it, no job restores it). The control plane
refuses what a live job still needs (its newest restore point, a pinned one) and the page
shows its words. Flink's web UI has no such control: its savepoints are deleted by hand.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient, ApiRequestError, ApiUnreachableError
from sparkpoint_dashboard.components.operations import NO_TOKEN
from sparkpoint_dashboard.components.widgets import choice_group, message
from sparkpoint_dashboard.units import fmt_bytes, fmt_time

NO_CHOICE = "Choose a savepoint to dispose of first."


def dispose_options(entries: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The dropdown's choices, newest first: ``#<id> of <job> · <time> UTC · <size>``, each
    valued by its location (what the request names)."""
    options = []
    for entry in entries:
        location = entry.get("location")
        if not location:
            continue
        when = fmt_time(entry.get("completion-timestamp") or entry.get("trigger-timestamp"))
        size = fmt_bytes(entry.get("state-size"))
        label = f"#{entry['id']} of {entry.get('job-id')} · {when} UTC · {size}"
        options.append({"label": label, "value": str(location)})
    return options


def confirm_text(label: str, location: str) -> str:
    return (
        f"Dispose of savepoint {label}? Its directory {location} is deleted, and no job can "
        "restore it any more. This cannot be undone."
    )


def outcome(answer: dict[str, Any]) -> str:
    """What a disposal did, in one sentence."""
    what = f"{answer.get('kind') or 'savepoint'} {answer.get('checkpoint-id')}"
    if not answer.get("files"):
        return f"Disposed of {what}: its files at {answer.get('path')} were already gone."
    return (
        f"Disposed of {what}: deleted {answer.get('path')} ({answer.get('files')} files, "
        f"{fmt_bytes(answer.get('bytes'))})."
    )


def controls() -> html.Div:
    button = html.Button("Dispose of", id=ids.SP_DISPOSE, className="danger")
    return html.Div(
        [
            html.Div(
                choice_group(ids.SP_DISPOSE_SELECT, "savepoint to dispose of", button),
                className="controls",
            ),
            html.Div(id=ids.SP_DISPOSE_FEEDBACK, className="action-feedback"),
            dcc.ConfirmDialog(id=ids.SP_DISPOSE_CONFIRM),
            dcc.Store(id=ids.SP_DISPOSE_PENDING),
        ],
        className="actions",
    )


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.SP_DISPOSE_PENDING, "data"),
        Output(ids.SP_DISPOSE_CONFIRM, "message"),
        Output(ids.SP_DISPOSE_CONFIRM, "displayed"),
        Output(ids.SP_DISPOSE_FEEDBACK, "children"),
        Input(ids.SP_DISPOSE, "n_clicks"),
        State(ids.SP_DISPOSE_SELECT, "value"),
        State(ids.SP_DISPOSE_SELECT, "options"),
        State(ids.TOKEN_INPUT, "value"),
        prevent_initial_call=True,
    )
    def _ask(clicked: int | None, location: str | None, options: Any, token: str | None) -> Any:
        if not clicked:
            return no_update, no_update, no_update, no_update
        if not token or not token.strip():
            return None, no_update, False, message(NO_TOKEN)
        labels = {o["value"]: o["label"] for o in options or []}
        if not location or location not in labels:
            return None, no_update, False, message(NO_CHOICE)
        label = labels[location].split(" · ")[0]
        return location, confirm_text(label, location), True, None

    @app.callback(
        Output(ids.SP_DISPOSE_FEEDBACK, "children", allow_duplicate=True),
        Output(ids.SP_DISPOSE_SELECT, "value"),
        Input(ids.SP_DISPOSE_CONFIRM, "submit_n_clicks"),
        State(ids.SP_DISPOSE_PENDING, "data"),
        State(ids.TOKEN_INPUT, "value"),
        prevent_initial_call=True,
    )
    def _dispose(submitted: int | None, location: str | None, token: str | None) -> Any:
        if not submitted or not location:
            return no_update, no_update
        if not token or not token.strip():
            return message(NO_TOKEN), no_update
        try:
            answer = client.dispose_savepoint(location, token)
        except ApiRequestError as err:
            return message(f"Refused (HTTP {err.status}): {err.message}"), no_update
        except ApiUnreachableError as err:
            return message(f"No answer from the control plane ({err}); try again."), no_update
        return message(outcome(answer if isinstance(answer, dict) else {}), "ok"), None
