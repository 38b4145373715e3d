"""The dashboard app as a whole, without a browser: it builds, its callbacks refer to ids that
exist, every route renders its page, the Flask server answers, and the CLI refuses a bad URL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from dash import Dash
from dash.dependencies import DashDependency
from dash.development.base_component import Component

from sparkpoint import cli
from sparkpoint_dashboard import ids
from sparkpoint_dashboard.app import build_app, page_title, render_page
from sparkpoint_dashboard.settings import load_settings

# Nothing listens there: building the app and rendering layouts must not call the API.
API = "http://127.0.0.1:9"

ALL_IDS = {v for k, v in vars(ids).items() if k.isupper() and isinstance(v, str)}

SHELL_IDS = {
    ids.URL,
    ids.REFRESH,
    ids.OPERATIONS,
    ids.TITLE,
    ids.TITLE_SINK,
    ids.TOKEN_INPUT,
    ids.TOKEN_STATE,
    ids.BANNER,
    ids.PAGE,
    ids.LAST_UPDATED,
}

# What every page of one job starts with: the header and its actions.
JOB_HEADER_IDS = {
    ids.ROUTE,
    ids.JOB_TITLE,
    ids.JOB_STATUS_BADGE,
    ids.ACT_CHECKPOINT,
    ids.ACT_SAVEPOINT,
    ids.ACT_SAVEPOINT_DIR,
    ids.ACT_STOP,
    ids.ACT_CANCEL,
    ids.ACT_RESTORE_SELECT,
    ids.ACT_RESTORE,
    ids.ACT_CONFIRM,
    ids.OPERATIONS_LOG,
}

# The main ids of each page (path -> ids its layout contains before any data arrived).
PAGES: dict[str, set[str]] = {
    "/": {ids.ROUTE, ids.JOBS_GRID, ids.JOBS_MESSAGE},
    "/jobs/x": JOB_HEADER_IDS
    | {
        ids.JOB_CARDS,
        ids.JOB_STATUS_CHART,
        ids.JOB_THROUGHPUT_CHART,
        ids.JOB_EXCEPTIONS_GRID,
        ids.CFG_INTERVAL,
        ids.CFG_APPLY,
        ids.RS_TYPE,
        ids.RS_PARAMS,
        ids.RS_APPLY,
    },
    "/jobs/x/checkpoints": JOB_HEADER_IDS
    | {ids.CP_COUNTS, ids.CP_HISTORY_CHART, ids.CP_HISTORY_GRID, ids.CP_MESSAGE},
    "/jobs/x/checkpoints/3": JOB_HEADER_IDS
    | {ids.CK_SUMMARY, ids.CK_OPERATORS_GRID, ids.CK_TIMELINE, ids.CK_MESSAGE},
    "/audit": {ids.ROUTE, ids.AUDIT_GRID, ids.AUDIT_MESSAGE, ids.AUDIT_BODY},
}


def walk(node: Any) -> Iterator[Component]:
    """Every component in ``node``, in any property (children, or a component-valued prop)."""
    if isinstance(node, Component):
        yield node
        for prop in node._prop_names:
            yield from walk(getattr(node, prop, None))
    elif isinstance(node, list | tuple):
        for child in node:
            yield from walk(child)


def component_ids(node: Any) -> set[str]:
    """The string ids in ``node`` (pattern ids as their ``type``)."""
    out: set[str] = set()
    for component in walk(node):
        cid = getattr(component, "id", None)
        if isinstance(cid, dict):
            out.add(str(cid.get("type")))
        elif cid is not None:
            out.add(cid)
    return out


def parse_dependency(dep: str | DashDependency) -> tuple[Any, str]:
    """``"id.prop"``, ``'{"type":...}.prop'`` (a pattern id) or an Output as ``(id, prop)``."""
    if isinstance(dep, DashDependency):
        return dep.component_id, dep.component_property
    if dep.startswith("{"):
        end = dep.rindex("}") + 1
        return json.loads(dep[:end]), dep[end + 1 :]
    cid, prop = dep.rsplit(".", 1)
    return cid, prop


def callback_ids(app: Dash) -> list[tuple[str, Any]]:
    """``(callback, id)`` of every Output, Input and State of every callback."""
    out: list[tuple[str, Any]] = []
    for name, spec in app.callback_map.items():
        outputs = spec["output"] if isinstance(spec["output"], list) else [spec["output"]]
        out.extend((name, parse_dependency(o)[0]) for o in outputs if o)
        for dep in [*spec["inputs"], *spec["state"]]:
            cid = dep["id"]  # a pattern id comes as its JSON text
            out.append((name, json.loads(cid) if cid.startswith("{") else cid))
    return out


@pytest.fixture(scope="module")
def app() -> Dash:
    return build_app(load_settings(api_url=API, dashboard_refresh_ms=1500))


def test_the_app_builds_with_the_shell(app: Dash) -> None:
    assert component_ids(app.layout) >= SHELL_IDS
    refresh = next(c for c in walk(app.layout) if getattr(c, "id", None) == ids.REFRESH)
    assert getattr(refresh, "interval", None) == 1500
    assert app.server.config["SPARKPOINT_API_URL"] == API


def test_every_callback_refers_to_ids_of_ids_py(app: Dash) -> None:
    unknown = []
    for name, cid in callback_ids(app):
        known = cid.get("type") in ALL_IDS if isinstance(cid, dict) else cid in ALL_IDS
        if not known:
            unknown.append((name, cid))
    assert unknown == []
    # The router and the refresh of each page are there.
    used = {cid for _, cid in callback_ids(app) if isinstance(cid, str)}
    assert {ids.PAGE, ids.URL, ids.REFRESH, ids.JOBS_GRID, ids.CP_HISTORY_GRID} <= used


@pytest.mark.parametrize("path", sorted(PAGES))
def test_each_route_renders_its_page(path: str) -> None:
    found = component_ids(render_page(path))
    missing = PAGES[path] - found
    assert missing == set(), f"{path} lacks {sorted(missing)}"


@pytest.mark.parametrize("path", sorted(PAGES))
def test_every_cell_of_every_grid_shows_its_whole_text_on_hover(path: str) -> None:
    grids = [c for c in walk(render_page(path)) if type(c).__name__ == "AgGrid"]
    silent = [
        (c.id, column.get("field"))
        for c in grids
        for column in c.columnDefs
        if not {"tooltipField", "tooltipValueGetter"} & (c.defaultColDef.keys() | column.keys())
    ]
    assert silent == []
    for c in grids:  # the default one is the cell's own text
        assert c.defaultColDef["tooltipValueGetter"] == {
            "function": "params.valueFormatted || params.value"
        }


def test_an_unknown_path_renders_a_page_that_says_so() -> None:
    found = component_ids(render_page("/nowhere"))
    assert ids.JOBS_GRID not in found and ids.CP_HISTORY_GRID not in found
    shown = json.dumps(render_page("/nowhere").to_plotly_json(), default=str)
    assert "no page at /nowhere" in shown
    assert page_title("/jobs/x/checkpoints/3") == "Checkpoint 3 of x · Sparkpoint"
    assert page_title("/audit") == "Audit log · Sparkpoint"


@pytest.mark.parametrize("path", ["/", "/jobs/x", "/jobs/x/checkpoints/3"])
def test_the_server_answers_the_index_for_every_page(app: Dash, path: str) -> None:
    answer = app.server.test_client().get(path)
    assert answer.status_code == 200
    assert answer.content_type.startswith("text/html")
    assert b'id="react-entry-point"' in answer.data


def test_the_server_answers_the_layout_and_the_router(app: Dash) -> None:
    client = app.server.test_client()
    layout = client.get("/_dash-layout")
    assert layout.status_code == 200
    served = json.dumps(layout.get_json(), separators=(",", ":"))
    assert {i for i in SHELL_IDS if f'"id":"{i}"' not in served} == set()
    routed = client.post(
        "/_dash-update-component",
        json={
            "output": f"{ids.PAGE}.children",
            "outputs": {"id": ids.PAGE, "property": "children"},
            "inputs": [{"id": ids.URL, "property": "pathname", "value": "/jobs/x/checkpoints"}],
            "changedPropIds": [f"{ids.URL}.pathname"],
            "state": [],
        },
    )
    assert routed.status_code == 200, routed.get_data(as_text=True)
    children = routed.get_json()["response"][ids.PAGE]["children"]
    assert f'"{ids.CP_HISTORY_GRID}"' in json.dumps(children)


def test_the_dashboard_command_refuses_an_api_that_is_not_a_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["dashboard", "--api", "notaurl"]) == 2
    err = capsys.readouterr().err
    assert "sparkpoint dashboard: invalid setting: api_url" in err
    assert "'notaurl'" in err
