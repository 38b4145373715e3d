"""The checkpoint configuration and restart strategy forms: filled from the API's answers,
checked, turned into exactly the PATCH / PUT the API expects, and their outcomes recorded."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components import operations as ops
from sparkpoint_dashboard.components import restart_form as rf
from sparkpoint_dashboard.components.config_forms import (
    config_current_view,
    config_fixed_view,
    config_form_values,
    parse_config_form,
    plan_config,
)
from sparkpoint_dashboard.components.restart_form import (
    parse_restart_value,
    plan_restart,
    restart_body,
    restart_param_values,
    restart_type,
)
from sparkpoint_server.api.restart_strategy import validate_restart_strategy

JOB = "ab8f"
NOW = 1_795_659_724_000

CONFIG = {  # GET /jobs/{id}/checkpoints/config
    "mode": "exactly_once",
    "interval": 1000,
    "timeout": 600000,
    "min_pause": 0,
    "max_concurrent": 1,
    "tolerable_failed_checkpoints": 0,
    "retained": 5,
    "state_backend": "hashmap",
    "checkpoint_storage": "filesystem",
    "checkpoint_dir": "file:///tmp/dev/checkpoints",
    "changeable": ["interval", "timeout", "min_pause", "tolerable_failed_checkpoints", "retained"],
}
LOADED = {"job_id": JOB, "config": CONFIG}

STRATEGY = {  # GET /jobs/{id}/restart-strategy
    "restart-strategy.type": "exponential-delay",
    "restart-strategy.exponential-delay.initial-backoff": "1 s",
    "restart-strategy.exponential-delay.max-backoff": "1 min",
    "restart-strategy.exponential-delay.backoff-multiplier": 1.5,
    "restart-strategy.exponential-delay.reset-backoff-threshold": "1 h",
    "restart-strategy.exponential-delay.jitter-factor": 0.1,
    "restart-strategy.exponential-delay.attempts-before-reset-backoff": 2147483647,
    "description": "exponential-delay: 1 s x 1.5 up to 1 min, jitter 0.1, reset after 1 h "
    "running, no attempt limit",
}
ATTEMPTS = "restart-strategy.fixed-delay.attempts"
DELAY = "restart-strategy.fixed-delay.delay"


def recording_client(status: int, answer: Any) -> tuple[ApiClient, list[httpx.Request]]:
    """A real :class:`ApiClient` whose HTTP transport records the requests and answers."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=answer)

    client = ApiClient("http://api")
    client._http = httpx.Client(base_url="http://api", transport=httpx.MockTransport(handler))
    return client, seen


# ----------------------------------------------------------------------------- checkpointing


def test_the_form_is_filled_from_the_get_answer() -> None:
    assert config_form_values(CONFIG) == [1000, 600000, 0, 0, 5]


def test_the_form_takes_whole_numbers_from_zero() -> None:
    assert parse_config_form([2000, 60000.0, 0, "3", 10]) == (
        {
            "interval": 2000,
            "timeout": 60000,
            "min_pause": 0,
            "tolerable_failed_checkpoints": 3,
            "retained": 10,
        },
        [],
    )
    wanted, problems = parse_config_form([None, 1.5, -1, True, 5])
    assert wanted == {"retained": 5}
    assert problems == [
        "Interval: empty is not a whole number ≥ 0 (ms)",
        "Timeout: 1.5 is not a whole number ≥ 0 (ms)",
        "Minimum pause: -1 is not a whole number ≥ 0 (ms)",
        "Tolerable failed checkpoints: True is not a whole number ≥ 0",
    ]


def test_only_the_changed_fields_are_patched_with_a_readable_change() -> None:
    plan, error = plan_config(JOB, "tok", [2000, 600000, 0, 0, 10], LOADED)
    assert error is None
    assert plan == {
        "job_id": JOB,
        "changes": {"interval": 2000, "retained": 10},
        "label": "Checkpoint configuration: interval 1000 ms → 2000 ms, retained 5 → 10",
        "message": "Change the checkpoint configuration of job ab8f: interval 1000 ms → 2000 ms, "
        "retained 5 → 10?\n\nThe new values apply from the next checkpoint trigger.",
    }


@pytest.mark.parametrize(
    ("token", "values", "loaded", "error"),
    [
        (
            None,
            [1000, 600000, 0, 0, 5],
            LOADED,
            "Enter the API token in the header first: actions need it.",
        ),
        (
            "tok",
            [1000, 600000, 0, 0, 5],
            LOADED,
            "Nothing to change: the form shows the current configuration.",
        ),
        (
            "tok",
            [1000, 600000, 0, 0, 5],
            None,
            "The current configuration is not loaded yet; try again in a moment.",
        ),
        (
            "tok",
            [1000, 600000, 0, 0, 5],
            {"job_id": "other", "config": CONFIG},
            "The current configuration is not loaded yet; try again in a moment.",
        ),
        ("tok", [-5, 600000, 0, 0, 5], LOADED, "Interval: -5 is not a whole number ≥ 0 (ms)."),
    ],
)
def test_nothing_is_sent_when(
    token: str | None, values: list[Any], loaded: Any, error: str
) -> None:
    assert plan_config(JOB, token, values, loaded) == (None, error)


def test_the_patch_carries_only_the_changes_and_the_outcome_is_recorded() -> None:
    answer = {**CONFIG, "interval": 2000, "retained": 10}
    client, seen = recording_client(200, answer)
    plan, _ = plan_config(JOB, "tok", [2000, 600000, 0, 0, 10], LOADED)
    assert plan is not None
    record, feedback, got = ops.execute_change(
        lambda p, t: client.patch_checkpoint_config(p["job_id"], p["changes"], t),
        plan,
        "tok",
        "config",
        NOW,
    )
    (request,) = seen
    assert (request.method, request.url.path) == ("PATCH", "/jobs/ab8f/checkpoints/config")
    assert json.loads(request.content) == {"interval": 2000, "retained": 10}
    assert request.headers["authorization"] == "Bearer tok"
    assert got == answer
    assert (record["kind"], record["status"], record["label"], record["detail"]) == (
        "config",
        "COMPLETED",
        "Checkpoint configuration: interval 1000 ms → 2000 ms, retained 5 → 10",
        "applies from the next checkpoint trigger",
    )
    assert feedback.className == "notice notice-ok"


def test_a_refused_patch_shows_the_apis_message_and_changes_nothing() -> None:
    client, _ = recording_client(
        400, {"errors": ["timeout: Input should be greater than or equal to 1"]}
    )
    plan, _ = plan_config(JOB, "tok", [1000, 0, 0, 0, 5], LOADED)
    assert plan is not None
    record, feedback, got = ops.execute_change(
        lambda p, t: client.patch_checkpoint_config(p["job_id"], p["changes"], t),
        plan,
        "tok",
        "config",
        NOW,
    )
    assert got is None
    assert (record["status"], record["detail"]) == (
        "FAILED",
        "timeout: Input should be greater than or equal to 1",
    )
    assert feedback.children == (
        "The control plane refused it (HTTP 400), nothing changed: "
        "timeout: Input should be greater than or equal to 1"
    )


def test_the_current_and_fixed_settings_read_as_sentences() -> None:
    assert config_current_view(CONFIG) == (
        "Now: every 1.00 s (1000 ms), timeout 10 min 00 s, min pause 0 ms, 0 tolerable failed, "
        "5 retained; hashmap state backend, filesystem storage at file:///tmp/dev/checkpoints."
    )
    assert config_fixed_view(CONFIG) == (
        "Mode exactly_once, at most 1 concurrent checkpoint(s): fixed until the job restarts."
    )


# ----------------------------------------------------------------------------- restart strategy


@pytest.mark.parametrize(
    ("configured", "kind"),
    [
        ("exponential-delay", "exponential-delay"),
        ("fixeddelay", "fixed-delay"),
        ("off", "none"),
        ("Failure-Rate", "failure-rate"),
        (None, "exponential-delay"),
    ],
)
def test_the_type_folds_flinks_aliases(configured: str | None, kind: str) -> None:
    assert restart_type({"restart-strategy.type": configured}) == kind


def test_the_form_is_prefilled_with_the_current_values_else_flinks_defaults() -> None:
    assert restart_param_values("exponential-delay", STRATEGY) == {
        "restart-strategy.exponential-delay.initial-backoff": "1 s",
        "restart-strategy.exponential-delay.max-backoff": "1 min",
        "restart-strategy.exponential-delay.backoff-multiplier": "1.5",
        "restart-strategy.exponential-delay.reset-backoff-threshold": "1 h",
        "restart-strategy.exponential-delay.jitter-factor": "0.1",
        "restart-strategy.exponential-delay.attempts-before-reset-backoff": "2147483647",
    }
    assert restart_param_values("fixed-delay", STRATEGY) == {ATTEMPTS: "1", DELAY: "1 s"}
    assert restart_param_values("none", STRATEGY) == {}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3),
        (" -3 ", -3),
        ("1.5", 1.5),
        ("10 s", "10 s"),
        ("abc", "abc"),
        ("inf", "inf"),
        (7, 7),
    ],
)
def test_values_are_numbers_when_they_parse(text: Any, value: Any) -> None:
    parsed = parse_restart_value(text)
    assert (parsed, type(parsed)) == (value, type(value))


def test_the_put_body_is_the_full_strategy_without_empty_fields() -> None:
    assert restart_body("fixed-delay", {ATTEMPTS: "3", DELAY: "10 s", "other": "x"}) == {
        "restart-strategy.type": "fixed-delay",
        ATTEMPTS: 3,
        DELAY: "10 s",
    }
    assert restart_body("fixed-delay", {ATTEMPTS: "  ", DELAY: "10 s"}) == {
        "restart-strategy.type": "fixed-delay",
        DELAY: "10 s",
    }
    assert restart_body("none", {ATTEMPTS: "3"}) == {"restart-strategy.type": "none"}


def test_a_restart_strategy_is_planned_with_its_confirmation() -> None:
    plan, error = plan_restart(JOB, "tok", "fixed-delay", {ATTEMPTS: "3", DELAY: "10 s"})
    assert error is None
    assert plan == {
        "job_id": JOB,
        "body": {"restart-strategy.type": "fixed-delay", ATTEMPTS: 3, DELAY: "10 s"},
        "label": "Restart strategy: fixed-delay (attempts 3, delay 10 s)",
        "message": "Replace the restart strategy of job ab8f with fixed-delay (attempts 3, "
        "delay 10 s)?\n\nIt applies from the job's next failure.",
    }
    assert plan_restart(JOB, "", "fixed-delay", {}) == (
        None,
        "Enter the API token in the header first: actions need it.",
    )
    assert plan_restart(JOB, "tok", None, {}) == (None, "Choose a restart strategy type first.")


@pytest.mark.parametrize("kind", rf.RESTART_TYPES)
def test_the_prefilled_form_of_every_type_is_a_strategy_the_api_accepts(kind: str) -> None:
    body = restart_body(kind, restart_param_values(kind, STRATEGY))
    assert validate_restart_strategy(body) == body


def test_a_negative_attempts_count_is_refused_by_the_api_naming_the_key() -> None:
    body = restart_body("fixed-delay", {ATTEMPTS: "-3", DELAY: "10 s"})
    with pytest.raises(
        Exception, match=r"restart-strategy\.fixed-delay\.attempts: invalid value -3"
    ):
        validate_restart_strategy(body)


def test_the_put_sends_the_strategy_and_a_400_is_shown_with_its_key() -> None:
    message = "restart-strategy.fixed-delay.attempts: invalid value -3: must be >= 0"
    client, seen = recording_client(400, {"errors": [message]})
    plan, _ = plan_restart(JOB, "tok", "fixed-delay", {ATTEMPTS: "-3", DELAY: "10 s"})
    assert plan is not None
    record, feedback, got = ops.execute_change(
        lambda p, t: client.put_restart_strategy(p["job_id"], p["body"], t),
        plan,
        "tok",
        "restart-strategy",
        NOW,
    )
    (request,) = seen
    assert (request.method, request.url.path) == ("PUT", "/jobs/ab8f/restart-strategy")
    assert json.loads(request.content) == {
        "restart-strategy.type": "fixed-delay",
        ATTEMPTS: -3,
        DELAY: "10 s",
    }
    assert got is None
    assert (record["status"], record["detail"]) == ("FAILED", message)
    assert (
        feedback.children == f"The control plane refused it (HTTP 400), nothing changed: {message}"
    )


def test_an_accepted_strategy_records_the_new_description() -> None:
    answer = {
        "restart-strategy.type": "fixed-delay",
        ATTEMPTS: 3,
        DELAY: "10 s",
        "description": "fixed-delay: up to 3 restarts, 10 s apart",
    }
    client, _ = recording_client(200, answer)
    plan, _ = plan_restart(JOB, "tok", "fixed-delay", {ATTEMPTS: "3", DELAY: "10 s"})
    assert plan is not None
    record, _, got = ops.execute_change(
        lambda p, t: client.put_restart_strategy(p["job_id"], p["body"], t),
        plan,
        "tok",
        "restart-strategy",
        NOW,
    )
    assert got == answer
    assert (record["status"], record["detail"]) == (
        "COMPLETED",
        "now: fixed-delay: up to 3 restarts, 10 s apart",
    )


def test_the_inputs_carry_the_flink_key() -> None:
    view = rf.restart_params_view("fixed-delay", {ATTEMPTS: "3", DELAY: "10 s"})
    inputs = [c for row in view for c in row._traverse() if getattr(c, "type", None) == "text"]
    assert [(c.id, c.value) for c in inputs] == [
        ({"type": "restart-param", "key": ATTEMPTS}, "3"),
        ({"type": "restart-param", "key": DELAY}, "10 s"),
    ]
