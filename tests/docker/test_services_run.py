"""The compose file's services, run here from their own commands: the control plane migrates a
fresh PostgreSQL database at start, every health check fails before its service is up and
passes once it is, the worker registers with the master, and the PV job runs on that cluster,
connected to the control plane, to an exact committed output."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from sparkpoint.testing import committed_lines
from sparkpoint_server.config import normalize_database_url
from sparkpoint_server.storage.db import alembic_config
from tests.docker.compose_file import TEST_ENV, load_compose
from tests.docker.local_stack import (
    HOST,
    Localization,
    LocalService,
    start_service,
)
from tests.server.conftest import PG_ADMIN_URL
from tests.support.redis_server import REDIS_URL
from tests.support.waiting import wait_for

#: The control plane migrates a fresh database on the tests' PostgreSQL (DATABASE_TEST_URL).
pytestmark = [pytest.mark.postgres, pytest.mark.slow]

#: The long-running services built from the image (Redis and PostgreSQL are the tests' own).
ORDER = ("control-plane", "dashboard", "spark-master", "spark-worker")
#: The job, short and unpaced, through the variables docker/README.md documents.
PV_EVENTS = 20_000
JOB_VARIABLES = {**TEST_ENV, "PV_EVENTS": str(PV_EVENTS), "PV_RATE": "0"}


#: The tests' Redis, in a database no other test uses: the compose commands keep the default
#: stream prefix, which would otherwise meet other tests' streams.
STACK_REDIS_URL = re.sub(r"(/\d*)?$", "/11", REDIS_URL, count=1)


def _clear_streams() -> None:
    """Delete what the stack's control plane and job left in their Redis database."""
    conn = redis.Redis.from_url(STACK_REDIS_URL)
    try:
        keys = list(conn.scan_iter("sparkpoint:*"))
        if keys:
            conn.delete(*keys)
    finally:
        conn.close()


class Stack:
    """The started services and where they live here."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.where = Localization(root, STACK_REDIS_URL, database_url)
        self.database_url = database_url
        self.services: dict[str, LocalService] = {}

    @staticmethod
    def extra_env(name: str) -> dict[str, str]:
        """What the test adds: Spark's daemons bound to 127.0.0.1, and small."""
        if name in ("spark-master", "spark-worker"):
            return {"SPARK_LOCAL_IP": HOST, "SPARK_DAEMON_MEMORY": "256m"}
        return {}

    def start(self) -> None:
        """Start the services in waves, as Compose does: together, those whose dependencies
        are all healthy (Redis and PostgreSQL are up already); then wait for their health."""
        services = load_compose()["services"]
        ready = {"redis", "postgres"}
        while len(self.services) < len(ORDER):
            wave = [
                n
                for n in ORDER
                if n not in self.services and set(services[n].get("depends_on") or {}) <= ready
            ]
            assert wave, f"depends_on of {set(ORDER) - set(self.services)} can never be met"
            for name in wave:
                self.services[name] = start_service(
                    name, services[name], self.where, self.extra_env(name)
                )
            for name in wave:
                self.services[name].wait_healthy()
            ready |= set(wave)

    def stop(self) -> None:
        for service in reversed(list(self.services.values())):
            service.stop()

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"http://{HOST}:{self.where.ports['8081']}",
            headers={"Authorization": f"Bearer {TEST_ENV['SPARKPOINT_API_TOKEN']}"},
            timeout=10,
        )


@pytest.fixture(scope="module")
def fresh_database() -> Iterator[str]:
    """A PostgreSQL database of its own, empty: the control plane migrates it at start."""
    name = f"sparkpoint_docker_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fresh_database: str) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("compose"), fresh_database)
    _clear_streams()
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        _clear_streams()


def test_health_checks_fail_while_nothing_listens() -> None:
    """The compose health checks can fail: run before anything listens on their ports."""
    where = Localization(Path("/nonexistent"), STACK_REDIS_URL, "postgresql://unused")
    compose = load_compose()
    for name in ORDER:
        check = [where.value(a) for a in compose["services"][name]["healthcheck"]["test"][1:]]
        done = subprocess.run(check, capture_output=True, timeout=30)
        assert done.returncode != 0, name


def test_every_service_passes_its_health_check(stack: Stack) -> None:
    for name, service in stack.services.items():
        assert service.proc.poll() is None, name
        assert service.healthy(), name


def test_the_control_plane_migrated_postgresql_at_start(stack: Stack) -> None:
    head = ScriptDirectory.from_config(alembic_config(stack.database_url)).get_current_head()
    engine = create_engine(normalize_database_url(stack.database_url))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head
    finally:
        engine.dispose()


def test_the_worker_registered_with_the_master_with_its_cores(stack: Stack) -> None:
    ui = f"http://{HOST}:{stack.where.ports['8080']}/json/"

    def alive() -> list[Any]:
        with urllib.request.urlopen(ui, timeout=10) as answer:
            state = json.load(answer)
        return [w for w in state["workers"] if w["state"] == "ALIVE"]

    # The worker's health check is its own UI; it registers with the master a moment later.
    workers = wait_for("the worker to register with the master", alive, timeout_s=60)
    assert [w["cores"] for w in workers] == [2]


@pytest.mark.spark
def test_the_pv_job_runs_on_the_cluster_connected_to_the_control_plane(stack: Stack) -> None:
    """``pv-job``'s command, on the master and the worker above, registered with the control
    plane through its API token, checkpointing into the shared directory: it finishes with the
    exact counts, and the control plane saw it finish."""
    service = load_compose(JOB_VARIABLES)["services"]["pv-job"]
    job = start_service("pv-job", service, stack.where, stack.extra_env("pv-job"))
    try:
        code = job.proc.wait(timeout=480)
    finally:
        job.stop()
    log = job.log.read_text()
    assert code == 0, log[-4000:]
    final: dict[str, int] = {}
    for line in committed_lines(str(stack.where.path("/shared") / "output")):
        record = json.loads(line)
        final[record["app_id"]] = max(final.get(record["app_id"], 0), record["pv"])
    assert len(final) == 10
    assert sum(final.values()) == PV_EVENTS
    with stack.api() as api:
        jobs = api.get("/jobs").json()["jobs"]
        assert [j["status"] for j in jobs] == ["FINISHED"], jobs
        job_id = jobs[0]["id"]
        history = api.get(f"/jobs/{job_id}/checkpoints").json()["history"]
    assert any(h["status"] == "COMPLETED" for h in history)
    assert (stack.where.path("/shared") / "chk" / job_id).is_dir()
