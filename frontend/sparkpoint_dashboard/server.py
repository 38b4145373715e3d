"""``sparkpoint dashboard``: serve the dashboard with waitress (a production WSGI server)."""

from __future__ import annotations

import gc
import logging
import sys

import waitress
from pydantic import ValidationError

from sparkpoint_dashboard.app import build_app
from sparkpoint_dashboard.settings import load_settings


def serve(host: str, port: int, api_url: str | None = None) -> int:
    """Run the dashboard until interrupted; returns the exit status."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = load_settings(api_url=api_url)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        print(f"sparkpoint dashboard: invalid setting: {problems}", file=sys.stderr)
        return 2
    app = build_app(settings)
    # Everything loaded so far (Dash, Plotly, the app) lives as long as the process: keep it out
    # of the collector's full passes, which otherwise stall a refresh now and then.
    gc.freeze()
    print(
        f"sparkpoint dashboard: http://{host}:{port} (control plane: {settings.api_url})",
        flush=True,
    )
    try:
        waitress.serve(app.server, host=host, port=port, threads=8, ident="sparkpoint-dashboard")
    except OSError as err:
        print(f"sparkpoint dashboard: cannot listen on {host}:{port}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
