"""Routing: every page has an address that can be shared, and back."""

from __future__ import annotations

import pytest

from sparkpoint_dashboard.routing import (
    Page,
    Route,
    checkpoint_path,
    checkpoints_path,
    job_path,
    parse,
)


@pytest.mark.parametrize(
    ("path", "route"),
    [
        (None, Route(Page.JOBS)),
        ("/", Route(Page.JOBS)),
        ("/jobs", Route(Page.JOBS)),
        ("/jobs/abc", Route(Page.JOB, "abc")),
        ("/jobs/abc/", Route(Page.JOB, "abc")),
        ("/jobs/abc/checkpoints", Route(Page.CHECKPOINTS, "abc")),
        ("/jobs/abc/checkpoints/4127", Route(Page.CHECKPOINT, "abc", 4127)),
        ("/jobs/a%2Fb/checkpoints/7", Route(Page.CHECKPOINT, "a/b", 7)),
    ],
)
def test_pages(path: str | None, route: Route) -> None:
    assert parse(path) == route


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/jobs/abc/checkpoints/latest", "'latest' is not a checkpoint id (1, 2, …)"),
        ("/jobs/abc/checkpoints/0", "'0' is not a checkpoint id (1, 2, …)"),
        ("/nothing/here", "no page at /nothing/here"),
        ("/jobs/abc/checkpoints/3/more", "no page at /jobs/abc/checkpoints/3/more"),
    ],
)
def test_unknown_addresses_say_why(path: str, problem: str) -> None:
    route = parse(path)
    assert route.page is Page.NOT_FOUND
    assert route.problem == problem


def test_paths_parse_back_to_their_page() -> None:
    job = "job/with space"
    assert parse(job_path(job)) == Route(Page.JOB, job)
    assert parse(checkpoints_path(job)) == Route(Page.CHECKPOINTS, job)
    assert parse(checkpoint_path(job, 12)) == Route(Page.CHECKPOINT, job, 12)
