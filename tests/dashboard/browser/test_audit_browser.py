"""The Audit page in headless Chromium against a real control plane (no job needed): hidden
without an admin's token, saying which role it needs; with one, every mutating call, refused
ones too, a token's name shown as text."""

from __future__ import annotations

import httpx
import pytest

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.pages.audit import NEEDS_ADMIN
from tests.e2e.control_plane import TOKEN, ServerProcess

from .dashboard_page import DashboardPage

pytestmark = [pytest.mark.browser]

HOSTILE = "[wall](http://evil.example)"


def set_token(page: DashboardPage, token: str) -> None:
    page.type_into(page.by_id(ids.TOKEN_INPUT), token)


def test_the_audit_page_needs_an_admin_and_then_lists_every_mutating_call(
    page: DashboardPage, server: ServerProcess, api: httpx.Client
) -> None:
    viewer = api.post("/tokens", json={"name": HOSTILE, "role": "viewer"}).json()
    httpx.post(f"{server.url}/jobs/nope/checkpoints")  # anonymous: 401
    refused = httpx.post(
        f"{server.url}/jobs/nope/checkpoints",
        headers={"Authorization": f"Bearer {viewer['secret']}"},
    )
    assert refused.status_code == 403

    page.open("/audit", ids.AUDIT_MESSAGE)
    page.wait("the page to ask for an admin", lambda: page.text(ids.AUDIT_MESSAGE) == NEEDS_ADMIN)
    assert not page.by_id(ids.AUDIT_BODY).is_displayed()

    set_token(page, viewer["secret"])
    page.wait(
        "the page to name the role",
        lambda: "needs a token with the role admin" in page.text(ids.AUDIT_MESSAGE),
    )
    assert not page.by_id(ids.AUDIT_BODY).is_displayed()

    set_token(page, TOKEN)
    rows = page.wait(
        "the audit rows",
        lambda: len(page.grid_rows(ids.AUDIT_GRID)) >= 3 and page.grid_rows(ids.AUDIT_GRID),
    )
    shown = [(r["who"], r["call"], r["status"]) for r in rows]
    assert shown == [
        (f"{HOSTILE} ({viewer['id']})", "POST /jobs/nope/checkpoints", "403"),
        ("anonymous", "POST /jobs/nope/checkpoints", "401"),
        ("bootstrap admin (bootstrap)", "POST /tokens", "201"),
    ]
    assert "who" not in rows[0]["_links"]  # the name is text, not a link
    assert rows[0]["_links"]["job"] == "/jobs/nope"
    assert page.text(ids.AUDIT_MESSAGE) == "3 mutating calls, allowed or refused."
    assert page.errors() == []
