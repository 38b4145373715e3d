"""The checkpoint history chart (duration and size over time, by outcome), and what every chart
shares: its layout, its units, the empty placeholder. Pure functions from API answers to figures.

The figures are plain dicts in Plotly's JSON form (``{"data": [...], "layout": {...}}``, what
``dcc.Graph`` receives anyway): building a ``go.Figure`` validates every value and deep-copies
the template, which takes seconds on a busy two-core machine, longer than a refresh.
"""

from __future__ import annotations

import functools
import itertools
import statistics
from typing import Any

import plotly.io as pio

from sparkpoint_dashboard.theme import (
    AMBER,
    CHECKPOINT_STATUS_COLORS,
    GREY,
    SAVEPOINT_COLOR,
    chart_layout,
    status_color,
)
from sparkpoint_dashboard.units import fmt_bytes, fmt_ms, fmt_time, size_unit

Figure = dict[str, Any]  # a Plotly figure in its JSON form

LARGE_DURATION_MS = 10_000.0  # from this longest duration on, a duration axis reads in seconds
NO_LINE = "rgba(0,0,0,0)"

# The order the history chart lists statuses in (and their marker symbols).
_STATUS_SYMBOLS = {"COMPLETED": "circle", "FAILED": "x", "IN_PROGRESS": "circle-open"}


@functools.cache
def _template(name: str) -> dict[str, Any]:
    """A Plotly template by name, resolved once (plotly.js knows no template names)."""
    return dict(pio.templates[name].to_plotly_json())


def layout(**overrides: Any) -> dict[str, Any]:
    """:func:`chart_layout` with its template resolved, for a figure given as a dict."""
    result = chart_layout(**overrides)
    if isinstance(result.get("template"), str):
        result["template"] = _template(result["template"])
    return result


#: The top margin (px) of a chart with a legend: Plotly's toolbar (about 30 px high, at the top
#: right) sits above the legend row instead of over it.
LEGEND_MARGIN_TOP = 64
LEGEND = {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "xanchor": "left"}
#: A vertical line's label ("restore → attempt 3", 10 px type, about 110 px) takes about this
#: share of a half-page chart's plot (about 470 px at 1440 px): labels closer in time than
#: that go on separate lanes (rows); beyond :data:`MAX_LANES` only the line shows.
LABEL_WIDTH_FRACTION = 0.25
MAX_LANES = 3
LANE_HEIGHT = 0.1  # of the plot's height


def label_lanes(
    times: list[int], span: float, width_fraction: float = LABEL_WIDTH_FRACTION
) -> list[int | None]:
    """The lane (0 on top) of each vertical line's label so that no two labels overlap, or
    ``None`` when the label does not fit in :data:`MAX_LANES` lanes.

    Args:
        times: the lines' positions (ms), in the order of their labels.
        span: the x axis' extent (ms); a label is ``width_fraction`` of it wide.
    """
    gap = max(span, 1.0) * width_fraction
    lane_ends: list[float] = []  # where the last label of each lane ends
    lanes: list[int | None] = [None] * len(times)
    for i in sorted(range(len(times)), key=lambda k: times[k]):
        for lane, end in enumerate(lane_ends):
            if times[i] >= end:
                lanes[i], lane_ends[lane] = lane, times[i] + gap
                break
        else:
            if len(lane_ends) < MAX_LANES:
                lanes[i] = len(lane_ends)
                lane_ends.append(times[i] + gap)
    return lanes


def line_labels(
    marks: list[tuple[int, str]],
    span: float,
    *,
    xref: str = "x",
    color: str = GREY,
    width_fraction: float = LABEL_WIDTH_FRACTION,
) -> list[dict[str, Any]]:
    """Annotations of vertical lines at ``marks`` (``(time ms, text)``), inside the plot's
    top edge, on lanes that keep them apart (see :func:`label_lanes`; ``width_fraction``: a
    label's width as a share of the plot's)."""
    lanes = label_lanes([t for t, _ in marks], span, width_fraction)
    return [
        {
            "x": fmt_time(t),
            "xref": xref,
            "y": 1 - lane * LANE_HEIGHT,
            "yref": "paper",
            "yanchor": "top",
            "xanchor": "left",
            "text": text,
            "showarrow": False,
            "font": {"size": 10, "color": color},
            "bgcolor": "rgba(255,255,255,0.85)",
        }
        for (t, text), lane in zip(marks, lanes, strict=True)
        if lane is not None
    ]


def duration_unit(max_ms: float | None) -> tuple[str, float]:
    """The unit (``"ms"`` or ``"s"``) and divisor a duration axis up to ``max_ms`` reads best in."""
    if max_ms is not None and max_ms >= LARGE_DURATION_MS:
        return "s", 1000.0
    return "ms", 1.0


def empty_figure(text: str) -> Figure:
    """A blank chart that says ``text`` (no data yet, or still loading).

    Its ``uirevision`` differs from the charts', so the first real chart does not inherit the
    blank one's axes (a Gantt's reversed row order would be lost).
    """
    hidden = {"visible": False}
    note = {
        "text": text,
        "showarrow": False,
        "x": 0.5,
        "y": 0.5,
        "xref": "paper",
        "yref": "paper",
        "font": {"color": GREY, "size": 13},
    }
    return {
        "data": [],
        "layout": layout(
            height=220, xaxis=hidden, yaxis=hidden, annotations=[note], uirevision="empty"
        ),
    }


# ----------------------------------------------------------------------------- history


def history_duration(entry: dict[str, Any], now_ms: int | None) -> float | None:
    """The end-to-end duration of a history entry in ms; for one still in progress, how long it
    has been running (when ``now_ms`` is given); for a failed one without a duration, how long
    it ran until it failed (as Flink's history shows it; an expired one: its timeout), or until
    its latest acknowledgement when the failure time is not known (or None)."""
    duration = entry.get("end_to_end_duration")
    if duration is not None:
        return float(duration)
    trigger = entry.get("trigger_timestamp")
    if trigger is None:
        return None
    if entry.get("status") == "IN_PROGRESS" and now_ms is not None:
        return float(max(0, now_ms - trigger))
    failed = failed_after(entry)
    if failed is not None:
        return float(failed)
    ack = entry.get("latest_ack_timestamp")
    return float(max(0, ack - trigger)) if ack is not None else None


def failed_after(entry: dict[str, Any]) -> int | None:
    """ms from a failed checkpoint's trigger to its failure (None: not known, or not failed)."""
    trigger, failure = entry.get("trigger_timestamp"), entry.get("failure_timestamp")
    if entry.get("status") != "FAILED" or not trigger or failure is None:
        return None
    return max(0, failure - trigger)


def restart_points(entries: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """``(trigger time, new attempt)`` of the first checkpoint after each change of job attempt,
    for entries sorted by trigger time."""
    points: list[tuple[int, int]] = []
    previous: int | None = None
    for entry in entries:
        attempt = entry.get("attempt")
        if previous is not None and attempt is not None and attempt != previous:
            points.append((int(entry["trigger_timestamp"]), int(attempt)))
        if attempt is not None:
            previous = attempt
    return points


def bar_width_ms(triggers: list[int]) -> float:
    """The width of one size bar: 60 % of the median gap between checkpoints (1 s with one)."""
    gaps = [b - a for a, b in itertools.pairwise(triggers) if b > a]
    return 0.6 * statistics.median(gaps) if gaps else 1000.0


def type_label(entry: dict[str, Any]) -> str:
    """``"checkpoint"``, ``"savepoint"``, with ``" (final)"`` for a job's last one."""
    label = "savepoint" if entry.get("is_savepoint") else "checkpoint"
    return f"{label} (final)" if entry.get("is_final") else label


def history_figure(history: list[dict[str, Any]], now_ms: int | None = None) -> Figure:
    """End-to-end duration (top) and checkpointed size (bottom) of each checkpoint over its
    trigger time (UTC), coloured by outcome, savepoints ringed, restarts as vertical lines.

    Args:
        history: the ``history`` of ``GET /jobs/{id}/checkpoints`` (any order).
        now_ms: the current time, to show how long checkpoints in progress have been running.
    """
    entries = sorted(
        (e for e in history if e.get("trigger_timestamp")), key=lambda e: e["trigger_timestamp"]
    )
    if not entries:
        return empty_figure("No checkpoints yet")
    durations = [history_duration(e, now_ms) for e in entries]
    d_unit, d_div = duration_unit(max((d for d in durations if d is not None), default=None))
    s_unit, s_div = size_unit(max(int(e.get("checkpointed_size") or 0) for e in entries))
    # A failed checkpoint without a duration still shows, at 0 on the duration row.
    ys = [
        d / d_div if d is not None else (0.0 if e.get("status") == "FAILED" else None)
        for e, d in zip(entries, durations, strict=True)
    ]
    times = [fmt_time(e["trigger_timestamp"]) for e in entries]
    custom = [
        [
            e["id"],
            e.get("status"),
            type_label(e),
            fmt_ms(d) + (" so far" if e.get("status") == "IN_PROGRESS" and d is not None else ""),
            fmt_bytes(e.get("checkpointed_size")),
            e.get("failure_reason") or "",
        ]
        for e, d in zip(entries, durations, strict=True)
    ]
    hover = (
        "<b>#%{customdata[0]}</b> %{customdata[1]} · %{customdata[2]}<br>"
        "triggered %{x|%H:%M:%S.%L} UTC<br>end-to-end %{customdata[3]}<br>"
        "checkpointed %{customdata[4]}<br>%{customdata[5]}<extra></extra>"
    )

    def duration_points(idx: list[int]) -> dict[str, Any]:
        """The part of a trace of the duration row that holds entries ``idx``."""
        x, y, cd = [times[i] for i in idx], [ys[i] for i in idx], [custom[i] for i in idx]
        return dict(type="scatter", xaxis="x", yaxis="y", x=x, y=y, customdata=cd)

    data: list[dict[str, Any]] = []
    for status, symbol in _STATUS_SYMBOLS.items():
        idx = [i for i, e in enumerate(entries) if e.get("status") == status]
        color, size = CHECKPOINT_STATUS_COLORS[status], 11 if status == "FAILED" else 7
        if idx:
            data.append(
                duration_points(idx)
                | dict(name=status, legendgroup=status, hovertemplate=hover)
                | dict(mode="lines+markers" if status == "COMPLETED" else "markers")
                | dict(line={"color": color, "width": 1})
                | dict(marker={"color": color, "symbol": symbol, "size": size})
            )
    savepoints = [i for i, e in enumerate(entries) if e.get("is_savepoint")]
    if savepoints:
        ring = {"symbol": "diamond-open", "size": 16, "color": SAVEPOINT_COLOR}
        data.append(
            duration_points(savepoints)
            | dict(name="savepoint", mode="markers", hovertemplate=hover)
            | dict(marker=ring | {"line": {"width": 2, "color": SAVEPOINT_COLOR}})
        )
    data.append(
        {
            "type": "bar",
            "xaxis": "x2",
            "yaxis": "y2",
            "name": "checkpointed size",
            "showlegend": False,
            "x": times,
            "y": [int(e.get("checkpointed_size") or 0) / s_div for e in entries],
            "width": bar_width_ms([e["trigger_timestamp"] for e in entries]),
            "customdata": custom,
            "hovertemplate": hover,
            "marker": {
                "color": [status_color(e.get("status")) for e in entries],
                "line": {
                    "width": [2 if e.get("is_savepoint") else 0 for e in entries],
                    "color": [
                        SAVEPOINT_COLOR if e.get("is_savepoint") else NO_LINE for e in entries
                    ],
                },
            },
        }
    )
    restarts = restart_points(entries)
    dotted = {"color": AMBER, "dash": "dot", "width": 1.5}
    shapes = [
        dict(type="line", xref="x2", yref="paper", line=dotted)
        | dict(x0=fmt_time(at), x1=fmt_time(at), y0=0, y1=1)
        for at, _ in restarts
    ]
    span = entries[-1]["trigger_timestamp"] - entries[0]["trigger_timestamp"]
    notes = line_labels(  # "attempt 3" in a page-wide chart: about 5 % of its width
        [(at, f"attempt {attempt}") for at, attempt in restarts],
        span,
        xref="x2",
        color=AMBER,
        width_fraction=0.06,
    )
    return {
        "data": data,
        "layout": layout(
            height=460,
            margin={"l": 64, "r": 24, "t": LEGEND_MARGIN_TOP, "b": 48},
            legend=LEGEND,
            hovermode="closest",
            bargap=0,
            shapes=shapes,
            annotations=notes,
            xaxis={"type": "date", "anchor": "y", "matches": "x2", "showticklabels": False},
            xaxis2={"type": "date", "anchor": "y2", "title": {"text": "trigger time (UTC)"}},
            yaxis={
                "anchor": "x",
                "domain": [0.42, 1.0],
                "rangemode": "tozero",
                "title": {"text": f"end-to-end duration ({d_unit})"},
            },
            yaxis2={
                "anchor": "x2",
                "domain": [0.0, 0.36],
                "rangemode": "tozero",
                "title": {"text": f"checkpointed size ({s_unit})"},
            },
        ),
    }
