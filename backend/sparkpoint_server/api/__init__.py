"""The REST API: one router per resource, Flink's paths and field names (DESIGN §3).

:func:`install_api` adds every router and the error handlers to the app that
``sparkpoint_server.app`` builds; the routes read ``app.state`` (see ``api/deps.py``).
"""

from __future__ import annotations

from fastapi import FastAPI

from sparkpoint_server.api import (
    audit,
    checkpoints,
    health,
    job_keys,
    jobs,
    metrics,
    operations,
    operator_timelines,
    restart_strategy,
    savepoints,
    tokens,
)
from sparkpoint_server.api.audit_trail import AuditTrail
from sparkpoint_server.api.deps import ControlPlaneCommands
from sparkpoint_server.api.errors import install_error_handlers
from sparkpoint_server.api.openapi import install_openapi
from sparkpoint_server.storage.checkpoint_summary import CheckpointSummaries

__all__ = ["ControlPlaneCommands", "install_api"]


def install_api(app: FastAPI) -> None:
    """Add the REST API's routers, exception handlers, audit trail and OpenAPI document to
    ``app``."""
    app.state.checkpoint_summaries = CheckpointSummaries()
    install_error_handlers(app)
    routers = (
        health,
        metrics,
        jobs,
        job_keys,
        operator_timelines,  # before checkpoints: /checkpoints/{request_id}
        checkpoints,
        operations,
        restart_strategy,
        savepoints,
    )
    for module in (*routers, tokens, audit):
        app.include_router(module.router)
    app.add_middleware(AuditTrail)
    install_openapi(app)
