"""The audit page: its rows (texts, never markup), and what it shows without an admin's token."""

from __future__ import annotations

from typing import Any

import pytest

from sparkpoint_dashboard.api_client import ApiRequestError
from sparkpoint_dashboard.pages.audit import NEEDS_ADMIN, audit_row, audit_view
from sparkpoint_dashboard.routing import Page, audit_path, parse
from sparkpoint_dashboard.units import DASH

ENTRY: dict[str, Any] = {
    "id": 7,
    "time": 1_795_659_800_123,
    "token-id": "0123456789abcdef",
    "token-name": "deploy bot",
    "role": "operator",
    "method": "POST",
    "path": "/jobs/job 1/savepoints",
    "job-id": "job 1",
    "request": '{"target-directory":"/tmp/sp"}',
    "status": 202,
    "request-id": "req-1",
}


def _text(notice: Any) -> str:
    return str(notice.children)


def test_an_allowed_call_is_a_row_of_texts() -> None:
    row = audit_row(ENTRY)

    assert row == {
        "id": "7",
        "time_ms": 1_795_659_800_123,
        "time": "2026-11-26 02:23:20.123",
        "who": "deploy bot (0123456789abcdef)",
        "role": "operator",
        "call": "POST /jobs/job 1/savepoints",
        "job": "job 1",
        "job_href": "/jobs/job%201",
        "status": 202,
        "status_style": {"color": "#15803d", "fontWeight": "600"},
        "request": '{"target-directory":"/tmp/sp"}',
        "request_id": "req-1",
    }


def test_a_refused_anonymous_call_without_a_job() -> None:
    entry = {
        **ENTRY,
        "token-id": None,
        "token-name": "anonymous",
        "role": None,
        "path": "/tokens",
        "job-id": None,
        "request": None,
        "status": 401,
        "request-id": None,
    }

    row = audit_row(entry)

    assert (row["who"], row["role"], row["job"], row["request"]) == ("anonymous", DASH, DASH, DASH)
    assert "job_href" not in row
    assert row["status_style"]["color"] == "#b91c1c"


@pytest.mark.parametrize("name", ["[click](javascript:alert(1))", "<b>admin</b>"])
def test_a_hostile_token_name_stays_text(name: str) -> None:
    assert audit_row({**ENTRY, "token-name": name})["who"] == f"{name} (0123456789abcdef)"


@pytest.mark.parametrize("token", [None, "", "   "])
def test_without_a_token_the_page_says_which_role_it_needs(token: str | None) -> None:
    rows, notice, shown = audit_view(token, None, None)

    assert (rows, shown) == ([], False)
    assert _text(notice) == NEEDS_ADMIN


def test_a_token_of_a_lower_role_shows_the_apis_reason() -> None:
    refused = ApiRequestError(
        403, "this call needs a token with the role admin (or higher); token t1 has the role viewer"
    )

    rows, notice, shown = audit_view("spt_x", None, refused)

    assert (rows, shown) == ([], False)
    assert _text(notice) == f"{refused.message}. {NEEDS_ADMIN}"


def test_an_admins_token_shows_the_rows_newest_first_and_how_many() -> None:
    older = {**ENTRY, "id": 6}
    rows, notice, shown = audit_view("spt_admin", {"entries": [ENTRY, older], "total": 5}, None)

    assert shown
    assert [r["id"] for r in rows] == ["7", "6"]
    assert _text(notice) == "The newest 2 of 5 mutating calls, allowed or refused."


def test_the_audit_page_has_its_address() -> None:
    assert parse(audit_path()).page is Page.AUDIT
    assert parse("/audit/").page is Page.AUDIT
