"""The per-operator checkpoint timelines: heat strip, hold-ups and metrics figure, from an
answer of ``GET /jobs/{id}/checkpoints/operators``."""

from __future__ import annotations

import itertools
from typing import Any

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.app import page_title, render_page
from sparkpoint_dashboard.components.operator_timeline import (
    COLOUR_BY_SHARE,
    METRICS,
    checkpoint_duration,
    clicked_checkpoint,
    heat_cells,
    heat_strip_figure,
    holdup_counts,
    metrics_figure,
    operator_labels,
    share,
)
from sparkpoint_dashboard.pages.operators import holdups_view
from sparkpoint_dashboard.routing import Page, operators_path, parse

T0 = 1_700_000_000_000


def entry(cid: int, e2e: float | None, status: str = "COMPLETED", **extra: Any) -> dict[str, Any]:
    return {
        "id": cid,
        "status": status,
        "trigger_timestamp": T0 + 1000 * cid,
        "latest_ack_timestamp": None if e2e is None else T0 + 1000 * cid + int(e2e),
        "end_to_end_duration": e2e,
        "sync_duration": extra.get("sync"),
        "async_duration": extra.get("async_"),
        "alignment_duration": extra.get("alignment"),
        "start_delay": extra.get("start_delay"),
        "state_size": extra.get("state_size", 0),
        "checkpointed_size": 0,
        "num_subtasks": 2,
        "num_acknowledged_subtasks": 0 if e2e is None else 2,
        "slowest_subtask": extra.get("slowest"),
    }


def answer() -> dict[str, Any]:
    """Checkpoints 7, 8, 9: ``count`` holds up 7 and 8, ``source`` 9; 9 is in progress and
    ``count`` has not acknowledged it."""
    checkpoints = [
        {"id": 7, "status": "COMPLETED", "end_to_end_duration": 100.0, "trigger_timestamp": 1},
        {"id": 8, "status": "COMPLETED", "end_to_end_duration": 200.0, "trigger_timestamp": 2},
        {"id": 9, "status": "IN_PROGRESS", "end_to_end_duration": None, "trigger_timestamp": 3},
    ]
    source = [
        entry(7, 20.0, sync=1.0, async_=2.0, alignment=0.5, start_delay=3.0),
        entry(8, 50.0, sync=1.5),
        entry(9, 30.0, "COMPLETED"),
    ]
    count = [
        entry(
            7,
            100.0,
            sync=12.0,
            async_=60.0,
            alignment=8.0,
            start_delay=4.0,
            state_size=2048,
            slowest={"index": 1, "end_to_end_duration": 99.0},
        ),
        entry(8, 200.0, sync=14.0),
        entry(9, None, "IN_PROGRESS"),
    ]
    return {
        "checkpoints": checkpoints,
        "operators": [
            {"id": "source", "name": "source -> parse", "parallelism": 2, "checkpoints": source},
            {"id": "count", "name": "count -> sink", "parallelism": 2, "checkpoints": count},
        ],
    }


def test_the_heat_strip_has_an_operator_per_row_and_a_checkpoint_per_column() -> None:
    figure = heat_strip_figure(answer(), "job 1")
    heatmap = figure["data"][0]

    assert heatmap["type"] == "heatmap"
    assert heatmap["y"] == ["source -> parse", "count -> sink"]
    assert heatmap["x"] == ["#7", "#8", "#9"]
    assert heatmap["z"] == [[20.0, 50.0, 30.0], [100.0, 200.0, None]]
    assert figure["layout"]["yaxis"]["autorange"] == "reversed"  # the graph's order from the top
    assert figure["layout"]["height"] == 2 * 30 + 110


def test_the_heat_strip_by_share_divides_by_the_checkpoint_duration() -> None:
    heatmap = heat_strip_figure(answer(), "j", COLOUR_BY_SHARE)["data"][0]

    # 9 is in progress: its shares are of the slowest operator so far (source, 30 ms)
    assert heatmap["z"] == [[0.2, 0.25, 1.0], [1.0, 1.0, None]]
    assert (heatmap["zmin"], heatmap["zmax"]) == (0, 1)
    assert heatmap["colorbar"]["tickformat"] == ".0%"


def test_a_cell_hover_shows_the_numbers_and_its_data_ends_with_the_checkpoint_page() -> None:
    cell = heat_cells(answer(), "job 1")[1][0]

    assert cell.hover == [
        "count -> sink",
        "#7",
        "COMPLETED",
        "100 ms",
        "100%",
        "100 ms",
        "12 ms",
        "60 ms",
        "8 ms",
        "4 ms",
        "2/2",
        "#1 (99 ms)",
        "2.0 KiB",
        "2023-11-14 22:13:27.000",
    ]
    assert cell.href == "/jobs/job%201/checkpoints/7"
    heatmap = heat_strip_figure(answer(), "job 1")["data"][0]
    assert heatmap["customdata"][1][0] == [*cell.hover, cell.href]
    assert heatmap["hovertemplate"].count("%{customdata[") == 14


def test_a_click_on_a_cell_opens_its_checkpoint() -> None:
    # what dcc.Graph sends for a heatmap: no customdata (its point index is a pair)
    click = {"points": [{"x": "#7", "y": "count -> sink", "z": 100, "curveNumber": 0}]}

    assert clicked_checkpoint(click, "job 1") == "/jobs/job%201/checkpoints/7"
    assert clicked_checkpoint(None, "j") is None
    assert clicked_checkpoint({"points": []}, "j") is None
    assert clicked_checkpoint(click, None) is None
    assert clicked_checkpoint({"points": [{"x": "#x"}]}, "j") is None
    assert clicked_checkpoint({"points": [{"x": 7}]}, "j") is None


def test_the_durations_switch_to_seconds_from_ten_seconds_on() -> None:
    slow = answer()
    slow["operators"][1]["checkpoints"][1]["end_to_end_duration"] = 12_000.0

    heatmap = heat_strip_figure(slow, "j")["data"][0]

    assert heatmap["z"][1] == [0.1, 12.0, None]
    assert heatmap["colorbar"]["title"]["text"] == "end-to-end (s)"


def test_checkpoint_duration_and_share() -> None:
    assert [checkpoint_duration(answer(), c) for c in range(3)] == [100.0, 200.0, 30.0]
    assert share(50.0, 200.0) == 0.25
    assert share(300.0, 200.0) == 1.0  # clamped: an operator's clock ran ahead
    assert share(None, 200.0) is None
    assert share(0.0, 0.0) == 1.0


def test_holdups_count_the_last_operator_to_acknowledge_each_checkpoint() -> None:
    assert holdup_counts(answer()) == [("count -> sink", 2), ("source -> parse", 1)]
    text = holdups_view(answer())
    assert "".join(p if isinstance(p, str) else p.children for p in text) == (
        "Last to acknowledge: count -> sink in 2 of 3 checkpoints · "
        "source -> parse in 1 of 3 checkpoints"
    )


def test_a_tie_goes_to_the_operator_first_in_the_graph() -> None:
    tied = answer()
    tied["operators"][0]["checkpoints"][0]["end_to_end_duration"] = 100.0

    assert holdup_counts(tied) == [("count -> sink", 1), ("source -> parse", 2)][::-1]


def test_the_metrics_figure_has_a_row_per_metric_and_a_line_per_operator() -> None:
    figure = metrics_figure(answer())
    data = figure["data"]

    assert len(data) == len(METRICS) * 2
    rows = {(t["yaxis"], t["name"]): t for t in data}
    assert rows[("y", "count -> sink")]["y"] == [100.0, 200.0, None]
    assert rows[("y2", "count -> sink")]["y"] == [12.0, 14.0, None]
    assert rows[("y3", "count -> sink")]["y"] == [60.0, None, None]
    assert rows[("y4", "source -> parse")]["y"] == [0.5, None, None]
    assert [t["showlegend"] for t in data if t["name"] == "source -> parse"] == [
        True,
        False,
        False,
        False,
    ]
    assert {t["legendgroup"] for t in data if t["name"] == "count -> sink"} == {"count"}
    layout = figure["layout"]
    assert [a["text"] for a in layout["annotations"]] == [f"<b>{t}</b>" for _, t in METRICS]
    assert layout["xaxis4"]["showticklabels"] is True
    assert layout["xaxis"]["showticklabels"] is False
    assert layout["xaxis2"]["matches"] == "x"
    domains = [layout[f"yaxis{n}"]["domain"] for n in ("", "2", "3", "4")]
    assert all(a[0] > b[1] for a, b in itertools.pairwise(domains))  # no overlap


def test_without_checkpoints_both_figures_say_so() -> None:
    empty = {"checkpoints": [], "operators": [{"id": "a", "name": "a", "checkpoints": []}]}

    for figure in (metrics_figure(empty), heat_strip_figure(empty, "j")):
        assert figure["data"] == []
        assert figure["layout"]["annotations"][0]["text"] == "No checkpoints yet"
    assert holdup_counts(empty) == []
    assert holdups_view(empty) == "No operator has acknowledged a checkpoint yet."


def test_the_operators_page_has_its_address_tab_and_title() -> None:
    assert operators_path("job 1") == "/jobs/job%201/operators"
    route = parse("/jobs/job%201/operators")
    assert (route.page, route.job_id) == (Page.OPERATORS, "job 1")
    assert page_title("/jobs/j/operators") == "Operators of j · Sparkpoint"
    rendered = str(render_page("/jobs/j/operators"))
    for component in (ids.OT_HEAT_STRIP, ids.OT_METRICS_CHART, ids.OT_COLOUR_BY):
        assert f"id='{component}'" in rendered
    assert "'Operators', href='/jobs/j/operators', className='tab active'" in rendered


def test_operators_that_share_a_name_are_told_apart_by_their_id() -> None:
    twins = answer()
    twins["operators"][1]["name"] = "source -> parse"

    assert operator_labels(twins["operators"]) == [
        "source -> parse [source]",
        "source -> parse [count]",
    ]
    assert heat_strip_figure(twins, "j")["data"][0]["y"] == operator_labels(twins["operators"])
    assert holdup_counts(twins)[0] == ("source -> parse [count]", 2)
