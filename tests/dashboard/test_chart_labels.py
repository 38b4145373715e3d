"""Labels of vertical lines (restarts) never overlap; legends sit below Plotly's toolbar."""

from __future__ import annotations

import itertools

from sparkpoint_dashboard.components import charts
from sparkpoint_dashboard.components.charts import MAX_LANES, label_lanes, line_labels
from sparkpoint_dashboard.components.job_charts import status_figure, throughput_figure

T0 = 1_764_123_691_559


def test_labels_far_apart_share_the_top_lane() -> None:
    assert label_lanes([0, 50_000, 100_000], span=100_000) == [0, 0, 0]


def test_labels_close_in_time_go_to_separate_lanes_and_no_lane_overlaps() -> None:
    times = [0, 1_000, 2_000, 30_000, 31_000]
    lanes = label_lanes(times, span=100_000)

    assert lanes == [0, 1, 2, 0, 1]
    gap = 100_000 * charts.LABEL_WIDTH_FRACTION
    for lane in set(lanes):
        on_lane = sorted(t for t, la in zip(times, lanes, strict=True) if la == lane)
        assert all(b - a >= gap for a, b in itertools.pairwise(on_lane))


def test_beyond_the_last_lane_only_the_line_shows() -> None:
    lanes = label_lanes([0, 10, 20, 30, 40], span=100_000)
    assert lanes == [0, 1, 2, None, None]
    assert max(la for la in lanes if la is not None) == MAX_LANES - 1


def test_line_labels_sit_inside_the_plot_on_their_lanes() -> None:
    notes = line_labels([(T0, "restart → attempt 2"), (T0 + 100, "restore → attempt 3")], 60_000)

    assert [(n["text"], n["y"], n["yanchor"]) for n in notes] == [
        ("restart → attempt 2", 1, "top"),
        ("restore → attempt 3", 1 - charts.LANE_HEIGHT, "top"),
    ]


def test_throughput_chart_labels_restarts_apart_and_keeps_its_legend_below_the_toolbar() -> None:
    samples = [
        {"timestamp": T0 + i * 1000, "records-per-second": 10.0, "source-lag": 5}
        for i in range(120)
    ]
    marks = [(T0 + 60_000, "restart → attempt 2"), (T0 + 61_000, "restore → attempt 3")]

    layout = throughput_figure(samples, marks)["layout"]

    assert len(layout["shapes"]) == 2
    assert sorted(n["y"] for n in layout["annotations"]) == [1 - charts.LANE_HEIGHT, 1]
    assert layout["margin"]["t"] >= charts.LEGEND_MARGIN_TOP
    assert layout["legend"]["y"] == 1.0 and layout["legend"]["yanchor"] == "bottom"


def test_status_and_history_charts_leave_room_for_the_toolbar_above_the_legend() -> None:
    band = {"status": "RUNNING", "start": T0, "end": T0 + 1000, "cause": None, "attempt": 1}
    status = status_figure([{**band, "previous": None}])["layout"]
    history = charts.history_figure(
        [
            {"id": 1, "status": "COMPLETED", "attempt": 1, "trigger_timestamp": T0},
            {"id": 2, "status": "COMPLETED", "attempt": 2, "trigger_timestamp": T0 + 1000},
        ]
    )["layout"]

    for layout in (status, history):
        assert layout["margin"]["t"] == charts.LEGEND_MARGIN_TOP
        assert layout["legend"] == charts.LEGEND
    assert [n["text"] for n in history["annotations"]] == ["attempt 2"]
    assert history["annotations"][0]["yanchor"] == "top"
