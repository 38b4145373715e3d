"""One checkpoint's per-subtask Gantt: rows, phase bars, unacknowledged subtasks, stragglers."""

from __future__ import annotations

from typing import Any

from sparkpoint_dashboard.components.timeline import (
    Straggler,
    find_stragglers,
    subtask_phases,
    timeline_figure,
)
from sparkpoint_dashboard.theme import PHASE_COLORS, STRAGGLER_COLOR


def _traces(fig: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in fig["data"]}


def _subtask(
    index: int,
    e2e: float | None,
    *,
    start_delay: float = 100.0,
    alignment: float = 10.0,
    sync: float = 5.0,
    async_: float = 20.0,
    **overrides: Any,
) -> dict[str, Any]:
    sub: dict[str, Any] = {
        "index": index,
        "status": "completed" if e2e is not None else "pending_or_failed",
        "end_to_end_duration": e2e,
        "start_delay": start_delay if e2e is not None else None,
        "alignment": {"duration": alignment if e2e is not None else None},
        "checkpoint": {
            "sync": sync if e2e is not None else None,
            "async": async_ if e2e is not None else None,
        },
        "declined_reason": None,
        "clock_flagged": False,
        "handles": [],
    }
    sub.update(overrides)
    return sub


def _operator(op_id: str, name: str, *subtasks: dict[str, Any]) -> dict[str, Any]:
    return {"id": op_id, "name": name, "subtasks": list(subtasks)}


def test_one_row_per_subtask_of_every_operator() -> None:
    ops = [
        _operator("events", "events", _subtask(0, 140.0), _subtask(1, 150.0)),
        _operator("pv", "pv -> sink", _subtask(0, 160.0), _subtask(1, None)),
    ]
    rows = subtask_phases(ops)
    assert [r.label for r in rows] == ["events #0", "events #1", "pv -> sink #0", "pv -> sink #1"]
    assert [r.acknowledged for r in rows] == [True, True, True, False]


def test_repeated_operator_names_get_their_ids() -> None:
    ops = [_operator("a", "map", _subtask(0, 1.0)), _operator("b", "map", _subtask(0, 1.0))]
    assert [r.label for r in subtask_phases(ops)] == ["map (a) #0", "map (b) #0"]


def test_gantt_bars_start_where_the_previous_phase_ends() -> None:
    ops = [
        _operator(
            "pv",
            "pv -> sink",
            _subtask(0, 140.0, start_delay=100.0, alignment=10.0, sync=5.0, async_=20.0),
            _subtask(1, 90.0, start_delay=50.0, alignment=0.0, sync=2.5, async_=30.0),
        )
    ]
    fig = timeline_figure(ops)
    bars = {t["name"]: t for t in fig["data"] if t["type"] == "bar"}
    assert list(bars) == list(PHASE_COLORS)
    expected = {  # phase: (bases, lengths) of subtask 0 and 1
        "start delay": ([0.0, 0.0], [100.0, 50.0]),
        "alignment": ([100.0, 50.0], [10.0, 0.0]),
        "synchronous": ([110.0, 50.0], [5.0, 2.5]),
        "asynchronous": ([115.0, 52.5], [20.0, 30.0]),
    }
    for phase, (bases, lengths) in expected.items():
        assert (bars[phase]["base"], bars[phase]["x"]) == (bases, lengths), phase
        assert bars[phase]["y"] == ["pv -> sink #0", "pv -> sink #1"]
        assert bars[phase]["orientation"] == "h"
        assert bars[phase]["marker"]["color"] == PHASE_COLORS[phase]
    assert _traces(fig)["acknowledged"]["x"] == [140.0, 90.0]
    assert fig["layout"]["xaxis"]["title"]["text"] == "time since the trigger (ms)"
    assert fig["layout"]["yaxis"]["categoryarray"] == ["pv -> sink #0", "pv -> sink #1"]
    assert fig["layout"]["barmode"] == "overlay"  # bars sit at their base, not stacked


def test_unacknowledged_and_declined_subtasks_are_hatched_across_the_span() -> None:
    ops = [
        _operator(
            "pv",
            "pv",
            _subtask(0, 300.0),
            _subtask(1, None),
            _subtask(2, None, declined_reason="state too large"),
        )
    ]
    fig = timeline_figure(ops, span_ms=450.0)
    pending = _traces(fig)["not acknowledged"]
    assert pending["y"] == ["pv #1", "pv #2"]
    assert (pending["base"], pending["x"]) == ([0.0, 0.0], [450.0, 450.0])
    assert pending["marker"]["pattern"]["shape"] == "/"
    assert [c[0] for c in pending["customdata"]] == [
        "not acknowledged (pending or failed)",
        "declined: state too large",
    ]
    assert _traces(fig)["start delay"]["y"] == ["pv #0"]
    # Without a span, they reach the latest acknowledgement.
    assert _traces(timeline_figure(ops))["not acknowledged"]["x"] == [300.0, 300.0]


def test_stragglers_are_1_5_times_slower_than_their_operators_median() -> None:
    ops = [
        # median 210: 330 > 315 and +120 ms: a straggler; 290 < 315 is not.
        _operator(
            "pv",
            "pv",
            _subtask(0, 190.0),
            _subtask(1, 200.0),
            _subtask(2, 330.0),
            _subtask(3, 210.0),
            _subtask(4, 290.0),
        ),
        # median 2: 9 ms is 4.5 x the median and +7 ms (> 5 ms): a straggler.
        _operator("tiny", "tiny", _subtask(0, 2.0), _subtask(1, 2.0), _subtask(2, 9.0)),
        # median 2: 6 ms is 3 x, but only +4 ms: not meaningful.
        _operator("tinier", "tinier", _subtask(0, 2.0), _subtask(1, 2.0), _subtask(2, 6.0)),
        # one acknowledged subtask: nothing to compare with.
        _operator("solo", "solo", _subtask(0, 900.0), _subtask(1, None)),
    ]
    found = find_stragglers(subtask_phases(ops))
    assert found == [Straggler("pv", "pv #2", 330.0, 210.0), Straggler("tiny", "tiny #2", 9.0, 2.0)]
    assert (found[0].extra_ms, round(found[0].factor, 3)) == (120.0, 1.571)
    assert found[0].describe() == (
        "pv #2: 330 ms, +120 ms (1.6 times the operator's median of 210 ms)"
    )


def test_two_subtasks_straggler_against_their_mean() -> None:
    ops = [_operator("pv", "pv", _subtask(0, 100.0), _subtask(1, 400.0))]
    assert find_stragglers(subtask_phases(ops)) == [Straggler("pv", "pv #1", 400.0, 250.0)]


def test_gantt_outlines_and_labels_stragglers() -> None:
    ops = [_operator("pv", "pv", _subtask(0, 100.0), _subtask(1, 400.0))]
    fig = timeline_figure(ops)
    start = _traces(fig)["start delay"]
    assert start["marker"]["line"]["color"] == [PHASE_COLORS["start delay"], STRAGGLER_COLOR]
    assert start["marker"]["line"]["width"] == [0, 2]
    assert fig["layout"]["yaxis"]["ticktext"] == [
        "pv #0",
        f"<span style='color:{STRAGGLER_COLOR}'><b>pv #1 ⚑</b></span>",
    ]
    assert [(a["text"], a["x"], a["y"]) for a in fig["layout"]["annotations"]] == [
        (" straggler +150 ms", 400.0, "pv #1")
    ]


def test_gantt_without_subtasks_says_so() -> None:
    fig = timeline_figure([_operator("pv", "pv")])
    assert [a["text"] for a in fig["layout"]["annotations"]] == [
        "No subtasks reported for this checkpoint"
    ]
