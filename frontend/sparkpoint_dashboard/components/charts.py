"""The checkpoint charts: a job's checkpoint history (duration and size over time) and one
checkpoint's per-subtask timeline, as pure functions from API answers to Plotly figures.

The figures are plain dicts in Plotly's JSON form (``{"data": [...], "layout": {...}}``, what
``dcc.Graph`` receives anyway): building a ``go.Figure`` validates every value and deep-copies
the template, which takes seconds on a busy two-core machine, longer than a refresh.
"""

from __future__ import annotations

import functools
import itertools
import statistics
from dataclasses import dataclass
from typing import Any

import plotly.io as pio

from sparkpoint_dashboard.theme import (
    AMBER,
    CHECKPOINT_STATUS_COLORS,
    GREY,
    PHASE_COLORS,
    SAVEPOINT_COLOR,
    STRAGGLER_COLOR,
    chart_layout,
    status_color,
)
from sparkpoint_dashboard.units import fmt_bytes, fmt_ms, fmt_time, size_unit

Figure = dict[str, Any]  # a Plotly figure in its JSON form

LARGE_DURATION_MS = 10_000.0  # from this longest duration on, a duration axis reads in seconds
STRAGGLER_FACTOR = 1.5  # slower than 1.5 x the median of its operator ...
STRAGGLER_MIN_EXTRA_MS = 5.0  # ... and by more than this: a straggler
PENDING_COLOR = "#fecaca"
ACK_COLOR = "#111827"
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
    it ran until its latest acknowledgement (or None)."""
    duration = entry.get("end_to_end_duration")
    if duration is not None:
        return float(duration)
    trigger = entry.get("trigger_timestamp")
    if trigger is None:
        return None
    if entry.get("status") == "IN_PROGRESS" and now_ms is not None:
        return float(max(0, now_ms - trigger))
    ack = entry.get("latest_ack_timestamp")
    return float(max(0, ack - trigger)) if ack is not None else None


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
    restarts = [(fmt_time(trigger), attempt) for trigger, attempt in restart_points(entries)]
    dotted = {"color": AMBER, "dash": "dot", "width": 1.5}
    shapes = [
        dict(type="line", xref="x2", yref="paper", x0=at, x1=at, y0=0, y1=1, line=dotted)
        for at, _ in restarts
    ]
    notes = [
        dict(x=at, xref="x2", y=1.0, yref="paper", yanchor="bottom", xanchor="left")
        | dict(showarrow=False, text=f"attempt {attempt}", font={"color": AMBER})
        for at, attempt in restarts
    ]
    return {
        "data": data,
        "layout": layout(
            height=460,
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


# ----------------------------------------------------------------------------- one checkpoint


@dataclass(frozen=True)
class Straggler:
    """A subtask much slower than the others of its operator."""

    operator_id: str
    label: str
    end_to_end_ms: float
    median_ms: float

    @property
    def extra_ms(self) -> float:
        return self.end_to_end_ms - self.median_ms

    @property
    def factor(self) -> float:
        return self.end_to_end_ms / self.median_ms if self.median_ms > 0 else float("inf")

    def describe(self) -> str:
        """``"pv -> sink #1: 912 ms, +400 ms (1.8 times the operator's median of 512 ms)"``."""
        factor = f"{self.factor:.1f} times" if self.median_ms > 0 else "far above"
        return (
            f"{self.label}: {fmt_ms(self.end_to_end_ms)}, +{fmt_ms(self.extra_ms)} "
            f"({factor} the operator's median of {fmt_ms(self.median_ms)})"
        )


@dataclass(frozen=True)
class SubtaskPhases:
    """One subtask's row of the timeline: its phases in ms since the trigger."""

    label: str
    operator_id: str
    index: int
    acknowledged: bool
    start_delay: float
    alignment: float
    sync: float
    async_: float
    end_to_end: float | None
    declined_reason: str | None
    clock_flagged: bool

    def phases(self) -> dict[str, tuple[float, float]]:
        """``{phase: (start, length)}`` in the order of ``PHASE_COLORS``."""
        out: dict[str, tuple[float, float]] = {}
        start = 0.0
        for name, length in zip(
            PHASE_COLORS, (self.start_delay, self.alignment, self.sync, self.async_), strict=True
        ):
            out[name] = (start, length)
            start += length
        return out


def _labels(operators: list[dict[str, Any]]) -> dict[str, str]:
    """Operator id -> the name its rows are labelled with (the id added when names repeat)."""
    names = [str(op.get("name") or op["id"]) for op in operators]
    return {
        str(op["id"]): name if names.count(name) == 1 else f"{name} ({op['id']})"
        for op, name in zip(operators, names, strict=True)
    }


def subtask_phases(operators: list[dict[str, Any]]) -> list[SubtaskPhases]:
    """Every subtask of every operator, in the order given, from the answers of
    ``GET .../checkpoints/details/{n}/subtasks/{operator}``."""
    labels = _labels(operators)
    rows: list[SubtaskPhases] = []
    for op in operators:
        for sub in op.get("subtasks") or []:
            checkpoint = sub.get("checkpoint") or {}
            alignment = sub.get("alignment") or {}
            rows.append(
                SubtaskPhases(
                    label=f"{labels[str(op['id'])]} #{sub['index']}",
                    operator_id=str(op["id"]),
                    index=int(sub["index"]),
                    acknowledged=sub.get("status") == "completed",
                    start_delay=float(sub.get("start_delay") or 0.0),
                    alignment=float(alignment.get("duration") or 0.0),
                    sync=float(checkpoint.get("sync") or 0.0),
                    async_=float(checkpoint.get("async") or 0.0),
                    end_to_end=sub.get("end_to_end_duration"),
                    declined_reason=sub.get("declined_reason"),
                    clock_flagged=bool(sub.get("clock_flagged")),
                )
            )
    return rows


def find_stragglers(rows: list[SubtaskPhases]) -> list[Straggler]:
    """Subtasks whose end-to-end duration is more than ``STRAGGLER_FACTOR`` times the median of
    their operator's acknowledged subtasks and more than ``STRAGGLER_MIN_EXTRA_MS`` above it
    (only for operators with at least two acknowledged subtasks), slowest first."""
    by_operator: dict[str, list[SubtaskPhases]] = {}
    for row in rows:
        if row.acknowledged and row.end_to_end is not None:
            by_operator.setdefault(row.operator_id, []).append(row)
    found: list[Straggler] = []
    for operator_id, subs in by_operator.items():
        if len(subs) < 2:
            continue
        median = statistics.median(float(s.end_to_end or 0.0) for s in subs)
        for s in subs:
            e2e = float(s.end_to_end or 0.0)
            if e2e > STRAGGLER_FACTOR * median and e2e - median > STRAGGLER_MIN_EXTRA_MS:
                found.append(Straggler(operator_id, s.label, e2e, median))
    return sorted(found, key=lambda s: -s.extra_ms)


def timeline_figure(
    operators: list[dict[str, Any]], span_ms: float | None = None, note: str | None = None
) -> Figure:
    """A Gantt of one checkpoint: a row per subtask of every operator, bars for start delay →
    alignment → synchronous → asynchronous on an axis of ms since the trigger, a tick where the
    subtask acknowledged, unacknowledged subtasks hatched, stragglers outlined in red.

    Args:
        operators: the subtasks answers of every operator of the checkpoint, in graph order.
        span_ms: how far unacknowledged rows reach (the checkpoint's duration so far); by
            default the latest acknowledgement.
        note: a remark shown in red above the plot, right (that the checkpoint failed).
    """
    rows = subtask_phases(operators)
    if not rows:
        return empty_figure("No subtasks reported for this checkpoint")
    stragglers = {s.label: s for s in find_stragglers(rows)}
    acked = [r for r in rows if r.acknowledged]
    pending = [r for r in rows if not r.acknowledged]
    data: list[dict[str, Any]] = []
    for phase, color in PHASE_COLORS.items():
        spans = [r.phases()[phase] for r in acked]
        late = [r.label in stragglers for r in acked]
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": phase,
                "y": [r.label for r in acked],
                "base": [start for start, _ in spans],
                "x": [length for _, length in spans],
                "marker": {
                    "color": color,
                    "line": {
                        "color": [STRAGGLER_COLOR if s else color for s in late],
                        "width": [2 if s else 0 for s in late],
                    },
                },
                "customdata": [[fmt_ms(n), fmt_ms(b), fmt_ms(b + n)] for b, n in spans],
                "hovertemplate": f"%{{y}}<br><b>{phase}</b> %{{customdata[0]}}"
                "<br>from %{customdata[1]} to %{customdata[2]} after the trigger<extra></extra>",
            }
        )
    if acked:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "acknowledged",
                "y": [r.label for r in acked],
                "x": [r.end_to_end for r in acked],
                "marker": {
                    "symbol": "line-ns-open",
                    "size": 16,
                    "color": ACK_COLOR,
                    "line": {"width": 2},
                },
                "customdata": [
                    [
                        fmt_ms(r.end_to_end),
                        " · clock adjusted (negative time clamped)" if r.clock_flagged else "",
                    ]
                    for r in acked
                ],
                "hovertemplate": "%{y}<br>acknowledged after %{customdata[0]}%{customdata[1]}"
                "<extra></extra>",
            }
        )
    if pending:
        reach = span_ms or max((r.end_to_end or 0.0 for r in acked), default=0.0) or 1.0
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": "not acknowledged",
                "y": [r.label for r in pending],
                "base": [0.0] * len(pending),
                "x": [reach] * len(pending),
                "marker": {
                    "color": PENDING_COLOR,
                    "pattern": {"shape": "/", "fgcolor": STRAGGLER_COLOR},
                },
                "customdata": [
                    [
                        f"declined: {r.declined_reason}"
                        if r.declined_reason
                        else "not acknowledged (pending or failed)"
                    ]
                    for r in pending
                ],
                "hovertemplate": "%{y}<br>%{customdata[0]}<extra></extra>",
            }
        )
    labels = [r.label for r in rows]
    ticktext = [
        f"<span style='color:{STRAGGLER_COLOR}'><b>{label} ⚑</b></span>"
        if label in stragglers
        else label
        for label in labels
    ]
    notes = [
        {
            "x": s.end_to_end_ms,
            "y": s.label,
            "text": f" straggler +{fmt_ms(s.extra_ms)}",
            "showarrow": False,
            "xanchor": "left",
            "font": {"color": STRAGGLER_COLOR},
        }
        for s in stragglers.values()
    ]
    if note:
        notes.append(
            {
                "text": note,
                "x": 1.0,
                "y": 1.0,
                "xref": "paper",
                "yref": "paper",
                "xanchor": "right",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"color": STRAGGLER_COLOR},
            }
        )
    return {
        "data": data,
        "layout": layout(
            height=max(340, 110 + 30 * len(rows)),
            barmode="overlay",
            bargap=0.35,
            hovermode="closest",
            margin={"l": 150, "r": 110, "t": 40, "b": 48},
            annotations=notes,
            xaxis={"title": {"text": "time since the trigger (ms)"}, "rangemode": "tozero"},
            yaxis={
                "type": "category",
                "categoryorder": "array",
                "categoryarray": labels,
                "tickvals": labels,
                "ticktext": ticktext,
                "autorange": "reversed",
            },
        ),
    }
