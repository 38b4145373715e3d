"""The dashboard's addresses: which page a path shows, and the path of each page (for links)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from urllib.parse import quote, unquote


class Page(str, Enum):
    JOBS = "jobs"
    JOB = "job"
    CHECKPOINTS = "checkpoints"
    CHECKPOINT = "checkpoint"
    OPERATORS = "operators"
    AUDIT = "audit"
    SAVEPOINTS = "savepoints"
    NOT_FOUND = "not-found"


@dataclass(frozen=True)
class Route:
    """A parsed path: the page and its parameters."""

    page: Page
    job_id: str | None = None
    checkpoint_id: int | None = None
    problem: str | None = None  # why a path is NOT_FOUND


_PATTERNS = (
    (re.compile(r"^/?$"), Page.JOBS),
    (re.compile(r"^/jobs/?$"), Page.JOBS),
    (re.compile(r"^/audit/?$"), Page.AUDIT),
    (re.compile(r"^/savepoints/?$"), Page.SAVEPOINTS),
    (re.compile(r"^/jobs/(?P<job>[^/]+)/?$"), Page.JOB),
    (re.compile(r"^/jobs/(?P<job>[^/]+)/checkpoints/?$"), Page.CHECKPOINTS),
    (re.compile(r"^/jobs/(?P<job>[^/]+)/operators/?$"), Page.OPERATORS),
    (re.compile(r"^/jobs/(?P<job>[^/]+)/checkpoints/(?P<cp>[^/]+)/?$"), Page.CHECKPOINT),
)


def parse(pathname: str | None) -> Route:
    """The page for ``pathname``; an unknown path or a checkpoint id that is not a positive
    integer is a NOT_FOUND route that says why."""
    path = pathname or "/"
    for pattern, page in _PATTERNS:
        match = pattern.match(path)
        if match is None:
            continue
        groups = match.groupdict()
        job_id = unquote(groups["job"]) if groups.get("job") else None
        if page is not Page.CHECKPOINT:
            return Route(page, job_id)
        raw = unquote(groups["cp"])
        if not raw.isdigit() or int(raw) < 1:
            return Route(
                Page.NOT_FOUND, job_id, problem=f"{raw!r} is not a checkpoint id (1, 2, …)"
            )
        return Route(page, job_id, int(raw))
    return Route(Page.NOT_FOUND, problem=f"no page at {path}")


def jobs_path() -> str:
    return "/"


def audit_path() -> str:
    return "/audit"


def savepoints_path() -> str:
    return "/savepoints"


def job_path(job_id: str) -> str:
    return f"/jobs/{quote(job_id, safe='')}"


def checkpoints_path(job_id: str) -> str:
    return f"{job_path(job_id)}/checkpoints"


def checkpoint_path(job_id: str, checkpoint_id: int) -> str:
    return f"{checkpoints_path(job_id)}/{checkpoint_id}"


def operators_path(job_id: str) -> str:
    """The per-operator checkpoint timelines of a job."""
    return f"{job_path(job_id)}/operators"
