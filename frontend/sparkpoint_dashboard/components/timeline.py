"""One checkpoint's per-subtask timeline (start delay → alignment → synchronous → asynchronous)
and its stragglers, as pure functions from the API's subtask answers to a Plotly figure (a dict,
as in :mod:`sparkpoint_dashboard.components.charts`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from sparkpoint_dashboard.components.charts import Figure, empty_figure, layout
from sparkpoint_dashboard.theme import PHASE_COLORS, STRAGGLER_COLOR
from sparkpoint_dashboard.units import fmt_ms

STRAGGLER_FACTOR = 1.5  # slower than 1.5 x the median of its operator ...
STRAGGLER_MIN_EXTRA_MS = 5.0  # ... and by more than this: a straggler
PENDING_COLOR = "#fecaca"
ACK_COLOR = "#111827"


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
