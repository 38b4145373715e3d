"""The job header's guarantee badge: label, colour and reason from ``GET /jobs/{id}``."""

from __future__ import annotations

from typing import Any

import pytest

from sparkpoint_dashboard.components import guarantee
from sparkpoint_dashboard.theme import AMBER, GREEN, GREY, RED


def parts(answer: dict[str, Any] | None) -> tuple[str, str, str, str | None]:
    """(label, colour, tooltip, the reason beside the badge) of the view of ``answer``."""
    badge, *beside = guarantee.view(answer)
    reason = beside[0].children if beside else None
    return badge.children, badge.style["backgroundColor"], badge.title, reason


@pytest.mark.parametrize(
    ("level", "label", "colour"),
    [
        ("at_least_once", "AT-LEAST-ONCE", AMBER),
        ("at_most_once", "AT-MOST-ONCE", RED),
        ("exactly_once", "EXACTLY-ONCE", GREEN),
    ],
)
def test_a_weaker_guarantee_shows_its_reason_beside_and_on_hover(
    level: str, label: str, colour: str
) -> None:
    got = parts({"level": level, "reason": "sink 'audit' writes at once"})

    assert got == (
        label,
        colour,
        "end-to-end guarantee: sink 'audit' writes at once",
        "sink 'audit' writes at once",
    )


def test_exactly_once_without_caveat_is_a_lone_green_badge() -> None:
    assert parts({"level": "exactly_once", "reason": None}) == (
        "EXACTLY-ONCE",
        GREEN,
        "end-to-end guarantee",
        None,
    )


def test_an_older_driver_that_reported_none_gets_a_grey_unknown_badge() -> None:
    assert parts(None) == (
        "GUARANTEE UNKNOWN",
        GREY,
        f"end-to-end guarantee: {guarantee.UNKNOWN}",
        guarantee.UNKNOWN,
    )


def test_a_level_from_a_newer_control_plane_is_shown_grey_as_it_is_named() -> None:
    assert parts({"level": "exactly_twice", "reason": None})[:2] == ("EXACTLY_TWICE", GREY)
