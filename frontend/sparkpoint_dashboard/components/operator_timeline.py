"""Per-operator checkpoint timelines across checkpoints: which operator holds checkpoints up.

Pure functions from ``GET /jobs/{id}/checkpoints/operators`` to Plotly figures (dicts, as in
:mod:`sparkpoint_dashboard.components.charts`): :func:`metrics_figure`, one line per operator
for each of end-to-end, synchronous, asynchronous and alignment duration over the checkpoints;
:func:`heat_strip_figure`, operators as rows and checkpoints as columns, coloured by the
operator's end-to-end duration or its share of the checkpoint's; and :func:`holdup_counts`,
how often each operator was the last to acknowledge.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sparkpoint_dashboard.components.charts import Figure, duration_unit, empty_figure, layout
from sparkpoint_dashboard.routing import checkpoint_path
from sparkpoint_dashboard.units import DASH, fmt_bytes, fmt_ms, fmt_time

# (field of an operator's checkpoint entry, the title of its row of charts)
METRICS = (
    ("end_to_end_duration", "End-to-end"),
    ("sync_duration", "Synchronous part"),
    ("async_duration", "Asynchronous part"),
    ("alignment_duration", "Alignment"),
)
# One colour per operator, in the graph's order (Plotly's qualitative "D3", colour-blind safe
# enough for the handful of operators a job has; it repeats after ten).
OPERATOR_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
COLOUR_BY_END_TO_END = "end_to_end"
COLOUR_BY_SHARE = "share"
# Light (quick) to dark red (the operator the checkpoint waited for); a blank cell is grey.
HEAT_SCALE = [[0.0, "#fef3c7"], [0.5, "#f97316"], [1.0, "#991b1b"]]
NO_ACK_COLOR = "#e5e7eb"
ROW_HEIGHT_PX = 30
GAP = 0.06  # between the rows of the metrics figure, as a share of its height


def operator_color(index: int) -> str:
    return OPERATOR_COLORS[index % len(OPERATOR_COLORS)]


def checkpoint_duration(answer: dict[str, Any], column: int) -> float | None:
    """The duration the shares of checkpoint ``column`` are taken of: the checkpoint's own
    end-to-end duration, else (in progress, failed) the slowest operator's so far."""
    own = answer["checkpoints"][column].get("end_to_end_duration")
    slowest = max(
        (
            e2e
            for op in answer["operators"]
            if (e2e := op["checkpoints"][column].get("end_to_end_duration")) is not None
        ),
        default=None,
    )
    if own is not None and (slowest is None or own >= slowest):
        return float(own)
    return slowest


def share(value: float | None, of: float | None) -> float | None:
    """``value / of`` within [0, 1]; None without both (or when ``of`` is 0)."""
    if value is None or of is None:
        return None
    if of <= 0:
        return 1.0 if value <= 0 else None
    return min(max(value / of, 0.0), 1.0)


def holdup_counts(answer: dict[str, Any]) -> list[tuple[str, int]]:
    """``(operator name, how many checkpoints it was the last to acknowledge)``, most first,
    over the checkpoints where at least one operator acknowledged (ties: the graph's order)."""
    counts: Counter[int] = Counter()
    for column in range(len(answer.get("checkpoints") or [])):
        durations = [
            (e2e, -row)
            for row, op in enumerate(answer["operators"])
            if (e2e := op["checkpoints"][column].get("end_to_end_duration")) is not None
        ]
        if durations:
            counts[-max(durations)[1]] += 1
    labels = operator_labels(answer.get("operators") or [])
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [(labels[row], n) for row, n in ranked]


def operator_labels(operators: list[dict[str, Any]]) -> list[str]:
    """Each operator's name, with its id where two operators share a name (a chart's rows and
    legend entries must differ)."""
    names = [str(op.get("name") or op["id"]) for op in operators]
    return [
        f"{name} [{op['id']}]" if names.count(name) > 1 else name
        for name, op in zip(names, operators, strict=True)
    ]


def _columns(answer: dict[str, Any]) -> list[str]:
    """The x categories: ``"#12"`` per checkpoint (every column as wide as the others)."""
    return [f"#{c['id']}" for c in answer["checkpoints"]]


def metrics_figure(answer: dict[str, Any]) -> Figure:
    """One row of charts per metric (:data:`METRICS`), one line per operator over the
    checkpoints; clicking an operator in the legend hides it in every row."""
    checkpoints = answer.get("checkpoints") or []
    operators = answer.get("operators") or []
    if not checkpoints or not operators:
        return empty_figure("No checkpoints yet")
    values = [e.get(field) for op in operators for e in op["checkpoints"] for field, _ in METRICS]
    unit, divisor = duration_unit(max((v for v in values if v is not None), default=None))
    x = _columns(answer)
    labels = operator_labels(operators)
    rows = len(METRICS)
    height = (1 - GAP * (rows - 1)) / rows
    data: list[dict[str, Any]] = []
    axes: dict[str, Any] = {}
    notes: list[dict[str, Any]] = []
    for r, (field, title) in enumerate(METRICS):
        n = "" if r == 0 else str(r + 1)
        top = 1 - r * (height + GAP)
        axes[f"xaxis{n}"] = {
            "type": "category",
            "anchor": f"y{n}",
            "showticklabels": r == rows - 1,
            **({"matches": "x"} if r else {}),
            **({"title": {"text": "checkpoint"}} if r == rows - 1 else {}),
        }
        axes[f"yaxis{n}"] = {
            "anchor": f"x{n}",
            "domain": [max(top - height, 0.0), top],
            "rangemode": "tozero",
            "title": {"text": unit},
        }
        notes.append(
            dict(text=f"<b>{title}</b>", x=0, xref="paper", xanchor="left", showarrow=False)
            | dict(y=top, yref="paper", yanchor="bottom", font={"size": 12})
        )
        for i, op in enumerate(operators):
            entries = op["checkpoints"]
            label = labels[i]
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "xaxis": f"x{n}",
                    "yaxis": f"y{n}",
                    "name": label,
                    "legendgroup": op["id"],
                    "showlegend": r == 0,
                    "x": x,
                    "y": [None if e.get(field) is None else e[field] / divisor for e in entries],
                    "customdata": [[fmt_ms(e.get(field)), e.get("status")] for e in entries],
                    "hovertemplate": f"<b>%{{fullData.name}}</b> · checkpoint %{{x}}<br>"
                    f"{title}: %{{customdata[0]}} (%{{customdata[1]}})<extra></extra>",
                    "line": {"color": operator_color(i), "width": 1.5},
                    "marker": {"color": operator_color(i), "size": 5},
                    "connectgaps": False,
                }
            )
    return {
        "data": data,
        "layout": layout(
            height=170 * rows + 60,
            hovermode="closest",
            annotations=notes,
            margin={"l": 64, "r": 24, "t": 72, "b": 48},
            legend={"orientation": "h", "y": 1.06, "yanchor": "bottom", "x": 0},
            **axes,
        ),
    }


@dataclass(frozen=True)
class HeatCell:
    """One cell of the heat strip: an operator's part of one checkpoint."""

    value: float | None  # the colour: end-to-end ms (in the axis unit) or share in [0, 1]
    hover: list[str]  # what the hover shows, in :data:`HOVER`'s order
    href: str  # the checkpoint's page (its per-subtask timeline)


HOVER = (
    "<b>%{customdata[0]}</b> · checkpoint %{customdata[1]} (%{customdata[2]})<br>"
    "end-to-end %{customdata[3]}, %{customdata[4]} of the checkpoint's %{customdata[5]}<br>"
    "sync %{customdata[6]} · async %{customdata[7]} · alignment %{customdata[8]} · "
    "start delay %{customdata[9]}<br>"
    "acknowledged %{customdata[10]} · slowest subtask %{customdata[11]}<br>"
    "state %{customdata[12]} · triggered %{customdata[13]} UTC<br>"
    "<i>click for its per-subtask timeline</i><extra></extra>"
)


def heat_cells(
    answer: dict[str, Any], job_id: str, colour_by: str = COLOUR_BY_END_TO_END
) -> list[list[HeatCell]]:
    """The heat strip's cells, one row per operator and one column per checkpoint."""
    _, divisor = _heat_unit(answer)
    totals = [checkpoint_duration(answer, c) for c in range(len(answer["checkpoints"]))]
    labels = operator_labels(answer["operators"])
    rows = []
    for op, label in zip(answer["operators"], labels, strict=True):
        row = []
        for column, entry in enumerate(op["checkpoints"]):
            e2e = entry.get("end_to_end_duration")
            part = share(e2e, totals[column])
            ms = None if e2e is None else e2e / divisor
            value = part if colour_by == COLOUR_BY_SHARE else ms
            slowest = entry.get("slowest_subtask")
            hover = [
                label,
                f"#{entry['id']}",
                str(entry.get("status")),
                fmt_ms(e2e),
                DASH if part is None else f"{part:.0%}",
                fmt_ms(totals[column]),
                fmt_ms(entry.get("sync_duration")),
                fmt_ms(entry.get("async_duration")),
                fmt_ms(entry.get("alignment_duration")),
                fmt_ms(entry.get("start_delay")),
                f"{entry.get('num_acknowledged_subtasks')}/{entry.get('num_subtasks')}",
                (
                    f"#{slowest['index']} ({fmt_ms(slowest['end_to_end_duration'])})"
                    if slowest
                    else DASH
                ),
                fmt_bytes(entry.get("state_size")),
                fmt_time(entry.get("trigger_timestamp")),
            ]
            row.append(HeatCell(value, hover, checkpoint_path(job_id, int(entry["id"]))))
        rows.append(row)
    return rows


def _heat_unit(answer: dict[str, Any]) -> tuple[str, float]:
    durations = [
        e["end_to_end_duration"]
        for op in answer.get("operators") or []
        for e in op["checkpoints"]
        if e.get("end_to_end_duration") is not None
    ]
    return duration_unit(max(durations, default=None))


def heat_strip_figure(
    answer: dict[str, Any], job_id: str, colour_by: str = COLOUR_BY_END_TO_END
) -> Figure:
    """Operators (rows, the graph's order from the top) by checkpoints (columns, oldest on the
    left), coloured by the operator's end-to-end duration or by its share of the checkpoint's
    (``colour_by``); a blank cell: the operator has not acknowledged (failed, or in progress).
    Each cell's ``customdata`` ends with its checkpoint's page; a click opens it
    (:func:`clicked_checkpoint`)."""
    checkpoints = answer.get("checkpoints") or []
    operators = answer.get("operators") or []
    if not checkpoints or not operators:
        return empty_figure("No checkpoints yet")
    cells = heat_cells(answer, job_id, colour_by)
    unit, _ = _heat_unit(answer)
    by_share = colour_by == COLOUR_BY_SHARE
    colorbar_title = "share of the checkpoint" if by_share else f"end-to-end ({unit})"
    heatmap = {
        "type": "heatmap",
        "x": _columns(answer),
        "y": operator_labels(operators),
        "z": [[cell.value for cell in row] for row in cells],
        "customdata": [[[*cell.hover, cell.href] for cell in row] for row in cells],
        "hovertemplate": HOVER,
        "hoverongaps": False,
        "colorscale": HEAT_SCALE,
        "zmin": 0,
        **({"zmax": 1} if by_share else {}),
        "xgap": 1,
        "ygap": 1,
        "colorbar": {
            "title": {"text": colorbar_title, "side": "right"},
            "thickness": 12,
            **({"tickformat": ".0%"} if by_share else {}),
        },
    }
    return {
        "data": [heatmap],
        "layout": layout(
            height=ROW_HEIGHT_PX * len(operators) + 110,
            margin={"l": 24, "r": 24, "t": 16, "b": 56},
            xaxis={"type": "category", "title": {"text": "checkpoint"}, "showgrid": False},
            yaxis={
                "type": "category",
                "autorange": "reversed",
                "automargin": True,
                "showgrid": False,
            },
            plot_bgcolor=NO_ACK_COLOR,  # a blank cell reads as "no acknowledgement"
        ),
    }


def clicked_checkpoint(click_data: dict[str, Any] | None, job_id: str | None) -> str | None:
    """The checkpoint page of the heat strip's clicked cell, from its column (``"#12"``).

    ``dcc.Graph`` drops a heatmap point's ``customdata`` (its index is a pair, not a number),
    so the column is what a click tells."""
    points = (click_data or {}).get("points") or []
    if not points or not job_id:
        return None
    column = points[0].get("x")
    if not isinstance(column, str) or not column.startswith("#") or not column[1:].isdigit():
        return None
    return checkpoint_path(job_id, int(column[1:]))
