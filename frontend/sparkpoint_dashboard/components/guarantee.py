"""The badge of a job's end-to-end guarantee (EXACTLY-ONCE, AT-LEAST-ONCE, AT-MOST-ONCE) with
the reason its driver gave when the guarantee is weaker, as ``GET /jobs/{id}`` reports them."""

from __future__ import annotations

from typing import Any

from dash import html

from sparkpoint_dashboard.theme import AMBER, GREEN, GREY, RED

# Level -> (label, colour), from the strongest to the weakest.
LEVELS = {
    "exactly_once": ("EXACTLY-ONCE", GREEN),
    "at_least_once": ("AT-LEAST-ONCE", AMBER),
    "at_most_once": ("AT-MOST-ONCE", RED),
}
UNKNOWN = "the job's driver did not report its end-to-end guarantee (an older driver)"


def view(guarantee: dict[str, Any] | None) -> list[Any]:
    """The badge and, beside it, the reason (also the badge's tooltip); a grey badge when the
    guarantee is unknown or a level this dashboard does not know."""
    level = (guarantee or {}).get("level")
    reason = (guarantee or {}).get("reason")
    label, color = LEVELS.get(str(level), (None, GREY))
    if label is None:
        label = "GUARANTEE UNKNOWN" if guarantee is None else str(level).upper()
        reason = reason or (UNKNOWN if guarantee is None else None)
    badge = html.Span(
        label,
        className="badge",
        style={"backgroundColor": color},
        title=f"end-to-end guarantee: {reason}" if reason else "end-to-end guarantee",
        **{"data-level": str(level or "unknown")},  # type: ignore[arg-type]
    )
    return [badge, html.Span(reason, className="guarantee-reason")] if reason else [badge]
