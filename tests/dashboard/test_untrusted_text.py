"""Strings from the API (a job's name, ids, causes) are shown as text, never as markdown or
HTML: a job named ``x\\](http://evil/phish) \\[`` or ``<http://evil>`` must not become a link."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import dash_ag_grid as dag
import pytest
from dash import dcc

from sparkpoint_dashboard.app import render_page
from sparkpoint_dashboard.components.widgets import LINK_RENDERER
from sparkpoint_dashboard.pages.checkpoints import history_row
from sparkpoint_dashboard.pages.jobs import job_row
from tests.dashboard.test_app_smoke import PAGES, walk

FRONTEND = Path(__file__).parents[2] / "frontend" / "sparkpoint_dashboard"
RENDERERS_JS = FRONTEND / "assets" / "dashAgGridComponentFunctions.js"
HOSTILE_NAMES = [
    "x\\](http://evil.example/phish) \\[",
    "<http://evil.example>",
    "[click](javascript:alert(1))",
    "<a href='http://evil.example'>x</a>",
    "http://evil.example",
]


def test_no_page_renders_api_strings_as_markdown() -> None:
    for path in PAGES:
        for component in walk(render_page(path)):
            assert not isinstance(component, dcc.Markdown), path
            if isinstance(component, dag.AgGrid):
                renderers = {c.get("cellRenderer") for c in component.columnDefs}
                assert renderers <= {None, LINK_RENDERER}, (path, component.id)
    sources = "\n".join(p.read_text() for p in FRONTEND.rglob("*.py"))
    for construct in ("Markdown(", '"markdown"', "dangerously_allow_html"):
        assert construct not in sources


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_job_name_is_the_text_of_its_row(name: str) -> None:
    job = {"id": "j1", "name": name, "status": "RUNNING", "start-time": 0, "duration": 1}
    row = job_row(job, 1_000)
    assert (row["job"], row["job_href"]) == (f"{name} · j1", "/jobs/j1")


def _render(value: Any, href: Any) -> Any:
    """The element tree the grid's link renderer returns, computed by Node with a React that
    records ``createElement`` calls."""
    script = f"""
        var window = {{}};
        var React = {{createElement: function (type, props) {{
            return {{type: type, props: props, children: Array.prototype.slice.call(arguments, 2)}};
        }}}};
        {RENDERERS_JS.read_text()}
        var props = {{value: {json.dumps(value)}, data: {{link_href: {json.dumps(href)}}},
                      hrefField: "link_href"}};
        process.stdout.write(JSON.stringify(window.dashAgGridComponentFunctions.{LINK_RENDERER}(props)));
    """
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_the_link_renderer_shows_a_hostile_name_as_the_text_of_one_local_link(name: str) -> None:
    assert _render(name, "/jobs/j1") == {
        "type": "a",
        "props": {"href": "/jobs/j1"},
        "children": [name],
    }


@pytest.mark.parametrize(
    "href", ["//evil.example/x", "/\\evil.example", "http://evil.example", "javascript:x", None]
)
def test_the_link_renderer_links_only_paths_of_the_dashboard(href: str | None) -> None:
    assert _render("#3", href) == {"type": "span", "props": None, "children": ["#3"]}


def test_a_checkpoint_row_links_to_its_page() -> None:
    entry = {"id": 3, "status": "COMPLETED"}
    row = history_row(entry, "a/b")
    assert (row["link"], row["link_href"]) == ("#3", "/jobs/a%2Fb/checkpoints/3")
