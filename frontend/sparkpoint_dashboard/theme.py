"""Colours and the chart layout every page shares, so a status looks the same everywhere."""

from __future__ import annotations

from typing import Any

GREEN = "#15803d"
RED = "#dc2626"
BLUE = "#2563eb"
AMBER = "#d97706"
ORANGE = "#ea580c"
PURPLE = "#7c3aed"
GREY = "#6b7280"
LIGHT_GREY = "#cbd5e1"
SKY = "#0ea5e9"

# Flink's job and checkpoint statuses, named as the API, the database and the dashboard name them.
JOB_STATUS_COLORS = {
    "CREATED": GREY,
    "RUNNING": GREEN,
    "FAILING": ORANGE,
    "RESTARTING": AMBER,
    "FAILED": RED,
    "CANCELLING": GREY,
    "CANCELED": GREY,
    "FINISHED": BLUE,
    "SUSPENDED": GREY,
}
CHECKPOINT_STATUS_COLORS = {"COMPLETED": GREEN, "FAILED": RED, "IN_PROGRESS": BLUE}
SAVEPOINT_COLOR = PURPLE
OPERATION_STATUS_COLORS = {"COMPLETED": GREEN, "FAILED": RED, "IN_PROGRESS": BLUE}

# The phases of a subtask's checkpoint, in order (the timeline's bars).
PHASE_COLORS = {
    "start delay": LIGHT_GREY,
    "alignment": AMBER,
    "synchronous": BLUE,
    "asynchronous": SKY,
}
STRAGGLER_COLOR = RED

FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif'


def status_color(status: str | None) -> str:
    """The colour of a job, checkpoint or operation status (grey when unknown)."""
    if status is None:
        return GREY
    return JOB_STATUS_COLORS.get(status) or CHECKPOINT_STATUS_COLORS.get(status) or GREY


def chart_layout(**overrides: Any) -> dict[str, Any]:
    """The layout every chart starts from; ``uirevision`` keeps zoom and legend choices when
    the data refreshes."""
    layout: dict[str, Any] = {
        "template": "plotly_white",
        "font": {"family": FONT, "size": 12, "color": "#1f2937"},
        "margin": {"l": 64, "r": 24, "t": 32, "b": 48},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "#ffffff",
        "hoverlabel": {"font": {"family": FONT}},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0, "xanchor": "left"},
        "uirevision": "keep",
    }
    layout.update(overrides)
    return layout
