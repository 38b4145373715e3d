"""The head of every page of one job: where you are, the job's name and status, its end-to-end
guarantee, the tabs, and the actions that steer it."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.components import actions, guarantee
from sparkpoint_dashboard.components.widgets import badge, fetch
from sparkpoint_dashboard.routing import (
    Page,
    Route,
    checkpoint_path,
    checkpoints_path,
    job_path,
    operators_path,
)


def breadcrumbs(route: Route) -> list[tuple[str, str | None]]:
    """``[(text, href or None for the current page)]`` from the jobs list down to ``route``."""
    assert route.job_id is not None
    trail: list[tuple[str, str | None]] = [("Jobs", "/")]
    trail.append((route.job_id, job_path(route.job_id)))
    if route.page in (Page.CHECKPOINTS, Page.CHECKPOINT):
        trail.append(("Checkpoints", checkpoints_path(route.job_id)))
    if route.page is Page.CHECKPOINT and route.checkpoint_id is not None:
        trail.append(
            (f"#{route.checkpoint_id}", checkpoint_path(route.job_id, route.checkpoint_id))
        )
    if route.page is Page.OPERATORS:
        trail.append(("Operators", operators_path(route.job_id)))
    *above, (last_text, _) = trail
    return [*above, (last_text, None)]


def view(route: Route) -> html.Div:
    assert route.job_id is not None
    crumbs: list[Any] = []
    for text, href in breadcrumbs(route):
        if crumbs:
            crumbs.append(html.Span("/", className="crumb-sep"))
        crumbs.append(
            dcc.Link(text, href=href) if href else html.Span(text, className="crumb-here")
        )
    tab = "overview" if route.page is Page.JOB else "checkpoints"
    if route.page is Page.OPERATORS:
        tab = "operators"
    tabs = html.Nav(
        [
            dcc.Link(
                "Overview",
                href=job_path(route.job_id),
                className="tab active" if tab == "overview" else "tab",
            ),
            dcc.Link(
                "Checkpoints",
                href=checkpoints_path(route.job_id),
                className="tab active" if tab == "checkpoints" else "tab",
            ),
            dcc.Link(
                "Operators",
                href=operators_path(route.job_id),
                className="tab active" if tab == "operators" else "tab",
            ),
        ],
        className="tabs",
    )
    return html.Div(
        [
            html.Div(crumbs, className="crumbs"),
            html.Div(
                [
                    html.H1(route.job_id, id=ids.JOB_TITLE),
                    html.Span(id=ids.JOB_STATUS_BADGE),
                ],
                className="title-row",
            ),
            html.Div(id=ids.JOB_GUARANTEE, className="guarantee-row"),
            tabs,
            actions.panel(route),
        ],
        className="job-header",
    )


def title_view(job: dict[str, Any]) -> tuple[str, Any]:
    """The header's title (name and id) and status badge from ``GET /jobs/{id}``."""
    name = job.get("name") or job.get("jid")
    title = f"{name} ({job.get('jid')})" if name != job.get("jid") else str(name)
    attempt = job.get("attempt")
    label = f"{job.get('state')} · attempt {attempt}" if attempt is not None else None
    return title, badge(job.get("state"), label)


def register(app: Dash, client: ApiClient) -> None:
    @app.callback(
        Output(ids.JOB_TITLE, "children"),
        Output(ids.JOB_STATUS_BADGE, "children"),
        Output(ids.JOB_GUARANTEE, "children"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.ROUTE, "data"),
        State(ids.TOKEN_INPUT, "value"),
    )
    def _refresh(
        _n: int | None, route: dict[str, Any] | None, token: str | None
    ) -> tuple[Any, Any, Any]:
        if not route or not route.get("job_id"):
            return no_update, no_update, no_update
        answer, error = fetch(lambda: client.job(route["job_id"], token))
        if answer is None:
            return no_update, (badge("UNKNOWN", error) if error else no_update), no_update
        return (*title_view(answer), guarantee.view(answer.get("guarantee")))
