"""What an address that is no page shows: why, and the way back."""

from __future__ import annotations

from dash import dcc, html

from sparkpoint_dashboard.routing import Route


def layout(route: Route) -> html.Div:
    return html.Div(
        [
            html.H1("Page not found"),
            html.P(route.problem or "No such page."),
            html.P(
                [
                    "Pages: ",
                    html.Code("/"),
                    ", ",
                    html.Code("/jobs/<job id>"),
                    ", ",
                    html.Code("/jobs/<job id>/checkpoints"),
                    ", ",
                    html.Code("/jobs/<job id>/checkpoints/<checkpoint id>"),
                    ". ",
                    dcc.Link("All jobs", href="/"),
                ]
            ),
        ],
        className="card",
    )
