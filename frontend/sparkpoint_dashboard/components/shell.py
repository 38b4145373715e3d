"""The frame around every page: the header with navigation and the token field, the banner."""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.routing import audit_path, savepoints_path
from sparkpoint_dashboard.units import fmt_ms


def header(api_url: str) -> html.Header:
    return html.Header(
        [
            dcc.Link(
                [html.Span("◆", className="brand-mark"), " Sparkpoint"], href="/", className="brand"
            ),
            html.Nav(
                [
                    dcc.Link("Jobs", href="/", className="nav-link"),
                    dcc.Link("Savepoints", href=savepoints_path(), className="nav-link"),
                    dcc.Link("Audit", href=audit_path(), className="nav-link"),
                ],
                className="nav",
            ),
            html.Div(
                [
                    html.Span(
                        ["API ", html.A(api_url, href=f"{api_url}/docs", target="_blank")],
                        className="api-url",
                    ),
                    dcc.Input(
                        id=ids.TOKEN_INPUT,
                        type="password",
                        placeholder="API token (needed for actions)",
                        persistence=True,
                        persistence_type="session",
                        debounce=True,
                        className="token-input",
                        autoComplete="off",
                    ),
                    html.Span(id=ids.TOKEN_STATE, className="token-state"),
                ],
                className="header-right",
            ),
        ],
        className="app-header",
    )


#: From how far behind its events the control plane's ingest is shown in the banner.
BEHIND_WARNING_MS = 5_000
#: A warning (amber) rather than the unreachable API's error (red).
WARNING_STYLE = {
    "display": "block",
    "background": "#fffbeb",
    "color": "#92400e",
    "borderBottom": "1px solid #fde68a",
}


def banner_view(
    error: str | None,
    api_url: str,
    last_ok: str | None,
    behind_ms: int | None = None,
    *,
    answered: bool = False,
) -> tuple[Any, dict[str, str]]:
    """The banner's text and style: hidden while the API answers and its ingest keeps up
    (``behind_ms``: how far behind the events its jobs sent, from ``/healthz``). ``answered``:
    the server answered with an error (its database away): it runs, it cannot serve."""
    if error is None and behind_ms is not None and behind_ms >= BEHIND_WARNING_MS:
        return (
            [
                html.Strong(f"The control plane is {fmt_ms(behind_ms)} behind its jobs' events. "),
                "Checkpoints complete once it has read their acknowledgements; none expires "
                "for that (timeouts count from when the acknowledgements arrived). See "
                "sparkpoint_ingest_read_through_timestamp_seconds in /metrics.",
            ],
            WARNING_STYLE,
        )
    if error is None:
        return None, {"display": "none"}
    since = f" Showing what was last read at {last_ok} UTC." if last_ok else ""
    if answered:
        title, hint = "The control plane cannot serve. ", "Retrying."
    else:
        title = "The control plane is not reachable. "
        hint = f"Retrying; is `sparkpoint server` running at {api_url}?"
    return [html.Strong(title), f"{error}.{since} {hint}"], {"display": "block"}


def token_state(token: str | None) -> str:
    return "token set" if token and token.strip() else "no token: read-only"
