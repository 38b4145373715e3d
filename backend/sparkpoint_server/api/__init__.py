"""The REST API: one router per resource, Flink's paths and field names (DESIGN §3).

:func:`install_api` adds every router and the error handlers to the app that
``sparkpoint_server.app`` builds; the routes read ``app.state`` (see ``api/deps.py``).
"""

from __future__ import annotations

from fastapi import FastAPI

from sparkpoint_server.api import (
    checkpoints,
    health,
    jobs,
    metrics,
    operations,
    restart_strategy,
)
from sparkpoint_server.api.deps import ControlPlaneCommands
from sparkpoint_server.api.errors import install_error_handlers
from sparkpoint_server.storage.checkpoint_summary import CheckpointSummaries

__all__ = ["ControlPlaneCommands", "install_api"]


def install_api(app: FastAPI) -> None:
    """Add the REST API's routers and exception handlers to ``app``."""
    app.state.checkpoint_summaries = CheckpointSummaries()
    install_error_handlers(app)
    for module in (health, metrics, jobs, checkpoints, operations, restart_strategy):
        app.include_router(module.router)
