"""Schemathesis against the REST API: every check, on a real control plane with real jobs.

The app is the one ``install_api`` builds, with the real coordination service on the real
Redis and SQLite (``tests/server/service_harness.py``; the other API tests cover PostgreSQL,
and one database keeps this module near a minute). Each operation gets a job of its own,
registered through the protocol, with a completed checkpoint and, for the status operations,
a request of their kind, so that a cancel or a restore drawn for one operation does not turn
the others into 409s. Valid generated ids are aimed at that job, except one in four, which
stays unknown (a 404). Every check runs (what ``--checks all`` selects: the default of
``call_and_validate``): no 5xx; every status, content type, header and body as documented;
invalid input refused; valid input accepted; a 405 naming the allowed methods; the token
required exactly where the schema declares it (schemathesis sends it only there), with reads
open and, in the second test, protected.
"""

from __future__ import annotations

import re
import uuid
import zlib
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from service_harness import Harness

from sparkpoint.limits import JOB_ID_PATTERN, MAX_NAME_LENGTH
from sparkpoint_server.api.openapi import BEARER

from .conftest import build_app

pytestmark = pytest.mark.slow  # minutes of generated requests: make test-slow

TOKEN = "fuzz-token-0123456789abcdef"
EXAMPLES = 4  # per operation (fuzzing phase): ~40 s here on two workers; CI stays under 30 min

# Inputs that the schema cannot judge: whether a directory is under the storage roots, whether
# a restart strategy's duration parses, whether a savepoint exists. A valid-looking one may be
# refused with 400 (its field named), as the operations' descriptions say.
CHECKED_BY_THE_SERVER = [
    "/jobs/{job_id}/savepoints",
    "/jobs/{job_id}/stop",
    "/jobs/{job_id}/restore",
    "/jobs/{job_id}/restart-strategy",
    "/jobs/{job_id}/checkpoints/config",
    "/savepoint-disposal",
]


def config(*operations: dict[str, Any]) -> SchemathesisConfig:
    """Schemathesis' settings: every check, both positive and negative data, the token."""
    return SchemathesisConfig.from_dict(
        {
            "seed": 1,
            "generation": {"max-examples": EXAMPLES, "mode": "all"},
            # The token goes only where the schema declares the security requirement: a read
            # that wanted it anyway would answer an undocumented 401.
            "auth": {"openapi": {BEARER: {"bearer": TOKEN}}},
            "operations": [
                {
                    "include-path": CHECKED_BY_THE_SERVER,
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "401", "404", "409", "422"]
                        }
                    },
                },
                *operations,
            ],
        }
    )


class Jobs:
    """Per operation: a registered, RUNNING job with a completed checkpoint, and for the
    status operations a request of their kind (IN_PROGRESS)."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.by_operation: dict[str, tuple[str, str | None]] = {}

    def of(self, path: str, method: str) -> tuple[str, str | None]:
        """The job id and request id that ``method path`` uses."""
        key = f"{method} {path}"
        if key not in self.by_operation:
            h = self.harness
            h.job_id = f"fuzz-{len(self.by_operation)}-{uuid.uuid4().hex[:6]}"
            h.start()
            h.ack_all(1, h.trigger_periodic())
            self.by_operation[key] = (h.job_id, self._request(path, h.job_id))
        return self.by_operation[key]

    def _request(self, path: str, job_id: str) -> str | None:
        plane = self.harness.plane
        if not path.endswith("/{request_id}"):
            return None
        kind = path.split("/")[-2]
        if kind == "checkpoints":
            return plane.trigger_checkpoint(job_id)
        if kind == "savepoints":
            return plane.trigger_savepoint(job_id, None, False)
        if kind == "stop":
            return plane.stop_with_savepoint(job_id, None)
        return plane.restore(job_id, 1, None)


def use_real_ids(case: Any, jobs: Jobs) -> None:
    """Aim valid generated ids at the operation's job (three in four; the others stay unknown
    and answer 404): its id, its request, checkpoint 1, operator ``source``."""
    params = case.path_parameters or {}
    job_id = params.get("job_id")
    if not isinstance(job_id, str) or not re.fullmatch(JOB_ID_PATTERN, job_id):
        return
    if zlib.crc32(job_id.encode()) % 4 == 0:
        return
    params["job_id"], request_id = jobs.of(case.operation.path, case.operation.method)
    if request_id is not None and _valid(params.get("request_id"), 36):
        params["request_id"] = request_id
    if _valid(params.get("operator_id"), MAX_NAME_LENGTH):
        params["operator_id"] = "source"


def _valid(value: Any, max_length: int) -> bool:
    """A path parameter as the schema allows it (an invalid one stays: negative testing)."""
    return isinstance(value, str) and 0 < len(value) <= max_length


@pytest.fixture
def jobs(harness: Harness) -> Jobs:
    return Jobs(harness)


# One app per test function, not per generated case: a new FastAPI app compiles its routes at
# its first request (~90 ms here), which per case was most of this module's minutes.
@pytest.fixture
def open_app(harness: Harness) -> FastAPI:
    return build_app(harness.sessions, api_token=TOKEN, control_plane=harness.plane)


@pytest.fixture
def protected_app(harness: Harness) -> FastAPI:
    return build_app(
        harness.sessions, api_token=TOKEN, protect_reads=True, control_plane=harness.plane
    )


# Each schema is read once, from an app with the settings of the test's app; the calls go to
# the test's app, on the test database. With protected reads only the reads differ.
open_reads = schemathesis.openapi.from_asgi(
    "/openapi.json", build_app(None, api_token=TOKEN), config=config()
)
protected_reads = schemathesis.openapi.from_asgi(
    "/openapi.json",
    build_app(None, api_token=TOKEN, protect_reads=True),
    config=config({"include-method": ["POST", "PUT", "PATCH"], "enabled": False}),
)
HYPOTHESIS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
    database=None,
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@open_reads.parametrize()
@HYPOTHESIS
def test_every_operation_answers_as_documented(case: Any, open_app: FastAPI, jobs: Jobs) -> None:
    use_real_ids(case, jobs)
    case.call_and_validate(app=open_app)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@protected_reads.parametrize()
@HYPOTHESIS
def test_with_protected_reads_every_operation_answers_as_documented(
    case: Any, protected_app: FastAPI, jobs: Jobs
) -> None:
    use_real_ids(case, jobs)
    case.call_and_validate(app=protected_app)
