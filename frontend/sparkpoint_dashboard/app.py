"""The dashboard's Dash app: the shell, the router, and every page's callbacks.

:func:`build_app` wires it; each page module holds its layout, its plain functions (tested
without Dash) and thin callbacks that call them. The app talks only to the REST API.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dash import Dash, Input, Output, dcc, html

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient, ApiRequestError, ApiUnreachableError
from sparkpoint_dashboard.components import actions, config_forms, job_header, shell
from sparkpoint_dashboard.pages import (
    audit,
    checkpoint,
    checkpoints,
    job,
    jobs,
    not_found,
    operators,
    savepoints,
)
from sparkpoint_dashboard.routing import Page, parse
from sparkpoint_dashboard.settings import DashboardSettings, load_settings
from sparkpoint_dashboard.spark_ui import SparkUi
from sparkpoint_dashboard.units import fmt_time

ASSETS = Path(__file__).parent / "assets"


def render_page(pathname: str | None) -> Any:
    """The layout of the page at ``pathname``."""
    route = parse(pathname)
    if route.page is Page.JOBS:
        return jobs.layout(route)
    if route.page is Page.JOB:
        return job.layout(route)
    if route.page is Page.CHECKPOINTS:
        return checkpoints.layout(route)
    if route.page is Page.CHECKPOINT:
        return checkpoint.layout(route)
    if route.page is Page.OPERATORS:
        return operators.layout(route)
    if route.page is Page.AUDIT:
        return audit.layout(route)
    if route.page is Page.SAVEPOINTS:
        return savepoints.layout(route)
    return not_found.layout(route)


def page_title(pathname: str | None) -> str:
    """The browser tab's title for ``pathname``."""
    route = parse(pathname)
    if route.page is Page.JOBS:
        return "Jobs · Sparkpoint"
    if route.page is Page.JOB:
        return f"Job {route.job_id} · Sparkpoint"
    if route.page is Page.CHECKPOINTS:
        return f"Checkpoints of {route.job_id} · Sparkpoint"
    if route.page is Page.CHECKPOINT:
        return f"Checkpoint {route.checkpoint_id} of {route.job_id} · Sparkpoint"
    if route.page is Page.OPERATORS:
        return f"Operators of {route.job_id} · Sparkpoint"
    if route.page is Page.AUDIT:
        return "Audit log · Sparkpoint"
    if route.page is Page.SAVEPOINTS:
        return "Savepoints · Sparkpoint"
    return "Not found · Sparkpoint"


def build_app(settings: DashboardSettings | None = None, client: ApiClient | None = None) -> Dash:
    """The dashboard for the control plane at ``settings.api_url``."""
    settings = settings or load_settings()
    client = client or ApiClient(settings.api_url, settings.dashboard_api_timeout_s)
    app = Dash(
        __name__,
        title="Sparkpoint",
        update_title=None,  # type: ignore[arg-type]  # documented: no "Updating..." title
        assets_folder=str(ASSETS),
        suppress_callback_exceptions=True,  # pages come and go; their ids are not always there
    )
    app.layout = html.Div(
        [
            dcc.Location(id=ids.URL, refresh="callback-nav"),
            dcc.Interval(id=ids.REFRESH, interval=settings.dashboard_refresh_ms),
            dcc.Store(id=ids.OPERATIONS, storage_type="session", data=[]),
            dcc.Store(id=ids.TITLE),
            html.Span(id=ids.TITLE_SINK, hidden=True),
            shell.header(settings.api_url),
            html.Div(id=ids.BANNER, className="banner", role="alert", style={"display": "none"}),
            html.Main(id=ids.PAGE, className="page"),
            html.Footer(
                ["Last refreshed ", html.Span(id=ids.LAST_UPDATED), " UTC"],
                className="app-footer",
            ),
        ],
        className="app",
    )
    app.server.config["SPARKPOINT_API_URL"] = settings.api_url
    last_ok: dict[str, str | None] = {"at": None}

    @app.callback(Output(ids.PAGE, "children"), Input(ids.URL, "pathname"))
    def _route(pathname: str | None) -> Any:
        return render_page(pathname)

    @app.callback(Output(ids.TITLE, "data"), Input(ids.URL, "pathname"))
    def _title(pathname: str | None) -> str:
        return page_title(pathname)

    app.clientside_callback(
        "function(title) { document.title = title; return ''; }",
        Output(ids.TITLE_SINK, "children"),
        Input(ids.TITLE, "data"),
    )

    @app.callback(
        Output(ids.BANNER, "children"),
        Output(ids.BANNER, "style"),
        Output(ids.LAST_UPDATED, "children"),
        Input(ids.REFRESH, "n_intervals"),
    )
    def _health(_n: int | None) -> tuple[Any, dict[str, str], str]:
        error: str | None = None
        behind_ms: int | None = None
        answered = False
        try:
            health = client.health()
            last_ok["at"] = fmt_time(int(time.time() * 1000))
            behind_ms = ((health or {}).get("ingest") or {}).get("behind-ms")
        except ApiUnreachableError as err:
            error = str(err)
        except ApiRequestError as err:
            error, answered = f"the control plane answered {err}", True
        children, style = shell.banner_view(
            error, settings.api_url, last_ok["at"], behind_ms, answered=answered
        )
        return children, style, last_ok["at"] or "never"

    @app.callback(Output(ids.TOKEN_STATE, "children"), Input(ids.TOKEN_INPUT, "value"))
    def _token(token: str | None) -> str:
        return shell.token_state(token)

    for module in (jobs, job, checkpoints, job_header, actions, config_forms, audit):
        module.register(app, client)
    checkpoint.register(app, client, SparkUi(allowed_hosts=settings.spark_ui_hosts))
    operators.register(app, client)
    savepoints.register(app, client)
    return app
