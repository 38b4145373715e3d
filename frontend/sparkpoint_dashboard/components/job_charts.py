"""The charts of a job's overview: its statuses as a timeline, its throughput with restarts."""

from __future__ import annotations

from typing import Any

from sparkpoint_dashboard.components.charts import (
    LEGEND,
    LEGEND_MARGIN_TOP,
    empty_figure,
    line_labels,
)
from sparkpoint_dashboard.theme import AMBER, BLUE, GREY, chart_layout, status_color
from sparkpoint_dashboard.units import fmt_ms, to_datetime

STATUS_HEIGHT = 180  # px: the lane, the time axis, and the legend below Plotly's toolbar


def status_bands(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's statuses as bands: each transition lasts until the next one (the last until
    the API's ``now``), oldest first."""
    history = sorted(job.get("status-history") or [], key=lambda h: h["timestamp"])
    now = int(job.get("now") or 0)
    bands = []
    for i, h in enumerate(history):
        end = history[i + 1]["timestamp"] if i + 1 < len(history) else max(now, h["timestamp"])
        bands.append(
            {
                "status": h["status"],
                "start": h["timestamp"],
                "end": end,
                "cause": h.get("cause"),
                "attempt": h.get("attempt"),
                "previous": h.get("previous"),
            }
        )
    return bands


def status_figure(bands: list[dict[str, Any]]) -> dict[str, Any]:
    """A one-lane timeline: a coloured band per status, one legend entry per status."""
    traces: dict[str, dict[str, Any]] = {}
    for b in bands:
        t = traces.setdefault(
            b["status"],
            {
                "type": "bar",
                "orientation": "h",
                "name": b["status"],
                "y": [],
                "x": [],
                "base": [],
                "customdata": [],
                "marker": {"color": status_color(b["status"])},
                "hovertemplate": "<b>%{customdata[0]}</b> from %{base|%H:%M:%S} UTC for "
                "%{customdata[1]}<br>attempt %{customdata[2]}; %{customdata[3]}<extra></extra>",
            },
        )
        t["y"].append("status")
        t["x"].append(b["end"] - b["start"])
        t["base"].append(to_datetime(b["start"]))
        t["customdata"].append(
            [
                b["status"],
                fmt_ms(b["end"] - b["start"]),
                b["attempt"],
                b["cause"] or "no cause given",
            ]
        )
    layout = chart_layout(
        height=STATUS_HEIGHT,
        barmode="overlay",
        margin={"l": 16, "r": 16, "t": LEGEND_MARGIN_TOP, "b": 40},
        legend=LEGEND,
        xaxis={"type": "date", "title": {"text": "time (UTC)"}},
        yaxis={"visible": False},
        showlegend=True,
    )
    return {"data": list(traces.values()), "layout": layout}


def restart_marks(job: dict[str, Any]) -> list[tuple[int, str]]:
    """``(time, text)`` of each restart (a RESTARTING transition) for the throughput chart; a
    requested restore says ``restore``. The transition carries the attempt that ended; the
    mark names the one it starts."""
    return [
        (h["timestamp"], f"{restart_word(h.get('cause'))}{_next_attempt(h.get('attempt'))}")
        for h in job.get("status-history") or []
        if h.get("status") == "RESTARTING"
    ]


def _next_attempt(ended: Any) -> str:
    return f" → attempt {ended + 1}" if isinstance(ended, int) else ""


def restart_word(cause: str | None) -> str:
    """``"restore"`` for a restart an operator requested (its cause says so), else
    ``"restart"``."""
    return "restore" if (cause or "").startswith("restore of ") else "restart"


def throughput_figure(
    samples: list[dict[str, Any]], marks: list[tuple[int, str]]
) -> dict[str, Any]:
    """Records/s (left axis) and source lag in records (right axis) per epoch; restarts as
    dashed vertical lines. Without a sample, a blank chart that says so (not empty axes over
    Plotly's default dates)."""
    if not samples:
        return empty_figure("No epoch has ended: no throughput to show")
    xs = [to_datetime(s["timestamp"]) for s in samples]
    data = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "records/s",
            "x": xs,
            "y": [s.get("records-per-second") for s in samples],
            "line": {"color": BLUE, "width": 2},
            "hovertemplate": "%{y:,.0f} records/s<extra></extra>",
        },
        {
            "type": "scatter",
            "mode": "lines",
            "name": "source lag (records)",
            "x": xs,
            "y": [s.get("source-lag") for s in samples],
            "yaxis": "y2",
            "line": {"color": AMBER, "width": 1.5, "dash": "dot"},
            "hovertemplate": "lag %{y:,} records<extra></extra>",
        },
    ]
    shapes = []
    for ts, _text in marks:
        when = to_datetime(ts)
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": when,
                "x1": when,
                "y0": 0,
                "y1": 1,
                "line": {"color": GREY, "dash": "dash", "width": 1},
            }
        )
    times = [int(s["timestamp"]) for s in samples] + [ts for ts, _ in marks]
    span = max(times) - min(times) if times else 0
    layout = chart_layout(
        height=300,
        margin={"l": 64, "r": 64, "t": LEGEND_MARGIN_TOP, "b": 48},
        legend=LEGEND,
        xaxis={"type": "date", "title": {"text": "time (UTC)"}},
        yaxis={"title": {"text": "records/s"}, "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "source lag (records)"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
        hovermode="x unified",
        shapes=shapes,
        annotations=line_labels(marks, span),
    )
    return {"data": data, "layout": layout}
