"""The checkpoint page's links to the Spark UI pages of the Spark jobs that ran its epoch."""

from __future__ import annotations

from typing import Any

from dash import html

from sparkpoint_dashboard.spark_ui import SparkJob, job_page_url

HOSTS_SETTING = "SPARKPOINT_DASHBOARD_SPARK_UI_HOSTS"


def spark_link_view(
    cp: dict[str, Any],
    spark: dict[str, Any] | None,
    jobs: list[SparkJob] | None,
    *,
    allowed: bool = True,
) -> list[Any]:
    """Links to the Spark UI's pages of the Spark jobs that ran the checkpoint's epoch.

    Args:
        cp: the checkpoint (its ``epoch`` and ``spark-job-group``).
        spark: ``GET /jobs/{id}``'s ``spark`` (``ui-url``, ``application-id``), if known.
        jobs: the Spark jobs of the group, or None when the Spark UI could not be asked.
        allowed: whether the dashboard may ask that Spark UI (its host is allowed); links
            to it are shown only then.
    """
    group = cp.get("spark-job-group")
    if not group:
        if cp.get("status") == "FAILED":
            return ["Spark: no epoch carried this checkpoint's barrier before it failed."]
        return ["Spark: no epoch has carried this checkpoint's barrier yet."]
    head: list[Any] = [f"Spark job group of epoch {cp.get('epoch')}: ", html.Code(group), " · "]
    ui = (spark or {}).get("ui-url")
    if not ui or not (spark or {}).get("application-id"):
        return [*head, html.Span("Spark UI address unknown", className="legend-note")]
    if not allowed:
        note = f"Spark UI at {ui} not asked: its host is not loopback nor in {HOSTS_SETTING}"
        return [*head, html.Span(note, className="legend-note")]
    if jobs is None:
        return [
            *head,
            html.Span(
                "Spark UI not reachable (it lives in the job's driver, which "
                "is gone once the job finished)",
                className="legend-note",
            ),
        ]
    if not jobs:
        return [
            *head,
            html.Span("no Spark job of this group is left in the ", className="legend-note"),
            html.A("Spark UI", href=f"{ui.rstrip('/')}/jobs/", target="_blank"),
            html.Span(" (it keeps only the most recent jobs)", className="legend-note"),
        ]
    links: list[Any] = []
    for job in jobs:
        if links:
            links.append(", ")
        links.append(
            html.A(
                f"Spark job {job.job_id} ({job.status})",
                href=job_page_url(ui, job.job_id),
                target="_blank",
            )
        )
    return [*head, *links]
