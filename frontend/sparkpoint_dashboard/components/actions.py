"""The actions that steer a job: trigger a checkpoint or savepoint, stop, cancel, restore.

Every action goes the same way, each step a plain function:

1. a click is planned (:func:`plan_action`): checked (token, a restore choice, ...) and, when
   valid, described in the confirmation (:func:`confirm_message`) that says what will happen;
2. once confirmed it is sent (:func:`execute`) and recorded in ``ids.OPERATIONS``
   (:mod:`~sparkpoint_dashboard.components.operations`);
3. every refresh polls the requests still in progress until they complete or fail;
4. ``ids.OPERATIONS_LOG`` shows this job's records, newest first.
"""

from __future__ import annotations

import time
from typing import Any

from dash import Dash, Input, Output, Patch, State, ctx, dcc, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient, ApiRequestError, ApiUnreachableError
from sparkpoint_dashboard.components import operations as ops
from sparkpoint_dashboard.components.operations import NO_TOKEN
from sparkpoint_dashboard.components.widgets import choice_group, fetch, message
from sparkpoint_dashboard.routing import Route
from sparkpoint_dashboard.units import fmt_age, fmt_bytes, fmt_time

BUTTONS = {
    ids.ACT_CHECKPOINT: "checkpoint",
    ids.ACT_SAVEPOINT: "savepoint",
    ids.ACT_STOP: "stop",
    ids.ACT_CANCEL: "cancel",
    ids.ACT_RESTORE: "restore",
}
NO_CHOICE = "Choose a checkpoint or savepoint to restore first."
HISTORY_LIMIT = 200  # newest checkpoints read to find the restorable ones
DEFAULT_DIR = "the control plane's default savepoint directory"
GONE = " · no longer retained"  # ends the label of a chosen restore point that went
ENDED = ("FINISHED", "CANCELED", "FAILED")  # Flink's globally terminal job statuses


# ----------------------------------------------------------------------------- an ended job


def ended_reason(state: str | None) -> str | None:
    """Why a job can no longer be steered (``None`` while it can): Flink's globally terminal
    statuses end the job for good, so it takes no checkpoint, savepoint, stop, cancel,
    restore or configuration change."""
    if state not in ENDED:
        return None
    return (
        f"The job is {state}: it no longer runs, so it takes no checkpoint or savepoint and "
        "cannot be stopped, canceled, restored or reconfigured. To run it again: "
        "sparkpoint run JOB.py with this job's --job-id continues from its newest checkpoint, "
        "with that command line's checkpoint settings; add --from-checkpoint PATH to start "
        "from one of its savepoints or retained checkpoints instead."
    )


# ----------------------------------------------------------------------------- restore choices


def restore_candidates(
    history: list[dict[str, Any]], passed_over: list[int] | None = None
) -> dict[str, dict[str, Any]]:
    """What can be restored, by dropdown value, newest first: the retained checkpoints
    (COMPLETED, not discarded) as ``"checkpoint:<id>"`` and the savepoints (COMPLETED, with
    an ``external_path``, not disposed of) as ``"savepoint:<id>"``; ``passed_over`` (from
    ``latest.failover``): those a restore went back past, which a failover does not restore
    (a restore request still may)."""
    behind = set(passed_over or ())
    out: dict[str, dict[str, Any]] = {}
    for cp in sorted(history or [], key=lambda c: -int(c.get("id") or 0)):
        if cp.get("status") != "COMPLETED":
            continue
        savepoint = bool(cp.get("is_savepoint"))
        if (savepoint and not cp.get("external_path")) or cp.get("discarded"):
            continue
        value = f"{'savepoint' if savepoint else 'checkpoint'}:{cp['id']}"
        out[value] = {
            "id": cp["id"],
            "savepoint": savepoint,
            "path": cp.get("external_path"),
            "time": cp.get("latest_ack_timestamp") or cp.get("trigger_timestamp"),
            "size": cp.get("state_size"),
            "passed_over": cp["id"] in behind,
        }
    return out


def restore_options(candidates: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """Dropdown options: ``"#12 checkpoint · 02:21:55 UTC · 443 B"``.

    No age in the label: options change only when the choices do, so an open dropdown does not
    re-render under the pointer on every refresh.
    """
    options = []
    for value, c in candidates.items():
        what = "savepoint" if c["savepoint"] else "checkpoint"
        clock = fmt_time(c["time"])[11:19]
        label = f"#{c['id']} {what} · {clock} UTC · {fmt_bytes(c['size'])}"
        if c.get("passed_over"):
            label += " · a restore went back past it"
        options.append({"label": label, "value": value})
    return options


def restore_select(
    chosen: str | None, candidates: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], str | None]:
    """The restore dropdown's options and note for the restore points ``candidates`` while
    the dropdown's value is ``chosen``. The value is the user's: nothing but a choice sets it.

    While ``chosen`` is restorable the options are :func:`restore_options`. Once it is not (a
    newer checkpoint subsumed it), it stays in the options, disabled, labelled
    ``"#3 checkpoint · no longer retained"``, and the note says that it went: a Dash dropdown
    clears a value missing from its options without a word. Restore refuses it
    (:func:`plan_action`) until another one is chosen or the choice is cleared.
    """
    options: list[dict[str, Any]] = list(restore_options(candidates))
    if not chosen or chosen in candidates:
        return options, None
    kind, _, cp_id = chosen.partition(":")
    options.append({"label": f"#{cp_id} {kind}{GONE}", "value": chosen, "disabled": True})
    why = " (newer checkpoints subsumed it)" if kind == "checkpoint" else ""
    return options, f"{kind} {cp_id} is no longer retained{why}: choose another one."


# ----------------------------------------------------------------------------- planning


def confirm_message(
    kind: str,
    job_id: str,
    *,
    target: str | None = None,
    candidate: dict[str, Any] | None = None,
    now_ms: int = 0,
) -> str:
    """The confirmation's text: exactly what will happen."""
    into = target or DEFAULT_DIR
    if kind == "checkpoint":
        return f"Trigger a checkpoint of job {job_id}?"
    if kind == "savepoint":
        return f"Trigger a savepoint of job {job_id} into {into}? The job keeps running."
    if kind == "stop":
        return (
            f"Stop job {job_id} with a savepoint into {into}?\n\n"
            "The job takes a final savepoint, its sinks commit, and it finishes."
        )
    if kind == "cancel":
        return (
            f"Cancel job {job_id} now, without a savepoint?\n\n"
            "Its pending checkpoints are aborted and it stops. This cannot be undone: "
            "the job does not run again unless you start it anew."
        )
    assert candidate is not None
    taken = f"{fmt_time(candidate['time'])} UTC"
    what = (
        f"savepoint {candidate['id']} at {candidate['path']}"
        if candidate["savepoint"]
        else (f"checkpoint {candidate['id']}")
    )
    return (
        f"Restore job {job_id} from {what}, taken {taken} ({fmt_age(now_ms, candidate['time'])})?"
        "\n\nThe job restarts as a new attempt from that state and those source positions. "
        "Sinks cannot un-commit: the output they committed since "
        f"{taken} will be produced again (they commit again from there)."
    )


def action_label(
    kind: str, target: str | None = None, candidate: dict[str, Any] | None = None
) -> str:
    """A short name of the action for the operations log."""
    if kind == "checkpoint":
        return "Trigger checkpoint"
    if kind == "savepoint":
        return f"Savepoint into {target or 'the default directory'}"
    if kind == "stop":
        return f"Stop with savepoint into {target or 'the default directory'}"
    if kind == "cancel":
        return "Cancel job"
    assert candidate is not None
    what = "savepoint" if candidate["savepoint"] else "checkpoint"
    return f"Restore {what} {candidate['id']} ({fmt_time(candidate['time'])} UTC)"


def plan_action(
    kind: str,
    job_id: str,
    *,
    token: str | None,
    target: str | None,
    choice: str | None,
    choices: dict[str, dict[str, Any]] | None,
    now_ms: int,
) -> tuple[dict[str, Any] | None, str | None]:
    """Check an action and describe it: ``(plan, None)``, or ``(None, why it is not sent)``.

    The plan is what ``ids.ACT_PENDING`` holds until the operator confirms: ``kind, job_id,
    label, message`` and the request's parameters (``target``, ``checkpoint_id``,
    ``savepoint_path``).
    """
    if not token or not token.strip():
        return None, NO_TOKEN
    target = (target or "").strip() or None
    plan: dict[str, Any] = {"kind": kind, "job_id": job_id}
    candidate = None
    if kind in ("savepoint", "stop"):
        plan["target"] = target
    elif kind == "restore":
        if not choice:
            return None, NO_CHOICE
        candidate = (choices or {}).get(choice)
        if candidate is None:
            what = choice.replace(":", " ")
            return None, f"{what} is no longer retained: choose another one."
        if candidate["savepoint"]:
            plan["savepoint_path"] = candidate["path"]
        else:
            plan["checkpoint_id"] = candidate["id"]
    elif kind not in ("checkpoint", "cancel"):
        return None, f"unknown action {kind!r}"
    plan["label"] = action_label(kind, target, candidate)
    plan["message"] = confirm_message(
        kind, job_id, target=target, candidate=candidate, now_ms=now_ms
    )
    return plan, None


# ----------------------------------------------------------------------------- sending


def send(client: ApiClient, plan: dict[str, Any], token: str) -> Any:
    """Send the planned request; the API's answer (raises the client's errors)."""
    kind, job_id = plan["kind"], plan["job_id"]
    if kind == "checkpoint":
        return client.trigger_checkpoint(job_id, token)
    if kind == "savepoint":
        return client.trigger_savepoint(job_id, plan.get("target"), token)
    if kind == "stop":
        return client.stop_with_savepoint(job_id, plan.get("target"), token)
    if kind == "cancel":
        return client.cancel(job_id, token)
    if kind == "restore":
        return client.restore(
            job_id,
            token,
            checkpoint_id=plan.get("checkpoint_id"),
            savepoint_path=plan.get("savepoint_path"),
        )
    raise ValueError(f"unknown action {kind!r}")


def execute(
    client: ApiClient, plan: dict[str, Any], token: str | None, now_ms: int
) -> tuple[dict[str, Any], Any]:
    """Send a confirmed plan: its operation record, and the feedback to show."""
    job_id, kind, label = plan["job_id"], plan["kind"], plan["label"]
    if not token or not token.strip():
        return ops.failed_record(job_id, kind, label, "not sent: no API token", now_ms), message(
            NO_TOKEN
        )
    try:
        answer = send(client, plan, token)
    except ApiRequestError as err:
        refused = f"{label}: refused (HTTP {err.status}): {err.message}"
        return ops.failed_record(job_id, kind, label, err.message, now_ms), message(refused)
    except ApiUnreachableError as err:
        detail = f"no answer from the control plane ({err}); look at the job before trying again"
        return ops.failed_record(job_id, kind, label, detail, now_ms), message(f"{label}: {detail}")
    record = ops.accepted_record(job_id, kind, label, answer, now_ms)
    if record["warning"]:
        return record, message(f"{label} requested. Warning: {record['warning']}.", "warn")
    return record, message(f"{label} requested; its outcome shows in the log below.", "ok")


# ----------------------------------------------------------------------------- layout


def panel(route: Route) -> html.Div:
    """The actions bar of a job's pages, with its confirmation and its log."""
    return html.Div(
        [
            html.Div(
                [
                    html.Button("Trigger checkpoint", id=ids.ACT_CHECKPOINT, className="primary"),
                    html.Div(
                        [
                            dcc.Input(
                                id=ids.ACT_SAVEPOINT_DIR,
                                type="text",
                                placeholder="savepoint directory (default if empty)",
                                debounce=False,
                                className="savepoint-dir",
                            ),
                            html.Button("Trigger savepoint", id=ids.ACT_SAVEPOINT),
                            html.Button("Stop with savepoint", id=ids.ACT_STOP),
                        ],
                        className="control-group",
                    ),
                    choice_group(
                        ids.ACT_RESTORE_SELECT,
                        "checkpoint or savepoint to restore",
                        html.Button("Restore", id=ids.ACT_RESTORE),
                    ),
                    html.Button("Cancel job", id=ids.ACT_CANCEL, className="danger"),
                ],
                className="controls",
            ),
            html.Div(id=ids.ACT_RESTORE_NOTE, className="action-feedback"),
            html.Div(id=ids.ACT_ENDED_NOTE, className="ended-note"),
            html.Div(id=ids.ACT_FEEDBACK, className="action-feedback"),
            html.Div(id=ids.OPERATIONS_LOG, className="operations"),
            dcc.ConfirmDialog(id=ids.ACT_CONFIRM),
            dcc.Store(id=ids.ACT_PENDING),
            dcc.Store(id=ids.ACT_RESTORE_CHOICES, data={}),
            dcc.Store(id=ids.JOB_ENDED),
        ],
        className="card actions",
    )


# ----------------------------------------------------------------------------- callbacks


def _now_ms() -> int:
    return int(time.time() * 1000)


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.ACT_RESTORE_CHOICES, "data"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
        State(ids.ACT_RESTORE_CHOICES, "data"),
    )
    def _restore_choices(
        _n: int | None, route: dict[str, Any] | None, token: str | None, shown: Any
    ) -> Any:
        # Only the restore points: a value written from here would be the one read when the
        # refresh started, and would undo a choice made while it ran.
        if not route or not route.get("job_id"):
            return no_update
        answer, _error = fetch(lambda: client.checkpoints(route["job_id"], HISTORY_LIMIT, token))
        if answer is None:
            return no_update
        latest = (answer.get("latest") or {}).get("savepoint")  # older than the history read
        history = [*(answer.get("history") or []), *([latest] if latest else [])]
        failover = (answer.get("latest") or {}).get("failover") or {}
        candidates = restore_candidates(history, failover.get("passed_over"))
        return no_update if candidates == shown else candidates

    @app.callback(
        Output(ids.ACT_RESTORE_SELECT, "options"),
        Output(ids.ACT_RESTORE_NOTE, "children"),
        Input(ids.ACT_RESTORE_CHOICES, "data"),
        Input(ids.ACT_RESTORE_SELECT, "value"),
        State(ids.ACT_RESTORE_SELECT, "options"),
    )
    def _restore_select(candidates: Any, chosen: str | None, shown: Any) -> Any:
        # The value is an input, not a state: a choice made while this runs runs it again and
        # Dash drops the older answer, so the options always hold the value shown.
        options, note = restore_select(chosen, candidates or {})
        return (
            no_update if options == shown else options,
            message(note, "warn") if note else None,
        )

    @app.callback(
        Output(ids.JOB_ENDED, "data"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
        State(ids.JOB_ENDED, "data"),
    )
    def _ended(_n: int | None, route: dict[str, Any] | None, token: str | None, shown: Any) -> Any:
        if not route or not route.get("job_id"):
            return no_update
        job, _error = fetch(lambda: client.job(route["job_id"], token))
        if job is None:
            return no_update
        reason = ended_reason(job.get("state"))
        return no_update if reason == shown else reason

    @app.callback(
        *(Output(button, "disabled") for button in BUTTONS),
        Output(ids.ACT_SAVEPOINT_DIR, "disabled"),
        Output(ids.ACT_RESTORE_SELECT, "disabled"),
        Output(ids.ACT_ENDED_NOTE, "children"),
        Input(ids.JOB_ENDED, "data"),
    )
    def _disable(reason: str | None) -> Any:
        ended = bool(reason)
        note = message(reason, "info") if reason else None
        return (*(ended,) * (len(BUTTONS) + 2), note)

    @app.callback(
        Output(ids.ACT_PENDING, "data"),
        Output(ids.ACT_CONFIRM, "message"),
        Output(ids.ACT_CONFIRM, "displayed"),
        Output(ids.ACT_FEEDBACK, "children"),
        *(Input(button, "n_clicks") for button in BUTTONS),
        State(ids.TOKEN_INPUT, "value"),
        State(ids.ACT_SAVEPOINT_DIR, "value"),
        State(ids.ACT_RESTORE_SELECT, "value"),
        State(ids.ACT_RESTORE_CHOICES, "data"),
        State(ids.ROUTE, "data"),
        prevent_initial_call=True,
    )
    def _plan(*args: Any) -> Any:
        token, target, choice, choices, route = args[len(BUTTONS) :]
        kind = BUTTONS.get(str(ctx.triggered_id))
        if kind is None or not ctx.triggered[0].get("value") or not route:
            return no_update, no_update, no_update, no_update
        plan, error = plan_action(
            kind,
            route["job_id"],
            token=token,
            target=target,
            choice=choice,
            choices=choices,
            now_ms=_now_ms(),
        )
        if plan is None:
            return None, no_update, False, message(error)
        return plan, plan["message"], True, None

    @app.callback(
        Output(ids.OPERATIONS, "data", allow_duplicate=True),
        Output(ids.ACT_FEEDBACK, "children", allow_duplicate=True),
        Input(ids.ACT_CONFIRM, "submit_n_clicks"),
        State(ids.ACT_PENDING, "data"),
        State(ids.TOKEN_INPUT, "value"),
        prevent_initial_call=True,
    )
    def _confirmed(submitted: int | None, plan: dict[str, Any] | None, token: str | None) -> Any:
        if not submitted or not plan:
            return no_update, no_update
        record, feedback = execute(client, plan, token, _now_ms())
        patch = Patch()
        patch.append(record)
        return patch, feedback

    @app.callback(
        Output(ids.OPERATIONS, "data", allow_duplicate=True),
        Input(ids.REFRESH, "n_intervals"),
        State(ids.OPERATIONS, "data"),
        State(ids.TOKEN_INPUT, "value"),
        prevent_initial_call=True,
    )
    def _poll(_n: int | None, records: list[dict[str, Any]] | None, token: str | None) -> Any:
        patch, changed = Patch(), False
        for index, record in ops.to_poll(records or []):
            kind = ops.POLLED[record["kind"]]
            try:
                answer = client.operation(record["job_id"], kind, record["request_id"], token)
                updated = ops.apply_status(record, answer, _now_ms())
            except ApiRequestError as err:
                updated = ops.apply_poll_error(record, err.status, err.message, _now_ms())
            except ApiUnreachableError:
                return patch if changed else no_update
            if updated is not None:
                patch[index] = updated
                changed = True
        return patch if changed else no_update

    @app.callback(
        Output(ids.OPERATIONS_LOG, "children"),
        Input(ids.OPERATIONS, "data"),
        Input(ids.ROUTE, "data"),
    )
    def _log(records: list[dict[str, Any]] | None, route: dict[str, Any] | None) -> Any:
        if not route or not route.get("job_id"):
            return no_update
        return ops.log_view(ops.log_rows(records or [], route["job_id"]))
