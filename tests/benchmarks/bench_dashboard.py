"""What one refresh of the dashboard's pages costs, with 10,000 checkpoints stored for one job.

    make bench-dashboard      # or: .venv/bin/python tests/benchmarks/bench_dashboard.py

Stores the job of ``bench_api.py`` (10,000 checkpoints, five subtask rows each) in a migrated
SQLite file, and in a second one three jobs whose checkpoint #1 has 2 operators x {2, 16, 64}
subtasks. Times, after a warm-up:

1. the shaping alone (no HTTP): ``checkpoints_views`` of a real ``GET /jobs/{id}/checkpoints
   ?limit=300`` answer, ``history_figure`` alone and the same figure dict given to
   ``plotly.graph_objects.Figure`` (what building figures with ``go.Figure`` would add to every
   refresh), and ``subtask_phases`` / ``timeline_figure`` of the one-checkpoint page;
2. end to end: the control plane's FastAPI app in a TestClient, the dashboard built over it
   (``build_app(settings, client=ApiClient(..., http=<that TestClient>))``), and the POST
   ``/_dash-update-component`` a browser sends on a refresh tick, with Dash's exact body,
   through Flask's test client; compared with the bare GETs the callback makes. A "tick" is
   every callback a tick of ``refresh.n_intervals`` fires on the page, sent one after another
   (a browser sends them at once, but two cores and the GIL make that little faster).

Writes ``tests/benchmarks/results/dashboard.md|json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "jobs"), str(ROOT / "backend"), str(ROOT / "frontend")]

import plotly.graph_objects as go  # noqa: E402
from bench_api import JOB, T0, populate  # noqa: E402  (the same 10,000 checkpoints)
from bench_pv import write_results  # noqa: E402  (the shared result writer)
from dashboard_stack import (  # noqa: E402
    BASE_URL,
    OPERATORS,
    Page,
    Stack,
    api_get,
    populate_timelines,
    stack,
)
from plotly.io.json import to_json_plotly  # noqa: E402

from sparkpoint_dashboard import ids  # noqa: E402
from sparkpoint_dashboard.api_client import ApiClient  # noqa: E402
from sparkpoint_dashboard.components.charts import history_figure  # noqa: E402
from sparkpoint_dashboard.components.timeline import subtask_phases, timeline_figure  # noqa: E402
from sparkpoint_dashboard.pages.checkpoint import pending_span, timeline_note  # noqa: E402
from sparkpoint_dashboard.pages.checkpoints import HISTORY_LIMIT, checkpoints_views  # noqa: E402
from sparkpoint_server.storage.db import migrate  # noqa: E402

PARALLELISMS = (2, 16, 64)
UPDATE = "/_dash-update-component"

Stats = dict[str, float]


# ----------------------------------------------------------------------------- timing


def time_calls(call: Callable[[], int], repeats: int, warmup: int) -> Stats:
    """Milliseconds per ``call()`` (p50, p90, p99, mean, max) after ``warmup`` calls; ``bytes``
    is what the last call returned (the size of its answer, 0 without one)."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        size = call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "p50": statistics.median(samples),
        "p90": samples[int(0.90 * len(samples)) - 1],
        "p99": samples[int(0.99 * len(samples)) - 1],
        "mean": statistics.fmean(samples),
        "max": samples[-1],
        "bytes": size,
    }


def shaped(function: Callable[..., Any], *args: Any) -> Callable[[], int]:
    """A call of a pure function, answering 0 bytes (its result goes through no HTTP)."""

    def call() -> int:
        function(*args)
        return 0

    return call


# ----------------------------------------------------------------------------- the two apps


# ----------------------------------------------------------------------------- measurements

SHAPING, END_TO_END = "shaping (no HTTP)", "end to end"
VIEWS = "checkpoints_views(answer, job_id, now_ms) (the whole page)"
HISTORY = "history_figure(history, now_ms) (a dict)"
GO_FIGURE = "go.Figure(that dict)"
ENCODE = "to_json_plotly(the callback's outputs) (how Dash encodes its answer)"
CP_GET = f"API: GET /jobs/{{id}}/checkpoints?limit={HISTORY_LIMIT}"
CP_CALLBACK = "Dash: checkpoints page refresh callback"


def measure_pages(s: Stack, checkpoints: int, repeats: int, warmup: int) -> dict[str, Any]:
    """The checkpoints page of the 10,000-checkpoint job, then the jobs page.

    Steps:
        1. the shaping alone, on a real answer of the API;
        2. the API alone and through the dashboard, callback by callback and a whole tick.
    """
    shaping: dict[str, Stats] = {}
    e2e: dict[str, Stats] = {}
    history_path = f"/jobs/{JOB}/checkpoints?limit={HISTORY_LIMIT}"
    answer = s.api.get(history_path).json()
    assert len(answer["history"]) == HISTORY_LIMIT
    now_ms = T0 + 1000 * checkpoints + 500  # half a second into the newest, in progress
    figure = history_figure(answer["history"], now_ms)
    views = checkpoints_views(answer, JOB, now_ms)
    outputs = [ids.CP_COUNTS, ids.CP_LATEST, ids.CP_HISTORY_CHART, ids.CP_SUMMARY]
    props = ["children", "children", "figure", "children", "rowData", "children"]
    encoded = {
        "multi": True,
        "response": {
            cid: {prop: value}
            for cid, prop, value in zip(
                [*outputs, ids.CP_HISTORY_GRID, ids.CP_MESSAGE], props, [*views, None], strict=True
            )
        },
    }

    # Step 1: the shaping alone.
    shaping[VIEWS] = time_calls(shaped(checkpoints_views, answer, JOB, now_ms), repeats, warmup)
    shaping[HISTORY] = time_calls(
        shaped(history_figure, answer["history"], now_ms), repeats, warmup
    )
    shaping[GO_FIGURE] = time_calls(shaped(go.Figure, figure), repeats, warmup)
    shaping[ENCODE] = time_calls(shaped(to_json_plotly, encoded), repeats, warmup)

    # Step 2: the API alone, then through the dashboard.
    page = Page(s, f"/jobs/{JOB}/checkpoints")
    page.refresh()  # the page's first tick: its stores now hold what a browser's would
    client = ApiClient(BASE_URL, http=s.api)

    def history_rows(response: dict[str, Any]) -> None:
        rows = response[ids.CP_HISTORY_GRID]["rowData"]
        assert len(rows) == HISTORY_LIMIT and rows[0]["id"] == checkpoints, rows[:1]
        assert response[ids.CP_HISTORY_CHART]["figure"]["data"], "no history chart"

    def decoded() -> int:
        client.checkpoints(JOB, HISTORY_LIMIT)
        return 0

    e2e["API: GET /healthz"] = time_calls(api_get(s.api, "/healthz"), repeats, warmup)
    e2e["Dash: health callback (GET /healthz, the banner)"] = time_calls(
        page.timed(page.callback(ids.BANNER), lambda r: None), repeats, warmup
    )
    e2e[CP_GET] = time_calls(api_get(s.api, history_path), repeats, warmup)
    e2e["ApiClient.checkpoints (that GET, JSON decoded)"] = time_calls(decoded, repeats, warmup)
    e2e[CP_CALLBACK] = time_calls(
        page.timed(page.callback(ids.CP_HISTORY_GRID), history_rows), repeats, warmup
    )
    e2e[f"Dash: checkpoints page, a whole tick ({len(page.tick)} callbacks)"] = time_calls(
        page.refresh, repeats, warmup
    )

    jobs = Page(s, "/")
    jobs.refresh()

    def one_job(response: dict[str, Any]) -> None:
        assert [row["id"] for row in response[ids.JOBS_GRID]["rowData"]] == [JOB]

    e2e["API: GET /jobs"] = time_calls(api_get(s.api, "/jobs"), repeats, warmup)
    e2e["Dash: jobs page refresh callback"] = time_calls(
        jobs.timed(jobs.callback(ids.JOBS_GRID), one_job), repeats, warmup
    )
    e2e[f"Dash: jobs page, a whole tick ({len(jobs.tick)} callbacks)"] = time_calls(
        jobs.refresh, repeats, warmup
    )
    ticks = {"checkpoints": page.tick_p50s(repeats), "jobs": jobs.tick_p50s(repeats)}
    return {SHAPING: shaping, END_TO_END: e2e, "ticks": ticks}


def measure_timelines(s: Stack, repeats: int, warmup: int) -> dict[str, dict[str, Stats]]:
    """The one-checkpoint page of each timeline job: shaping alone, API alone, dashboard."""
    shaping: dict[str, Stats] = {}
    e2e: dict[str, Stats] = {}
    for n in PARALLELISMS:
        job_id = f"timeline-p{n}"
        details = f"/jobs/{job_id}/checkpoints/details/1"
        paths = [details, *(f"{details}/subtasks/{op}" for op, _ in OPERATORS)]
        cp = s.api.get(details).json()
        operators = [s.api.get(path).json() for path in paths[1:]]
        assert [len(op["subtasks"]) for op in operators] == [n, n]
        span, note = pending_span(cp, T0), timeline_note(cp)
        label = f"2 operators x {n} subtasks"
        shaping[f"subtask_phases(operators), {label}"] = time_calls(
            shaped(subtask_phases, operators), repeats, warmup
        )
        shaping[f"timeline_figure(operators, ...), {label}"] = time_calls(
            shaped(timeline_figure, operators, span, note), repeats, warmup
        )
        e2e[f"API: details + 2 x subtasks GETs, {label}"] = time_calls(
            api_get(s.api, *paths), repeats, warmup
        )
        page = Page(s, f"/jobs/{job_id}/checkpoints/1")
        page.refresh()

        def rows(response: dict[str, Any], n: int = n) -> None:
            labels = response[ids.CK_TIMELINE]["figure"]["layout"]["yaxis"]["categoryarray"]
            assert len(labels) == 2 * n, labels
            assert len(response[ids.CK_HANDLES_GRID]["rowData"]) == 2 * n

        e2e[f"Dash: checkpoint page refresh callback, {label}"] = time_calls(
            page.timed(page.callback(ids.CK_TIMELINE), rows), repeats, warmup
        )
    return {SHAPING: shaping, END_TO_END: e2e}


# ----------------------------------------------------------------------------- results


def wait_until_quiet(max_load: float, max_wait_s: float, poll_s: float = 30.0) -> None:
    """Poll the 1-minute load average until it is below ``max_load``, at most ``max_wait_s``."""
    deadline = time.monotonic() + max_wait_s
    while (load := os.getloadavg()[0]) >= max_load and time.monotonic() < deadline:
        print(f"  load average {load:.2f} >= {max_load}: waiting {poll_s:.0f} s", flush=True)
        time.sleep(poll_s)


@contextmanager
def full_collections() -> Iterator[list[float]]:
    """The milliseconds of each full (generation 2) garbage collection meanwhile: the pauses
    behind the p99s of the heavy callbacks."""
    pauses: list[float] = []
    started = [0.0]

    def watch(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - started[0]) * 1000)

    gc.callbacks.append(watch)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(watch)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _size(n: float) -> str:
    return "—" if not n else (f"{n:.0f} B" if n < 1024 else f"{n / 1024:.0f} KiB")


def report(
    args: argparse.Namespace, sections: dict[str, dict[str, Stats]], meta: dict[str, Any]
) -> str:
    """The Markdown: what ran where, the table, the ratios, each tick's callbacks."""
    busy = ", other processes shared the cores" if meta["load_start"] >= 1.5 else ""
    header = (
        f"Dashboard refresh cost: one job with {args.checkpoints:,} checkpoints (5 subtasks "
        f"each), the checkpoints page showing {HISTORY_LIMIT}; {args.repeats} repetitions after "
        f"{args.warmup} warm-up each; the control plane in FastAPI's TestClient, the dashboard "
        f"through Flask's test client (no sockets); {meta['machine']}; load average "
        f"{meta['load_start']:.1f} at the start, {meta['load_end']:.1f} at the end (this "
        f"benchmark alone adds about 1){busy}; {meta['measuring_s']:.0f} s of measuring; "
        f"{meta['date']}."
        "\n\nRun: `make bench-dashboard` (or `.venv/bin/python tests/benchmarks/"
        "bench_dashboard.py [--repeats N] [--max-load 2.5]`)."
    )
    rows = [
        "| | measurement | p50 | p90 | p99 | mean | max | answer |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for section, results in sections.items():
        for name, r in results.items():
            rows.append(
                f"| {section} | `{name}` | {r['p50']:.2f} ms | {r['p90']:.2f} ms "
                f"| {r['p99']:.2f} ms | {r['mean']:.2f} ms | {r['max']:.1f} ms "
                f"| {_size(r['bytes'])} |"
            )
    ratios = [f"- {text}: **{value}**" for text, value in meta["ratios"].items()]
    ticks = [
        f"- {page} page: " + ", ".join(f"`{output}` {p50:.1f} ms" for output, p50 in p50s.items())
        for page, p50s in meta["ticks"].items()
    ]
    pauses = meta["full_collections_ms"]
    gc_note = (
        f"While measuring, Python ran {len(pauses)} full garbage collection(s) of "
        f"{statistics.median(pauses):.0f} ms each (median; this process "
        "holds the control plane, the dashboard and the benchmark's data): they are the p99s "
        "and maxima far above the p90s."
        if pauses
        else "No full garbage collection ran while measuring."
    )
    return "\n".join(
        [
            header,
            "",
            *rows,
            "",
            gc_note,
            "",
            "Ratios of the p50s:",
            "",
            *ratios,
            "",
            "A tick's callbacks (each one with the input `refresh.n_intervals` whose ids are all "
            "on the page), by their first output, with their p50 within the tick:",
            "",
            *ticks,
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--max-load", type=float, help="first wait until the load average is below this"
    )
    parser.add_argument("--max-wait", type=float, default=900, help="seconds, then run anyway")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkpoint-bench-dashboard-") as base:
        history_url, timeline_url = f"sqlite:///{base}/history.db", f"sqlite:///{base}/timeline.db"
        started = time.perf_counter()
        for url in (history_url, timeline_url):
            migrate(url)
        populate(history_url, args.checkpoints)
        populate_timelines(timeline_url, PARALLELISMS)
        print(f"  stored the checkpoints in {time.perf_counter() - started:.1f} s", flush=True)
        if args.max_load is not None:
            wait_until_quiet(args.max_load, args.max_wait)
        load_start, started = os.getloadavg()[0], time.perf_counter()
        with full_collections() as pauses:
            with stack(history_url) as s:
                pages = measure_pages(s, args.checkpoints, args.repeats, args.warmup)
            with stack(timeline_url) as s:
                timelines = measure_timelines(s, args.repeats, args.warmup)
        measuring_s = time.perf_counter() - started
    sections = {name: pages[name] | timelines[name] for name in (SHAPING, END_TO_END)}
    p50 = {name: r["p50"] for results in sections.values() for name, r in results.items()}

    def times(numerator: str, denominator: str) -> str:
        return f"{p50[numerator] / p50[denominator]:.1f} x"

    cp_tick = next(k for k in p50 if k.startswith("Dash: checkpoints page, a whole tick"))
    biggest = f"2 operators x {PARALLELISMS[-1]} subtasks"
    parts = (CP_GET, VIEWS, ENCODE)
    ratios = {
        "`go.Figure(dict)` / `history_figure` (what go.Figure would cost on every refresh)": times(
            GO_FIGURE, HISTORY
        ),
        "checkpoints page callback / its bare GET (the dashboard's overhead per refresh)": times(
            CP_CALLBACK, CP_GET
        ),
        "checkpoints page, a whole tick / the bare GET": times(cp_tick, CP_GET),
        "jobs page callback / `GET /jobs`": times(
            "Dash: jobs page refresh callback", "API: GET /jobs"
        ),
        "health callback / `GET /healthz` (Dash's floor)": times(
            "Dash: health callback (GET /healthz, the banner)", "API: GET /healthz"
        ),
        f"checkpoint page callback / its 3 GETs, {biggest}": times(
            f"Dash: checkpoint page refresh callback, {biggest}",
            f"API: details + 2 x subtasks GETs, {biggest}",
        ),
        "checkpoints page callback: shares of the bare GET, `checkpoints_views`, the encoding": (
            ", ".join(f"{100 * p50[part] / p50[CP_CALLBACK]:.0f} %" for part in parts)
        ),
    }
    meta = {
        "machine": f"{os.cpu_count()} cores ({cpu_model()}), Python {platform.python_version()}, "
        f"Dash {version('dash')}, Plotly {version('plotly')}",
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "measuring_s": measuring_s,
        "date": time.strftime("%Y-%m-%d"),
        "ratios": ratios,
        "ticks": pages["ticks"],
        "full_collections_ms": pauses,
    }
    write_results(
        "dashboard", report(args, sections, meta), {"args": vars(args), **meta, "results": sections}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
