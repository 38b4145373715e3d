"""A job's overview: its cards, status timeline and table, throughput chart, failures and graph,
shaped from the API's answers; an unknown job gives a message that names it."""

from __future__ import annotations

import json
from typing import Any

import httpx

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.app import build_app
from sparkpoint_dashboard.components.job_cards import CAUSE_CHARS, checkpoints_card, job_cards
from sparkpoint_dashboard.components.job_charts import (
    restart_marks,
    status_bands,
    status_figure,
    throughput_figure,
)
from sparkpoint_dashboard.pages import job as page
from sparkpoint_dashboard.routing import parse
from sparkpoint_dashboard.settings import load_settings
from sparkpoint_dashboard.units import DASH, to_datetime

T0 = 1_795_659_691_559  # 2026-11-26 02:21:31.559 UTC

JOB: dict[str, Any] = {
    "jid": "ab8f",
    "name": "pv-count",
    "state": "RUNNING",
    "start-time": T0,
    "end-time": -1,
    "duration": 125_000,
    "now": T0 + 125_000,
    "attempt": 2,
    "restarts": 1,
    "vertices": [
        {
            "id": "pv",
            "name": "pv -> sink",
            "parallelism": 2,
            "maxParallelism": 128,
            "operators": ["pv", "sink"],
        },
        {
            "id": "events",
            "name": "events",
            "parallelism": 2,
            "maxParallelism": 128,
            "operators": ["events"],
        },
    ],
    "edges": [{"source": "events", "target": "pv"}],
    "status-history": [
        {
            "timestamp": T0,
            "status": "CREATED",
            "previous": None,
            "cause": "registered",
            "attempt": 1,
        },
        {
            "timestamp": T0 + 20_000,
            "status": "RUNNING",
            "previous": "CREATED",
            "cause": None,
            "attempt": 1,
        },
        {
            "timestamp": T0 + 80_000,
            "status": "RESTARTING",
            "previous": "RUNNING",
            "cause": "task pv/1 failed: boom",
            "attempt": 1,
        },
        {
            "timestamp": T0 + 81_500,
            "status": "RUNNING",
            "previous": "RESTARTING",
            "cause": None,
            "attempt": 2,
        },
    ],
    "throughput": {
        "records": 12_345,
        "records-per-second": 4939.8,
        "source-lag": 2228,
        "last-heartbeat": T0 + 123_000,
    },
}
SAMPLES = [
    {
        "timestamp": T0 + 60_000,
        "attempt": 1,
        "epoch": 28,
        "records": 2724,
        "records-per-second": 6095.5,
        "source-lag": 2290,
        "duration": 446.9,
    },
    {
        "timestamp": T0 + 90_000,
        "attempt": 2,
        "epoch": 1,
        "records": 2294,
        "records-per-second": 4882.6,
        "source-lag": 2350,
        "duration": 469.8,
    },
]


def texts(node: Any) -> list[str]:
    """Every string child in ``node``, in order."""
    out: list[str] = []
    for c in [node, *node._traverse()]:
        children = getattr(c, "children", None)
        if isinstance(children, str):
            out.append(children)
    return out


def test_the_cards_show_status_uptime_restarts_throughput_and_heartbeat() -> None:
    cards = job_cards(JOB, SAMPLES)
    assert [texts(c) for c in cards] == [
        ["Status", "RUNNING", "since 02:22:53 UTC"],
        ["Uptime", "2 min 05 s", "started 02:21:31 UTC"],
        ["Attempt", "2", "restores count too"],
        ["Restarts", "1", "last: 45.0 s ago"],
        ["Throughput", "4,940 records/s", "last epoch"],
        ["Records", "12,345 records", "since the job started"],
        ["Source lag", "2,228 records", "not read yet"],
        ["Last heartbeat", "2.00 s ago", "02:23:34 UTC"],
    ]


def test_the_heartbeat_card_shows_the_drivers_liveness_beside_the_last_epoch() -> None:
    restarting = {**JOB, "driver": {"heartbeat-interval": 10_000, "last-heartbeat": T0 + 121_000}}
    assert texts(job_cards(restarting, SAMPLES)[-1]) == [
        "Last heartbeat",
        "4.00 s ago",
        "02:23:32 UTC · last epoch 2.00 s ago",
    ]
    no_epoch = {**restarting, "throughput": {**JOB["throughput"], "last-heartbeat": None}}
    assert texts(job_cards(no_epoch, SAMPLES)[-1])[-1] == "02:23:32 UTC · no epoch yet"


def test_a_finished_job_shows_no_throughput_and_a_kept_total_is_used() -> None:
    finished = {**JOB, "state": "FINISHED", "throughput": {**JOB["throughput"], "records": 10**6}}
    cards = job_cards(finished, SAMPLES)
    assert texts(cards[4]) == ["Throughput", DASH, "the job is FINISHED"]
    assert texts(cards[5]) == ["Records", "1,000,000 records", "all attempts"]


def test_a_finished_job_shows_no_source_lag_and_its_whole_record_count() -> None:
    # The job's own summary prints "FINISHED: 1,234,567 records in ..."; the card says the same
    # number in full, and no "not read yet" lag once nothing reads any more.
    throughput = {**JOB["throughput"], "records": 1_234_567, "source-lag": 900}
    for state in ("FINISHED", "CANCELED", "FAILED"):
        cards = job_cards({**JOB, "state": state, "throughput": throughput}, SAMPLES)
        assert texts(cards[5])[1] == "1,234,567 records"
        assert texts(cards[6]) == ["Source lag", DASH, f"the job is {state}"]
    running = job_cards({**JOB, "throughput": throughput}, SAMPLES)
    assert texts(running[6]) == ["Source lag", "900 records", "not read yet"]


def test_a_lag_that_cannot_be_counted_is_unknown_and_names_the_splits_that_do_not_answer() -> None:
    # A Redis that is down: the driver cannot count its records, so "0 records" would lie.
    throughput = {**JOB["throughput"], "source-lag": None, "unanswered-splits": ["redis:a"]}
    shown = job_cards({**JOB, "throughput": throughput}, SAMPLES)
    assert texts(shown[6]) == ["Source lag", "unknown", "redis:a does not answer"]
    throughput["unanswered-splits"] = ["redis:a", "redis:b", "redis:c", "redis:d", "redis:e"]
    shown = job_cards({**JOB, "throughput": throughput}, SAMPLES)
    assert texts(shown[6])[2] == "redis:a, redis:b, redis:c and 2 more splits do not answer"
    # Its epochs leave a gap in the lag's line, not a drop to 0.
    samples = [SAMPLES[0], {**SAMPLES[1], "source-lag": None, "unanswered-splits": ["redis:a"]}]
    _rate, lag = throughput_figure(samples, [])["data"]
    assert lag["y"] == [2290, None]


def test_an_epoch_held_back_by_the_checkpoint_timeout_says_so_on_the_throughput_card() -> None:
    throughput = {**JOB["throughput"], "epoch-bound": 1200.0}
    shown = job_cards({**JOB, "throughput": throughput}, SAMPLES)
    assert texts(shown[4])[2] == "last epoch, held within 1.20 s by the checkpoint timeout"
    ended = job_cards({**JOB, "state": "FINISHED", "throughput": throughput}, SAMPLES)
    assert texts(ended[4])[2] == "the job is FINISHED"


def test_statuses_become_bands_until_the_next_transition_or_now() -> None:
    assert [
        (b["status"], b["start"] - T0, b["end"] - T0, b["attempt"]) for b in status_bands(JOB)
    ] == [
        ("CREATED", 0, 20_000, 1),
        ("RUNNING", 20_000, 80_000, 1),
        ("RESTARTING", 80_000, 81_500, 1),
        ("RUNNING", 81_500, 125_000, 2),
    ]


def test_the_status_timeline_has_one_coloured_trace_per_status() -> None:
    figure = status_figure(status_bands(JOB))
    traces = {t["name"]: t for t in figure["data"]}
    assert list(traces) == ["CREATED", "RUNNING", "RESTARTING"]
    assert traces["RUNNING"]["marker"]["color"] == "#15803d"
    assert traces["RESTARTING"]["marker"]["color"] == "#d97706"
    assert traces["RUNNING"]["x"] == [60_000, 43_500]
    assert traces["RUNNING"]["base"] == [to_datetime(T0 + 20_000), to_datetime(T0 + 81_500)]
    assert traces["RESTARTING"]["customdata"] == [
        ["RESTARTING", "1.50 s", 1, "task pv/1 failed: boom"]
    ]
    assert figure["layout"]["xaxis"]["title"]["text"] == "time (UTC)"
    assert figure["layout"]["uirevision"] == "keep"


def test_the_status_table_lists_transitions_with_cause_and_attempt() -> None:
    rows = page.status_rows(status_bands(JOB))
    assert [r["clock"] for r in rows] == [
        "02:21:31.559",
        "02:21:51.559",
        "02:22:51.559",
        "02:22:53.059",
    ]
    assert [
        (r["time"], r["status"], r["lasted"], r["attempt"], r["cause"], r["transition"])
        for r in rows
    ] == [
        ("2026-11-26 02:21:31.559", "CREATED", "20.0 s", 1, "registered", "start → CREATED"),
        ("2026-11-26 02:21:51.559", "RUNNING", "1 min 00 s", 1, DASH, "CREATED → RUNNING"),
        (
            "2026-11-26 02:22:51.559",
            "RESTARTING",
            "1.50 s",
            1,
            "task pv/1 failed: boom",
            "RUNNING → RESTARTING",
        ),
        ("2026-11-26 02:22:53.059", "RUNNING", "43.5 s so far", 2, DASH, "RESTARTING → RUNNING"),
    ]
    # A job that ended stays in its last status: it does not last "3 days so far".
    ended = [*status_bands(JOB)]
    ended[-1] = {**ended[-1], "status": "FINISHED"}
    assert [r["lasted"] for r in page.status_rows(ended)][-2:] == ["1.50 s", "final"]
    # RUNNING -> FAILING -> FAILED in one millisecond: the table sorts by order, not by time
    # alone (a tie listed FAILING as the newest).
    failed = [*ended[:-1], {**ended[-1], "status": "FAILING"}, {**ended[-1], "status": "FAILED"}]
    rows = page.status_rows(failed)
    assert page.STATUS_COLUMNS[0]["valueGetter"] == {"function": "params.data.seq"}
    newest_first = sorted(rows, key=lambda r: r["seq"], reverse=True)
    assert [r["status"] for r in newest_first][:2] == ["FAILED", "FAILING"]


def test_the_throughput_chart_has_rate_lag_on_a_second_axis_and_restarts() -> None:
    figure = throughput_figure(SAMPLES, restart_marks(JOB))
    rate, lag = figure["data"]
    assert (rate["name"], rate["y"]) == ("records/s", [6095.5, 4882.6])
    assert (lag["name"], lag["y"], lag["yaxis"]) == ("source lag (records)", [2290, 2350], "y2")
    layout = figure["layout"]
    assert layout["yaxis"]["title"]["text"] == "records/s"
    assert layout["yaxis2"]["title"]["text"] == "source lag (records)"
    assert layout["xaxis"]["title"]["text"] == "time (UTC)"
    (shape,) = layout["shapes"]
    assert shape["x0"] == to_datetime(T0 + 80_000)
    # The RESTARTING transition of attempt 1 starts attempt 2 (RUNNING as attempt 2 next).
    assert [a["text"] for a in layout["annotations"]] == ["restart → attempt 2"]


def test_a_job_without_an_epoch_says_so_instead_of_plotting_empty_axes() -> None:
    # A job that failed before its first epoch ended (a restore refused in the task): no
    # axes over Plotly's default dates of the year 2000.
    figure = throughput_figure([], restart_marks(JOB))
    assert figure["data"] == []
    layout = figure["layout"]
    assert not layout["xaxis"]["visible"] and not layout["yaxis"]["visible"]
    [note] = layout["annotations"]
    assert note["text"] == "No epoch has ended: no throughput to show"


def test_failures_show_where_why_and_what_the_restart_strategy_decided() -> None:
    answer = {
        "exceptionHistory": {
            "entries": [
                {
                    "exceptionName": "TASK_FAILED",
                    "stacktrace": "ValueError: boom",
                    "timestamp": T0 + 80_000,
                    "taskName": "pv (subtask 1)",
                    "attempt": 1,
                    "epoch": 41,
                    "action": "restart in 1000 ms (exponential-delay: restart 1 in 1 s)",
                },
                {
                    "exceptionName": "DRIVER_RESTART",
                    "stacktrace": "the driver registered again",
                    "timestamp": T0 + 10_000,
                    "taskName": None,
                    "attempt": 1,
                    "epoch": None,
                    "action": "restore the latest completed checkpoint",
                },
            ],
            "truncated": False,
        }
    }
    assert page.exception_rows(answer) == [
        {
            "id": f"{T0 + 80_000}-TASK_FAILED-1",
            "timestamp": T0 + 80_000,
            "time": "2026-11-26 02:22:51.559",
            "attempt": 1,
            "kind": "TASK_FAILED",
            "task": "pv (subtask 1)",
            "epoch": 41,
            "cause": "ValueError: boom",
            "decision": "restart in 1000 ms (exponential-delay: restart 1 in 1 s)",
        },
        {
            "id": f"{T0 + 10_000}-DRIVER_RESTART-1",
            "timestamp": T0 + 10_000,
            "time": "2026-11-26 02:21:41.559",
            "attempt": 1,
            "kind": "DRIVER_RESTART",
            "task": "the job",
            "epoch": None,
            "cause": "the driver registered again",
            "decision": "restore the latest completed checkpoint",
        },
    ]
    assert page.exception_rows({"exceptionHistory": {"entries": []}}) == []


def test_the_graph_runs_from_sources_to_sinks_with_chains_and_parallelism() -> None:
    assert [v["id"] for v in page.vertex_order(JOB)] == ["events", "pv"]
    boxes = page.vertices_view(JOB)
    assert [texts(b) for b in boxes] == [
        ["events", "parallelism 2 · max 128", "uid events"],
        ["→"],
        ["pv -> sink", "parallelism 2 · max 128", "chained: pv → sink"],
    ]
    assert texts(page.vertices_view({"vertices": [], "edges": []})[0]) == [
        "The job has not registered its graph yet."
    ]


def test_an_unknown_job_is_named() -> None:
    assert page.not_found_text("nope", 404, "job nope not found") == (
        "Job nope is not known to the control plane (job nope not found). "
        "It may have been started against another control plane."
    )


def test_the_layout_starts_with_the_header_and_holds_every_part() -> None:
    view = page.layout(parse("/jobs/ab8f"))
    assert view.children[0].className == "job-header"
    found = {getattr(c, "id", None) for c in view._traverse()}
    assert {
        ids.ROUTE,
        ids.JOB_CARDS,
        ids.JOB_STATUS_CHART,
        ids.JOB_STATUS_GRID,
        ids.JOB_THROUGHPUT_CHART,
        ids.JOB_EXCEPTIONS_GRID,
        ids.JOB_VERTICES,
        ids.JOB_MESSAGE,
        ids.CFG_APPLY,
        ids.CFG_CURRENT,
        ids.RS_TYPE,
        ids.RS_APPLY,
        ids.RS_CURRENT,
        ids.ACT_SAVEPOINT,
    } <= found


def test_the_refresh_of_an_unknown_job_shows_the_message_and_hides_the_rest() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"errors": ["job nope not found"]})

    client = ApiClient("http://api")
    client._http = httpx.Client(base_url="http://api", transport=httpx.MockTransport(handler))
    app = build_app(load_settings(api_url="http://api"), client)
    outputs = [
        ids.JOB_CARDS,
        ids.JOB_STATUS_CHART,
        ids.JOB_STATUS_GRID,
        ids.JOB_THROUGHPUT_CHART,
        ids.JOB_VERTICES,
        ids.JOB_MESSAGE,
        ids.JOB_BODY,
    ]
    props = ["children", "figure", "rowData", "figure", "children", "children", "style"]
    output = "...".join(f"{o}.{p}" for o, p in zip(outputs, props, strict=True))
    route = {"page": "job", "job_id": "nope", "checkpoint_id": None}
    answer = app.server.test_client().post(
        "/_dash-update-component",
        json={
            "output": f"..{output}..",
            "outputs": [{"id": o, "property": p} for o, p in zip(outputs, props, strict=True)],
            "inputs": [
                {"id": ids.REFRESH, "property": "n_intervals", "value": 1},
                {"id": ids.ROUTE, "property": "data", "value": route},
            ],
            "changedPropIds": [f"{ids.REFRESH}.n_intervals"],
            "state": [{"id": ids.TOKEN_INPUT, "property": "value", "value": None}],
        },
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    response = answer.get_json()["response"]
    assert response[ids.JOB_BODY] == {"style": {"display": "none"}}
    assert ids.JOB_CARDS not in response
    notice = json.dumps(response[ids.JOB_MESSAGE])
    assert "Job nope is not known to the control plane (job nope not found)." in notice


def _checkpoint(cid: int, status: str, **more: Any) -> dict[str, Any]:
    return {"id": cid, "status": status, **more}


def test_the_checkpoint_card_says_how_long_ago_the_last_one_completed() -> None:
    done = _checkpoint(11, "COMPLETED", latest_ack_timestamp=T0 + 100_000)
    answer = {
        "counts": {"completed": 11, "failed": 2},
        "latest": {"completed": done, "failed": _checkpoint(9, "FAILED")},
        "history": [done],
    }
    card = checkpoints_card(answer, T0 + 125_000, JOB)
    assert texts(card) == ["Last checkpoint", "25.0 s ago", "#11 · 11 completed"]


def test_checkpoints_failing_since_the_last_completed_show_how_many_and_why_in_red() -> None:
    # As in a run whose checkpoint storage filled: the overview says what the checkpoints
    # page says, so the first page a job opens at does not look healthy.
    why = "checkpoint 14 of job j declined by pv[0]: its snapshot could not be written: OSError"
    done = _checkpoint(11, "COMPLETED", latest_ack_timestamp=T0 + 100_000)
    failed = [_checkpoint(n, "FAILED", failure_message=why) for n in (14, 13, 12)]
    answer = {
        "counts": {"completed": 11, "failed": 3},
        "latest": {"completed": done, "failed": failed[0]},
        "history": [_checkpoint(15, "IN_PROGRESS"), *failed, done],
    }
    card = checkpoints_card(answer, T0 + 125_000, JOB)
    assert texts(card) == ["Last checkpoint", "25.0 s ago", f"3 failed since #11; latest: {why}"]
    (span,) = [c for c in card._traverse() if getattr(c, "className", None) == "stat-detail-failed"]
    assert span.title == f"3 failed since #11; latest: {why}"
    # More failures than the history read: a lower bound, said as one.
    many = [_checkpoint(n, "FAILED", failure_message=why) for n in range(500, 400, -1)]
    assert len(many) == page.CHECKPOINTS_LIMIT
    full = {**answer, "history": many}
    assert texts(checkpoints_card(full, T0 + 125_000, JOB))[2].startswith("100+ failed since #11")


def test_failed_savepoints_and_checkpoints_the_job_aborted_itself_are_no_alarm() -> None:
    done = _checkpoint(11, "COMPLETED", latest_ack_timestamp=T0 + 100_000)
    answer = {
        "counts": {"completed": 11, "failed": 3},
        "latest": {"completed": done, "failed": _checkpoint(14, "FAILED")},
        "history": [
            _checkpoint(14, "FAILED", failure_reason="CHECKPOINT_COORDINATOR_SHUTDOWN"),
            _checkpoint(13, "FAILED", failure_reason="JOB_FAILOVER_REGION"),
            _checkpoint(12, "FAILED", is_savepoint=True, failure_reason="CHECKPOINT_DECLINED"),
            done,
        ],
    }
    assert texts(checkpoints_card(answer, T0 + 125_000, JOB))[2] == "#11 · 11 completed"


def test_the_checkpoint_card_of_a_job_with_none_completed_or_no_answer() -> None:
    none = {"counts": {"completed": 0}, "latest": {"completed": None, "failed": None}}
    assert texts(checkpoints_card(none, T0, JOB)) == [
        "Last checkpoint",
        "none yet",
        "none completed",
    ]
    long = "x" * 500
    failing = {
        "counts": {"completed": 0, "failed": 1},
        "latest": {"completed": None, "failed": _checkpoint(1, "FAILED", failure_message=long)},
        "history": [_checkpoint(1, "FAILED", failure_message=long)],
    }
    shown = texts(checkpoints_card(failing, T0, JOB))
    assert shown[:2] == ["Last checkpoint", "none yet"]
    assert shown[2].startswith("1 failed (none completed); latest: xxx")
    assert len(shown[2]) == CAUSE_CHARS
    assert texts(checkpoints_card(None, T0, JOB)) == ["Last checkpoint", DASH, "not read"]


def test_the_checkpoint_card_says_periodic_checkpoints_wait_for_the_first_epoch() -> None:
    none = {"counts": {"completed": 0}, "latest": {"completed": None, "failed": None}}
    starting = {**JOB, "state": "RUNNING", "driver": {"first-epoch-ended": False}}
    assert texts(checkpoints_card(none, T0, starting))[2] == (
        "none completed · periodic ones wait for the attempt's first epoch to end"
    )
    for job in (
        {**starting, "driver": {"first-epoch-ended": True}},
        {**starting, "driver": {"first-epoch-ended": None}},  # a driver that does not say
        {**starting, "state": "RESTARTING"},
    ):
        assert texts(checkpoints_card(none, T0, job))[2] == "none completed"
