"""Drives the dashboard in a real browser: open a page, read its tables and charts, choose,
type, click, confirm, take a screenshot, and collect what the browser console said.

Everything that depends on how Dash 4 renders a component (dropdowns, radio items, pattern
ids, AG Grid rows, Plotly figures) lives here, so a change of rendering is fixed in one place.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WIDTH, HEIGHT = 1440, 1000
CHROME_ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    f"--window-size={WIDTH},{HEIGHT}",
)
INSTALL_HINT = "apt-get install chromium chromium-driver"


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (``None`` when Chromium and its driver are there)."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if not missing:
        return None
    return f"{' and '.join(missing)} not installed: {INSTALL_HINT}"


def start_chrome(user_data_dir: Path) -> webdriver.Chrome:
    """Headless Chromium with a fresh profile, a 1440x1000 viewport and the console logged."""
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    for arg in CHROME_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={user_data_dir}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(shutil.which("chromedriver") or CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    # --window-size is the window with its frame; make the page itself 1440x1000.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )
    return driver


def pattern_id_xpath(pattern: dict[str, str]) -> str:
    """The XPath of the element whose Dash pattern id is ``pattern``: Dash writes such an id
    as JSON with sorted keys and no spaces, ``{"key":"...","type":"..."}``."""
    rendered = json.dumps(pattern, sort_keys=True, separators=(",", ":"))
    assert "'" not in rendered, f"cannot quote {rendered} in XPath"
    return f"//*[@id='{rendered}']"


# The rows an AG Grid has rendered (it renders those in view), top to bottom: per row the text
# of each column's cell, the row's id ("_row_id") and the links in its cells ("_links").
_GRID_ROWS_JS = """
const grid = document.getElementById(arguments[0]);
if (!grid) { return null; }
const rows = new Map();
for (const row of grid.querySelectorAll('.ag-row[row-index]')) {
  const index = Number(row.getAttribute('row-index'));
  if (!rows.has(index)) { rows.set(index, {_row_id: row.getAttribute('row-id'), _links: {}}); }
  const out = rows.get(index);
  for (const cell of row.querySelectorAll('.ag-cell[col-id]')) {
    const col = cell.getAttribute('col-id');
    out[col] = cell.innerText.trim();
    const a = cell.querySelector('a[href]');
    if (a) { out._links[col] = a.getAttribute('href'); }
  }
}
return [...rows.keys()].sort((a, b) => a - b).map(i => rows.get(i));
"""

# Every row's data of an AG Grid (all of them, rendered or not), in the grid's sort order.
_GRID_DATA_JS = """
const api = window.dash_ag_grid && dash_ag_grid.getApi(arguments[0]);
if (!api) { return null; }
const rows = [];
api.forEachNodeAfterFilterAndSort(node => rows.push(node.data));
return rows;
"""

# The traces of the Plotly figure inside a dcc.Graph, and its axes' categories.
_PLOTLY_JS = """
const gd = document.querySelector('#' + CSS.escape(arguments[0]) + ' .js-plotly-plot');
if (!gd || !gd.data) { return null; }
const list = v => (v == null ? [] : Array.from(v));
return {
  traces: gd.data.map(t => ({name: t.name ?? null, type: t.type ?? null,
                             x: list(t.x), y: list(t.y), base: list(t.base)})),
  y_categories: list(gd._fullLayout && gd._fullLayout.yaxis && gd._fullLayout.yaxis._categories),
  x_title: (gd._fullLayout && gd._fullLayout.xaxis && gd._fullLayout.xaxis.title
            && gd._fullLayout.xaxis.title.text) || null,
};
"""


@dataclass
class ConsoleEntry:
    page: str
    level: str
    message: str


@dataclass
class DashboardPage:
    """The dashboard at ``base_url`` in ``driver``."""

    driver: webdriver.Chrome
    base_url: str
    screenshots: Path
    console: list[ConsoleEntry] = field(default_factory=list)
    path: str = "/"

    # -- navigation and waiting ------------------------------------------------------------

    def open(self, path: str, *ready_ids: str) -> None:
        """Load ``path`` (a full page load) and wait until the page and ``ready_ids`` are there."""
        self.collect_console()
        self.path = path
        self.driver.get(self.base_url + path)
        self.wait(f"the page {path} to render", lambda: self.exists_css("#page > *"))
        for element_id in ready_ids:
            selector = f"#{element_id}"
            self.wait(f"{selector} on {path}", partial(self.exists_css, selector))

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
        """Poll ``check()`` until it is truthy and return that; fail naming ``what`` and the
        last value."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            try:
                last = check()
            except (NoSuchElementException, StaleElementReferenceException) as err:
                last = None  # the page re-rendered under the check: look again
                if time.monotonic() > deadline:
                    raise AssertionError(f"waiting for {what} on {self.path}: {err}") from err
            if last:
                return last
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s:g} s waiting for {what} on {self.path} "
                    f"(last: {last!r})"
                )
            time.sleep(0.2)

    def exists_css(self, selector: str) -> bool:
        return bool(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def by_id(self, element_id: str) -> WebElement:
        return self.driver.find_element(By.ID, element_id)

    def text(self, element_id: str) -> str:
        """The visible text of ``#element_id`` ("" when it is not there)."""
        found = self.driver.find_elements(By.ID, element_id)
        return found[0].text if found else ""

    # -- reading -----------------------------------------------------------------------------

    def texts(self, selector: str) -> list[str]:
        """The visible text of every element matching the CSS ``selector`` (read at once, so a
        refresh cannot replace an element between finding and reading it)."""
        found = self.driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText.trim())",
            selector,
        )
        return [str(t) for t in found or []]

    def grid_rows(self, grid_id: str) -> list[dict[str, Any]]:
        """The rows the AG Grid ``grid_id`` has rendered, top to bottom: ``{col-id: the cell's
        text, "_row_id": the row's id, "_links": {col-id: href of the cell's link}}``."""
        rows = self.driver.execute_script(_GRID_ROWS_JS, grid_id)
        return list(rows or [])

    def grid_data(self, grid_id: str) -> list[dict[str, Any]]:
        """The data of every row of the AG Grid ``grid_id`` (rendered or not), as sorted."""
        rows = self.driver.execute_script(_GRID_DATA_JS, grid_id)
        return list(rows or [])

    def figure(self, graph_id: str) -> dict[str, Any] | None:
        """The Plotly figure drawn in the dcc.Graph ``graph_id``: its traces (name, type, x, y,
        base) and ``y_categories``; ``None`` before it is drawn."""
        figure = self.driver.execute_script(_PLOTLY_JS, graph_id)
        return figure if figure else None

    # -- acting ------------------------------------------------------------------------------

    def type_into(self, element: WebElement, text: str) -> None:
        """Replace the input's value by ``text`` and commit it (Tab: a debounced input commits
        when it loses focus)."""
        element.click()
        element.send_keys(Keys.CONTROL, "a")
        element.send_keys(Keys.BACKSPACE)
        element.send_keys(text)
        element.send_keys(Keys.TAB)

    def pattern_element(self, pattern: dict[str, str]) -> WebElement:
        return self.driver.find_element(By.XPATH, pattern_id_xpath(pattern))

    def choose(self, element_id: str, value: object) -> None:
        """Choose the option whose value is ``value`` in a dcc.Dropdown, dcc.RadioItems or a
        native <select> with id ``element_id``.

        Dash 4 renders a dcc.Dropdown as a ``button.dash-dropdown`` that opens a listbox of
        ``label[role=option]`` each holding an ``input[value]``; dcc.RadioItems as a
        ``div[role=listbox]`` of the same labels.
        """
        element = self.by_id(element_id)
        wanted = str(value)
        if element.tag_name == "select":
            from selenium.webdriver.support.ui import Select

            Select(element).select_by_value(wanted)
            return
        if "dash-dropdown" in (element.get_attribute("class") or ""):
            element.click()
            # Find and click in one step: a refresh re-renders the options in place (Dash
            # reuses each position's element), so an element found earlier may hold another
            # option by the time it is clicked.
            self.wait(
                f"the option {wanted!r} of #{element_id}",
                lambda: self.driver.execute_script(
                    "const i = document.querySelector(arguments[0]);"
                    "if (!i) { return false; } i.closest('label').click(); return true;",
                    f".dash-dropdown-options [role=option] input[value={json.dumps(wanted)}]",
                ),
                timeout_s=10,
            )
            self.wait(
                f"#{element_id} to close with {wanted!r} chosen",
                lambda: self.by_id(element_id).get_attribute("aria-expanded") == "false",
                timeout_s=10,
            )
            return
        element.find_element(By.CSS_SELECTOR, f"input[value={json.dumps(wanted)}]").click()

    def chosen_label(self, element_id: str) -> str:
        """The label a dcc.Dropdown shows as chosen (Dash 4: ``#<id>-value``)."""
        return self.text(f"{element_id}-value")

    def options(self, element_id: str) -> list[str]:
        """The values a dcc.Dropdown offers (opens and closes it) or a dcc.RadioItems shows."""
        element = self.by_id(element_id)
        if "dash-dropdown" not in (element.get_attribute("class") or ""):
            inputs = element.find_elements(By.CSS_SELECTOR, "input[value]")
            return [str(i.get_attribute("value")) for i in inputs]
        element.click()
        try:
            inputs = self.wait(
                f"the options of #{element_id}",
                lambda: self.driver.find_elements(
                    By.CSS_SELECTOR, ".dash-dropdown-options [role=option] input[value]"
                ),
                timeout_s=10,
            )
            values = [str(i.get_attribute("value")) for i in inputs]
        finally:
            element.send_keys(Keys.ESCAPE)
        return values

    def dropdown_state(self, element_id: str, note_id: str) -> tuple[dict[str, str], str, str]:
        """A dcc.Dropdown's options (value to label, in order), the label it shows as chosen and
        the text of ``#note_id``, read at once so that a refresh cannot come between them
        (opens and closes the dropdown)."""
        self.by_id(element_id).click()
        try:
            options, label, note = self.wait(
                f"the options of #{element_id}",
                lambda: self.driver.execute_script(
                    "const options = [...document.querySelectorAll(arguments[0])]"
                    "  .map(o => [o.querySelector('input').value, o.innerText.trim()]);"
                    "const text = id => (document.getElementById(id) || {}).innerText || '';"
                    "return options.length && [options, text(arguments[1]), text(arguments[2])];",
                    ".dash-dropdown-options [role=option]",
                    f"{element_id}-value",
                    note_id,
                ),
                timeout_s=10,
            )
        finally:
            self.by_id(element_id).send_keys(Keys.ESCAPE)
        return dict(options), str(label).strip(), str(note).strip()

    def alert_open(self, timeout_s: float = 2.0) -> bool:
        """Whether a confirmation dialog opens within ``timeout_s``."""
        try:
            WebDriverWait(self.driver, timeout_s).until(EC.alert_is_present())
        except TimeoutException:
            return False
        return True

    def confirm(self, timeout_s: float = 10.0) -> str:
        """Accept the confirmation dialog that the last click opened; its text."""
        WebDriverWait(self.driver, timeout_s).until(EC.alert_is_present())
        alert = self.driver.switch_to.alert
        text = str(alert.text)
        alert.accept()
        return text

    def dismiss(self, timeout_s: float = 10.0) -> str:
        """Cancel the confirmation dialog that the last click opened; its text."""
        WebDriverWait(self.driver, timeout_s).until(EC.alert_is_present())
        alert = self.driver.switch_to.alert
        text = str(alert.text)
        alert.dismiss()
        return text

    # -- evidence ----------------------------------------------------------------------------

    def screenshot(self, name: str) -> Path:
        """Save the window (1440x1000) as ``docs/screenshots/<name>.png``."""
        self.screenshots.mkdir(parents=True, exist_ok=True)
        path = self.screenshots / f"{name}.png"
        # The mouse may rest on a tooltip; move focus away and let the last paint settle.
        self.driver.execute_script("document.activeElement && document.activeElement.blur()")
        self.driver.execute_script(
            "return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
        )
        if not self.driver.save_screenshot(str(path)):
            raise AssertionError(f"could not write {path}")
        return path

    def collect_console(self) -> list[ConsoleEntry]:
        """What the console said since the last call (the driver's log empties on reading)."""
        try:
            entries = self.driver.get_log("browser")
        except TimeoutException:
            return []
        new = [ConsoleEntry(self.path, e["level"], e["message"]) for e in entries]
        self.console.extend(new)
        return new

    def errors(self) -> list[ConsoleEntry]:
        """The console's errors so far: SEVERE entries, and AG Grid's warnings (each names a
        misconfigured grid, such as duplicate row ids)."""
        self.collect_console()
        return [
            e
            for e in self.console
            if e.level == "SEVERE"
            or "AG Grid: warning" in e.message
            or "AG Grid: error" in e.message
        ]
