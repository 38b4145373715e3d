"""Small pieces every page uses: status badges, number cards, sections, tables, messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import dash_ag_grid as dag
from dash import dcc, html

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiRequestError, ApiUnreachableError
from sparkpoint_dashboard.routing import Route
from sparkpoint_dashboard.theme import status_color

T = TypeVar("T")


def badge(status: str | None, label: str | None = None) -> html.Span:
    """A coloured pill for a job, checkpoint or operation status."""
    text = label or (status or "UNKNOWN")
    return html.Span(
        text,
        className="badge",
        style={"backgroundColor": status_color(status)},
        **{"data-status": status or "UNKNOWN"},  # type: ignore[arg-type]
    )


def stat(label: str, value: Any, detail: Any = None, value_id: str | None = None) -> html.Div:
    """A labelled number card (the value carries its unit)."""
    value_props: dict[str, Any] = {"className": "stat-value"}
    if value_id:
        value_props["id"] = value_id
    return html.Div(
        [
            html.Div(label, className="stat-label"),
            html.Div(value, **value_props),
            html.Div(detail, className="stat-detail") if detail is not None else None,
        ],
        className="stat",
    )


def section(title: str, *children: Any, help_text: Any = None, **props: Any) -> html.Section:
    """A titled block of a page, with an optional explanation under the title."""
    head: list[Any] = [html.H2(title)]
    if help_text is not None:
        head.append(html.P(help_text, className="help"))
    return html.Section([*head, *children], className="card", **props)


def choice_group(select_id: str, placeholder: str, button: html.Button) -> html.Div:
    """A dropdown of choices (a callback fills it) and the button that acts on the one
    chosen (restore it, dispose of it)."""
    select = dcc.Dropdown(
        id=select_id,
        options=[],
        placeholder=placeholder,
        searchable=False,
        clearable=True,
        className="restore-select",
    )
    return html.Div([select, button], className="control-group")


def message(text: str | None, kind: str = "error") -> html.Div | None:
    """An inline notice (``error``, ``info`` or ``ok``); nothing when ``text`` is empty."""
    if not text:
        return None
    return html.Div(text, className=f"notice notice-{kind}", role="status")


# The text a cell shows: its formatted value where the column formats one.
CELL_TEXT_TOOLTIP = {"function": "params.valueFormatted || params.value"}


def number_column(field: str, header: str, **extra: Any) -> dict[str, Any]:
    """A numeric grid column that sorts by ``field`` and shows ``<field>_text`` (with units)."""
    return {
        "field": field,
        "headerName": header,
        "type": "numericColumn",
        "valueFormatter": {"function": f"params.data.{field}_text"},
        **extra,
    }


def grid(
    grid_id: str,
    columns: list[dict[str, Any]],
    *,
    row_id: str = "params.data.id",
    height: str | None = None,
    sort: tuple[str, str] | None = None,
    **props: Any,
) -> dag.AgGrid:
    """A sortable, resizable table whose rows keep their sort when the data refreshes
    (rows are matched by ``row_id``).

    Hovering any cell shows its whole text (a cut one included); a column's own
    ``tooltipField`` (say, a timestamp's milliseconds) takes precedence."""
    if sort is not None:
        columns = [{**c, "sort": sort[1]} if c.get("field") == sort[0] else c for c in columns]
    options: dict[str, Any] = {
        "animateRows": False,
        "suppressCellFocus": True,
        "enableCellTextSelection": True,
        "ensureDomOrder": True,
        "tooltipShowDelay": 300,
    }
    style: dict[str, Any] = {"width": "100%"}
    if height is None:
        options["domLayout"] = "autoHeight"
    else:
        style["height"] = height
    return dag.AgGrid(
        id=grid_id,
        columnDefs=columns,
        rowData=[],
        defaultColDef={
            "sortable": True,
            "resizable": True,
            "minWidth": 80,
            "tooltipValueGetter": CELL_TEXT_TOOLTIP,
        },
        columnSize="responsiveSizeToFit",
        getRowId=row_id,
        dashGridOptions=options,
        style=style,
        className="ag-theme-quartz",
        **props,
    )


LINK_RENDERER = "TextLink"  # assets/dashAgGridComponentFunctions.js


def link_column(field: str, **column: Any) -> dict[str, Any]:
    """An AG Grid column whose cells show ``row[field]`` as text, linked to the dashboard path
    in ``row[field + "_href"]`` (see :func:`link_cell`).

    Never markdown nor HTML: names come from jobs, and a name is only ever shown as text.
    """
    params = {"hrefField": f"{field}_href"}
    return {"field": field, "cellRenderer": LINK_RENDERER, "cellRendererParams": params, **column}


def link_cell(field: str, text: str, href: str) -> dict[str, str]:
    """The row values of a :func:`link_column` cell: its text and the path it links to."""
    return {field: text, f"{field}_href": href}


def fetch(load: Callable[[], T]) -> tuple[T | None, str | None]:
    """Call the API: ``(answer, None)``, or ``(None, message)`` when it answered with an error.

    When the API cannot be reached the answer is ``(None, "")``: the banner says so once for the
    whole page, and the page keeps showing what it last had.
    """
    try:
        return load(), None
    except ApiUnreachableError:
        return None, ""
    except ApiRequestError as err:
        return None, err.message


def route_store(route: Route) -> dcc.Store:
    """The page's route as data: the Input that makes a page's callbacks run when it appears."""
    return dcc.Store(
        id=ids.ROUTE,
        data={
            "page": route.page.value,
            "job_id": route.job_id,
            "checkpoint_id": route.checkpoint_id,
        },
    )
