"""The dashboard over the control plane in one process, and the requests a browser would send:
the stack ``bench_dashboard.py`` times (no sockets: FastAPI's and Flask's test clients)."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bench_api import T0
from dash import Dash
from dash.development.base_component import Component
from fastapi import FastAPI
from fastapi.testclient import TestClient
from flask.testing import FlaskClient
from sqlalchemy import insert

from sparkpoint_dashboard import ids
from sparkpoint_dashboard.api_client import ApiClient
from sparkpoint_dashboard.app import build_app, render_page
from sparkpoint_dashboard.settings import load_settings
from sparkpoint_server.api import install_api
from sparkpoint_server.config import Settings
from sparkpoint_server.storage.db import create_db_engine, session_factory
from sparkpoint_server.storage.models import Checkpoint, CheckpointSubtask, Job

BASE_URL = "http://testserver"  # the TestClient's
UPDATE = "/_dash-update-component"
OPERATORS = (("events", "events"), ("pv", "pv -> sink"))  # (id, name) of the timeline jobs


@dataclass
class Stack:
    """The control plane in a TestClient and the dashboard built over it."""

    api: TestClient
    dash: Dash
    browser: FlaskClient


@contextmanager
def stack(url: str) -> Iterator[Stack]:
    """The control plane's API over the database at ``url`` (as ``bench_api.py`` builds it)
    and the dashboard whose ``ApiClient`` sends through the control plane's TestClient."""
    engine = create_db_engine(url)
    app = FastAPI()
    app.state.settings = Settings(api_token=None)
    app.state.session_factory = session_factory(engine)
    app.state.control_plane = None
    app.state.ingest_stats = None
    install_api(app)
    try:
        with TestClient(app, base_url=BASE_URL) as api:
            dash = build_app(load_settings(api_url=BASE_URL), client=ApiClient(BASE_URL, http=api))
            yield Stack(api, dash, dash.server.test_client())
    finally:
        engine.dispose()


def api_get(client: TestClient, *paths: str) -> Callable[[], int]:
    """GETs of ``paths`` one after another (each must answer 200); their bytes in all."""

    def call() -> int:
        size = 0
        for path in paths:
            response = client.get(path)
            assert response.status_code == 200, (path, response.text)
            size += len(response.content)
        return size

    return call


# ----------------------------------------------------------------------------- Dash's requests


def _walk(node: Any) -> Iterator[Component]:
    if isinstance(node, Component):
        yield node
        for prop in node._prop_names:
            yield from _walk(getattr(node, prop, None))
    elif isinstance(node, list | tuple):
        for child in node:
            yield from _walk(child)


def _outputs(key: str) -> Any:
    """The ``outputs`` Dash's renderer sends for the callback ``key`` (as ``callback_map``
    names it): one ``{id, property}``, or a list of them for a multi-output callback."""
    if key.startswith(".."):
        return [_outputs(part) for part in key[2:-2].split("...")]
    cid, prop = key.rsplit(".", 1)
    return {"id": cid, "property": prop}


def _output_ids(key: str) -> list[str]:
    outputs = _outputs(key)
    return [o["id"] for o in (outputs if isinstance(outputs, list) else [outputs])]


def _first_output(key: str) -> str:
    """``"checkpoint-counts.children"`` for a callback writing that and more."""
    outputs = _outputs(key)
    first = outputs[0] if isinstance(outputs, list) else outputs
    return f"{first['id']}.{first['property'].split('@')[0]}"


class Page:
    """One page as the browser holds it: its component values, updated by the answers of the
    callbacks, and the callbacks a refresh tick fires on it."""

    def __init__(self, stack: Stack, path: str) -> None:
        self.stack = stack
        components = [*_walk(stack.dash.layout), *_walk(render_page(path))]
        self.values: dict[str, Any] = {}
        for component in components:
            cid = getattr(component, "id", None)
            if not isinstance(cid, str):
                continue
            for prop in component._prop_names:
                value = getattr(component, prop, None)
                if value is not None and not isinstance(value, Component):
                    self.values[f"{cid}.{prop}"] = value
        present = {getattr(c, "id", None) for c in components}
        refresh = f"{ids.REFRESH}.n_intervals"
        self.tick: list[str] = []  # callback_map keys, in the order the app registered them
        for key, spec in stack.dash.callback_map.items():
            deps = [*_output_ids(key), *(d["id"] for d in [*spec["inputs"], *spec["state"]])]
            inputs = {f"{d['id']}.{d['property']}" for d in spec["inputs"]}
            if refresh in inputs and all(cid in present for cid in deps):
                self.tick.append(key)
        self.values[refresh] = 0
        self.samples: dict[str, list[float]] = {}

    def body(self, key: str) -> dict[str, Any]:
        """The JSON a browser POSTs to ``/_dash-update-component`` for the callback ``key`` on
        a refresh tick (a value the page does not have is left out, as the browser does)."""
        spec = self.stack.dash.callback_map[key]

        def dep(d: dict[str, str]) -> dict[str, Any]:
            value = self.values.get(f"{d['id']}.{d['property']}")
            return {**d, "value": value} if value is not None else dict(d)

        return {
            "output": key,
            "outputs": _outputs(key),
            "inputs": [dep(d) for d in spec["inputs"]],
            "changedPropIds": [f"{ids.REFRESH}.n_intervals"],
            "state": [dep(d) for d in spec["state"]],
        }

    def send(self, key: str) -> int:
        """POST the callback ``key`` (the tick's current body) and keep what it answered, as
        the page would; the bytes of the answer (none when it updated nothing: 204)."""
        reply = self.stack.browser.post(UPDATE, json=self.body(key))
        assert reply.status_code in (200, 204), (key, reply.status_code, reply.text[:500])
        answer = (reply.get_json() or {}).get("response", {}) if reply.status_code == 200 else {}
        for cid, props in answer.items():
            for prop, value in props.items():
                self.values[f"{cid}.{prop}"] = value
        return len(reply.data)

    def refresh(self) -> int:
        """One tick: every callback it fires, one after another (each one's milliseconds go to
        ``samples``); their bytes in all."""
        self.values[f"{ids.REFRESH}.n_intervals"] += 1
        size = 0
        for key in self.tick:
            started = time.perf_counter()
            size += self.send(key)
            self.samples.setdefault(key, []).append((time.perf_counter() - started) * 1000)
        return size

    def tick_p50s(self, last: int) -> dict[str, float]:
        """The p50 of each callback of the tick over the ``last`` ticks, by its first output."""
        return {
            _first_output(key): statistics.median(self.samples[key][-last:]) for key in self.tick
        }

    def callback(self, output_id: str) -> str:
        """The key of the tick's callback that writes ``output_id``."""
        return next(key for key in self.tick if output_id in _output_ids(key))

    def timed(self, key: str, check: Callable[[dict[str, Any]], None]) -> Callable[[], int]:
        """A call that POSTs the callback ``key`` with the body of a refresh tick and checks
        its 200 answer with ``check``."""
        body = self.body(key)

        def call() -> int:
            reply = self.stack.browser.post(UPDATE, json=body)
            assert reply.status_code == 200, (key, reply.status_code, reply.text[:500])
            check(reply.get_json()["response"])
            return len(reply.data)

        return call


# ----------------------------------------------------------------------------- data


def populate_timelines(url: str, parallelisms: tuple[int, ...]) -> None:
    """Per parallelism n, job ``timeline-p{n}`` of 2 operators x n subtasks with one completed
    checkpoint #1: lognormal phases, and every 8th subtask of ``pv`` slow (a straggler)."""
    rng = random.Random(11)
    engine = create_db_engine(url)
    jobs, checkpoints, subtasks = [], [], []
    for n in parallelisms:
        job_id = f"timeline-p{n}"
        jobs.append(
            {
                "job_id": job_id,
                "name": f"pv-count-{n}",
                "status": "RUNNING",
                "attempt": 1,
                "created_at": T0,
                "updated_at": T0,
                "start_time": T0,
                "graph": {
                    "vertices": [
                        {"id": op, "name": name, "parallelism": n, "operators": [op]}
                        for op, name in OPERATORS
                    ],
                    "edges": [["events", "pv"]],
                },
                "config": {"state_backend": "rocksdb"},
                "checkpoint_config": {"interval_ms": 1000},
                "restart_strategy": {"restart-strategy.type": "none"},
                "restarts": 0,
            }
        )
        trigger, slowest = T0 + 5_000, 0.0
        for op, _ in OPERATORS:
            for subtask in range(n):
                delay = rng.lognormvariate(3.0, 0.4) * (3 if op == "pv" and subtask % 8 == 1 else 1)
                align = rng.lognormvariate(1.5, 0.5) if op == "pv" else 0.0
                sync, async_ = rng.lognormvariate(1.0, 0.3), rng.lognormvariate(2.5, 0.4)
                e2e = delay + align + sync + async_
                slowest = max(slowest, e2e)
                subtasks.append(
                    {
                        "job_id": job_id,
                        "checkpoint_id": 1,
                        "operator_id": op,
                        "subtask": subtask,
                        "attempt": 1,
                        "barrier_timestamp": trigger + int(delay),
                        "alignment_duration": align,
                        "alignment_buffered": int(align * 1000),
                        "alignment_buffered_records": int(align * 10),
                        "ack_timestamp": trigger + int(e2e),
                        "start_delay": delay,
                        "sync_duration": sync,
                        "async_duration": async_,
                        "state_size": 1 << 18,
                        "checkpointed_size": 1 << 14,
                        "end_to_end_duration": e2e,
                        "clock_flagged": False,
                        "declined_reason": None,
                        "ack": {
                            "handles": [
                                {
                                    "path": f"file:///chk/{job_id}/chk-1/{op}-{subtask}-a1",
                                    "size": 1 << 14,
                                    "checksum": "sha256:" + "ab" * 32,
                                    "key_group_start": subtask * 128 // n,
                                    "key_group_end": (subtask + 1) * 128 // n - 1,
                                }
                            ]
                        },
                    }
                )
        checkpoints.append(
            {
                "job_id": job_id,
                "checkpoint_id": 1,
                "attempt": 1,
                "epoch": 9,
                "kind": "checkpoint",
                "is_final": False,
                "status": "COMPLETED",
                "trigger_timestamp": trigger,
                "latest_ack_timestamp": trigger + int(slowest),
                "completion_timestamp": trigger + int(slowest),
                "end_to_end_duration": slowest,
                "state_size": 2 * n << 18,
                "checkpointed_size": 2 * n << 14,
                "alignment_buffered": 0,
                "num_subtasks": 2 * n,
                "num_acknowledged_subtasks": 2 * n,
                "external_path": f"file:///chk/{job_id}/chk-1",
                "discarded": False,
                "committed": True,
            }
        )
    with engine.begin() as conn:
        conn.execute(insert(Job), jobs)
        conn.execute(insert(Checkpoint), checkpoints)
        conn.execute(insert(CheckpointSubtask), subtasks)
    engine.dispose()
