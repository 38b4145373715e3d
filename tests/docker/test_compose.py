"""docker/compose.yaml is a valid Compose file whose services start in order, on shared storage.

Validated against the compose-spec JSON schema after Compose's variable interpolation, as
``docker compose config`` does; no Docker engine is needed.
"""

from __future__ import annotations

import ast
import copy
import re
from typing import Any

import jsonschema
import pytest

from tests.docker.compose_file import (
    DOCKER_DIR,
    TEST_ENV,
    InterpolationError,
    command_list,
    compose_schema,
    interpolate,
    load_compose,
    raw_compose,
    service_environment,
    variables,
)

#: The services built from docker/Dockerfile, and the third-party ones.
SPARKPOINT_SERVICES = {"control-plane", "dashboard", "spark-master", "spark-worker", "pv-job"}
EXPECTED_SERVICES = SPARKPOINT_SERVICES | {"redis", "postgres"}


def _validator() -> jsonschema.protocols.Validator:
    schema = compose_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


def test_the_compose_file_validates_against_the_compose_spec_schema() -> None:
    errors = sorted(_validator().iter_errors(load_compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        (("services", "pv-job", "depends_on", "control-plane", "condition"), "service_ready"),
        (("services", "control-plane", "healthcheck", "interval"), ["5s"]),
        (("services", "dashboard", "restart_policy"), "always"),
    ],
)
def test_the_schema_refuses_a_broken_copy(path: tuple[str, ...], bad: Any) -> None:
    """The validation above can fail: a wrong condition, type or key is reported."""
    broken = copy.deepcopy(load_compose())
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    assert list(_validator().iter_errors(broken))


def test_the_services_are_the_product_and_what_it_needs() -> None:
    compose = load_compose()
    assert set(compose["services"]) == EXPECTED_SERVICES
    for name in SPARKPOINT_SERVICES:
        service = compose["services"][name]
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}, name
        assert service["image"] == "sparkpoint:local", name


def test_the_api_token_is_required_never_defaulted() -> None:
    """Without SPARKPOINT_API_TOKEN Compose stops with a message naming it (no default token)."""
    with pytest.raises(InterpolationError, match="SPARKPOINT_API_TOKEN"):
        load_compose({})
    compose = load_compose()
    for name in ("control-plane", "pv-job"):
        env = service_environment(compose["services"][name])
        assert env["SPARKPOINT_API_TOKEN"] == TEST_ENV["SPARKPOINT_API_TOKEN"]


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d}|${EMPTY:-d}|${EMPTY-d}|${UNSET-d}|$SET|$$SET", env) == (
        "x|d||d|x|$SET"
    )
    with pytest.raises(InterpolationError, match="EMPTY"):
        interpolate("${EMPTY:?give it}", env)
    assert interpolate("${EMPTY?give it}", env) == ""


def test_every_service_but_the_job_has_a_healthcheck_and_dependencies_wait_for_it() -> None:
    services = load_compose()["services"]
    for name, service in services.items():
        if name != "pv-job":
            assert service["healthcheck"]["test"][0] == "CMD", name
        for dependency, how in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert how == {"condition": "service_healthy"}, f"{name} -> {dependency}"
            assert "healthcheck" in services[dependency], dependency
    order = {
        "control-plane": {"redis", "postgres"},
        "dashboard": {"control-plane"},
        "spark-worker": {"spark-master"},
        "pv-job": {"control-plane", "spark-worker"},
    }
    assert {n: set(s.get("depends_on") or {}) for n, s in services.items() if n in order} == order


def _option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_healthchecks_ask_the_port_each_service_listens_on() -> None:
    """The Python one-liners compile and fetch the port (and path) their command serves."""
    services = load_compose()["services"]
    expected = {
        "control-plane": (_option(command_list(services["control-plane"]), "--port"), "/healthz"),
        "dashboard": (_option(command_list(services["dashboard"]), "--port"), "/"),
        "spark-master": (_option(command_list(services["spark-master"]), "--webui-port"), "/"),
        "spark-worker": (_option(command_list(services["spark-worker"]), "--webui-port"), "/"),
    }
    for name, (port, path) in expected.items():
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python3", "-c"], name
        ast.parse(test[3])
        assert f"'http://127.0.0.1:{port}{path}'" in test[3], name


def test_the_control_plane_serves_the_health_path_it_is_checked_on() -> None:
    from sparkpoint_server.api.health import router

    assert "/healthz" in {getattr(route, "path", None) for route in router.routes}


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> volume name."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}


def test_checkpoints_output_and_savepoints_are_on_volumes_shared_at_one_path() -> None:
    """The driver, the executors and the control plane see checkpoint storage at the same
    path: a `file://` checkpoint directory works on a cluster only on a shared mount."""
    compose = load_compose()
    services = compose["services"]
    job = command_list(services["pv-job"])
    checkpoint_dir = _option(job, "--checkpoint-dir")
    output = _option(job, "--output")
    assert checkpoint_dir == "file:///shared/chk"
    assert output.startswith("/shared/")
    for name in ("pv-job", "spark-worker", "control-plane"):
        mounts = _mounts(services[name])
        assert mounts.get("/shared") == "shared", name
        # The control plane's default savepoint directory, readable where restores read it.
        assert mounts.get("/data/savepoints") == "savepoints", name
    assert _mounts(services["control-plane"])["/data"] == "control-plane"
    assert service_environment(services["control-plane"])["SPARKPOINT_DATA_DIR"] == "/data"
    assert service_environment(services["control-plane"])["SPARKPOINT_STORAGE_ROOTS"] == "/shared"
    named = {v for s in services.values() for v in _mounts(s).values()}
    assert named == set(compose["volumes"])


def test_connected_services_reach_each_other_by_service_name() -> None:
    services = load_compose()["services"]
    plane = service_environment(services["control-plane"])
    job = service_environment(services["pv-job"])
    assert plane["REDIS_URL"] == job["REDIS_URL"] == "redis://redis:6379/0"
    assert plane["DATABASE_URL"] == "postgresql://sparkpoint:sparkpoint@postgres:5432/sparkpoint"
    postgres = service_environment(services["postgres"])
    assert (postgres["POSTGRES_USER"], postgres["POSTGRES_DB"]) == ("sparkpoint", "sparkpoint")
    api = f"http://control-plane:{_option(command_list(services['control-plane']), '--port')}"
    assert service_environment(services["dashboard"])["SPARKPOINT_API_URL"] == api
    assert job["SPARKPOINT_API_URL"] == api
    master = command_list(services["spark-master"])
    url = f"spark://{_option(master, '--host')}:{_option(master, '--port')}"
    assert url == "spark://spark-master:7077"
    assert command_list(services["spark-worker"])[2] == url
    assert _option(command_list(services["pv-job"]), "--master") == url
    # The driver's address (executors connect to it) and its Spark UI's, which the
    # dashboard's server may ask.
    assert job["SPARK_LOCAL_HOSTNAME"] == services["pv-job"]["hostname"] == "pv-job"
    spark_ui_hosts = service_environment(services["dashboard"])[
        "SPARKPOINT_DASHBOARD_SPARK_UI_HOSTS"
    ]
    assert spark_ui_hosts == "pv-job"


def test_the_readme_documents_every_variable_and_service() -> None:
    readme = (DOCKER_DIR / "README.md").read_text()
    text = (DOCKER_DIR / "compose.yaml").read_text()
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", readme))
    used = variables(text)
    for service in raw_compose()["services"].values():
        used |= set(service_environment(service))
    assert used - documented == set(), "undocumented in docker/README.md"
    for name in EXPECTED_SERVICES:
        assert f"`{name}`" in readme, name
