"""The checkpoint history chart: units, outcomes, savepoints, restarts."""

from __future__ import annotations

from typing import Any

import pytest

from sparkpoint_dashboard.components.charts import (
    bar_width_ms,
    duration_unit,
    history_duration,
    history_figure,
    restart_points,
)
from sparkpoint_dashboard.theme import SAVEPOINT_COLOR
from sparkpoint_dashboard.units import fmt_time

T0 = 1_795_659_700_000


def _entry(cid: int, **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": cid,
        "status": "COMPLETED",
        "is_savepoint": False,
        "is_final": False,
        "attempt": 1,
        "trigger_timestamp": T0 + cid * 1000,
        "latest_ack_timestamp": T0 + cid * 1000 + 500,
        "end_to_end_duration": 500.0,
        "checkpointed_size": 2048,
        "failure_reason": None,
    }
    entry.update(overrides)
    return entry


def _at(ms: int) -> str:
    """How the history chart writes a trigger time (UTC, for its date axis)."""
    return fmt_time(ms)


def _traces(fig: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in fig["data"]}


# ----------------------------------------------------------------------------- history


def test_duration_unit_switches_to_seconds_for_long_durations() -> None:
    assert duration_unit(None) == ("ms", 1.0)
    assert duration_unit(9_999.0) == ("ms", 1.0)
    assert duration_unit(10_000.0) == ("s", 1000.0)


def test_history_duration_of_each_outcome() -> None:
    assert history_duration(_entry(1), now_ms=None) == 500.0
    running = _entry(2, status="IN_PROGRESS", end_to_end_duration=None, latest_ack_timestamp=None)
    assert history_duration(running, now_ms=T0 + 2000 + 750) == 750.0
    assert history_duration(running, now_ms=None) is None
    failed = _entry(3, status="FAILED", end_to_end_duration=None)
    assert history_duration(failed, now_ms=None) == 500.0  # until its latest acknowledgement
    assert history_duration({**failed, "latest_ack_timestamp": None}, now_ms=None) is None
    ended = failed["trigger_timestamp"] + 2170
    expired = {**failed, "latest_ack_timestamp": None, "failure_timestamp": ended}
    assert history_duration(expired, now_ms=None) == 2170.0  # until it failed


def test_restart_points_are_the_first_checkpoints_of_each_new_attempt() -> None:
    entries = [
        _entry(1),
        _entry(2),
        _entry(3, attempt=2),
        _entry(4, attempt=2),
        _entry(5, attempt=3),
    ]
    assert restart_points(entries) == [(T0 + 3000, 2), (T0 + 5000, 3)]
    assert restart_points([_entry(1), _entry(2)]) == []


def test_bar_width_is_60_percent_of_the_median_gap() -> None:
    assert bar_width_ms([0, 1000, 2000, 5000]) == pytest.approx(600.0)
    assert bar_width_ms([42]) == 1000.0


def test_history_figure_axes_carry_units() -> None:
    fig = history_figure([_entry(1, end_to_end_duration=12_000.0, checkpointed_size=3 << 20)])
    assert fig["layout"]["yaxis"]["title"]["text"] == "end-to-end duration (s)"
    assert fig["layout"]["yaxis2"]["title"]["text"] == "checkpointed size (MiB)"
    assert fig["layout"]["xaxis2"]["title"]["text"] == "trigger time (UTC)"
    assert fig["layout"]["xaxis"]["matches"] == "x2"  # the two rows share their time axis
    assert fig["layout"]["uirevision"] == "keep"
    assert fig["layout"]["template"]["layout"]["plot_bgcolor"] == "white"  # resolved, not a name
    assert (_traces(fig)["COMPLETED"]["y"], _traces(fig)["checkpointed size"]["y"]) == (
        [12.0],
        [3.0],
    )
    small = history_figure([_entry(1, checkpointed_size=2048)])
    assert small["layout"]["yaxis"]["title"]["text"] == "end-to-end duration (ms)"
    assert small["layout"]["yaxis2"]["title"]["text"] == "checkpointed size (KiB)"


def test_history_figure_shows_each_outcome_savepoints_and_restarts() -> None:
    history = [
        _entry(
            4,
            status="IN_PROGRESS",
            end_to_end_duration=None,
            checkpointed_size=0,
            attempt=2,
            latest_ack_timestamp=None,
        ),
        _entry(
            3,
            status="FAILED",
            end_to_end_duration=None,
            latest_ack_timestamp=None,
            checkpointed_size=0,
            failure_reason="CHECKPOINT_EXPIRED",
            attempt=2,
        ),
        _entry(2, is_savepoint=True, attempt=2, end_to_end_duration=800.0),
        _entry(1),
    ]
    fig = history_figure(history, now_ms=T0 + 4000 + 300)
    traces = _traces(fig)
    assert list(traces) == ["COMPLETED", "FAILED", "IN_PROGRESS", "savepoint", "checkpointed size"]
    assert traces["COMPLETED"]["y"] == [500.0, 800.0]  # ms, oldest first
    assert traces["COMPLETED"]["x"] == [_at(T0 + 1000), _at(T0 + 2000)]
    # A failed checkpoint without a duration still shows, at 0, with its reason on hover.
    assert (traces["FAILED"]["x"], traces["FAILED"]["y"]) == ([_at(T0 + 3000)], [0.0])
    assert traces["FAILED"]["customdata"][0][5] == "CHECKPOINT_EXPIRED"
    assert traces["FAILED"]["marker"]["symbol"] == "x"
    assert traces["IN_PROGRESS"]["y"] == [300.0]
    assert traces["IN_PROGRESS"]["customdata"][0][3] == "300 ms so far"
    savepoint = traces["savepoint"]
    assert (savepoint["x"], savepoint["y"]) == ([_at(T0 + 2000)], [800.0])
    assert savepoint["marker"]["color"] == SAVEPOINT_COLOR and "showlegend" not in savepoint
    assert (savepoint["yaxis"], traces["COMPLETED"]["yaxis"]) == ("y", "y")  # the duration row
    sizes = traces["checkpointed size"]
    assert (sizes["type"], sizes["yaxis"]) == ("bar", "y2")  # the size row
    assert sizes["y"] == [2.0, 2.0, 0.0, 0.0]  # KiB, oldest first
    assert sizes["marker"]["color"] == ["#15803d", "#15803d", "#dc2626", "#2563eb"]
    assert sizes["marker"]["line"]["color"] == [
        "rgba(0,0,0,0)",
        SAVEPOINT_COLOR,
        "rgba(0,0,0,0)",
        "rgba(0,0,0,0)",
    ]
    assert sizes["width"] == 600.0  # ms: 60 % of the 1 s between checkpoints
    # The restart to attempt 2 (checkpoint 2) is a vertical line across both rows.
    assert [(s["x0"], s["x1"], s["yref"]) for s in fig["layout"]["shapes"]] == [
        (_at(T0 + 2000), _at(T0 + 2000), "paper")
    ]
    assert [a["text"] for a in fig["layout"]["annotations"]] == ["attempt 2"]


def test_history_figure_without_checkpoints_says_so() -> None:
    fig = history_figure([])
    assert fig["layout"]["uirevision"] == "empty"  # not the charts' "keep": no axes inherited
    assert (fig["data"], [a["text"] for a in fig["layout"]["annotations"]]) == (
        [],
        ["No checkpoints yet"],
    )
