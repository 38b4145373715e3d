"""Every command of docker/compose.yaml is one that runs here: the ``sparkpoint`` commands parse
with the real command line, product options and job arguments; ``spark-class`` names classes
of the installed PySpark with options their own usage lists."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import sparkpoint.cli
from sparkpoint import StreamExecutionEnvironment
from tests.docker.compose_file import REPO, command_list, load_compose, service_environment

SPARK_CLASSES = {
    "spark-master": "org.apache.spark.deploy.master.Master",
    "spark-worker": "org.apache.spark.deploy.worker.Worker",
}


def _service(name: str) -> dict[str, Any]:
    service: dict[str, Any] = load_compose()["services"][name]
    return service


def _dispatched(monkeypatch: pytest.MonkeyPatch, command: list[str]) -> tuple[str, tuple[Any, ...]]:
    """Parse ``command`` with ``sparkpoint``'s own parser; return what it would start, and how."""
    calls: list[tuple[str, tuple[Any, ...]]] = []

    def starter(target: str) -> Any:
        def start(*args: Any) -> int:
            calls.append((target, args))
            return 0

        return start

    for target in ("_server", "_dashboard", "_run"):
        monkeypatch.setattr(sparkpoint.cli, target, starter(target))
    assert command[0] == "sparkpoint"
    assert sparkpoint.cli.main(command[1:]) == 0
    assert len(calls) == 1
    return calls[0]


def test_the_control_plane_command_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _dispatched(monkeypatch, command_list(_service("control-plane"))) == (
        "_server",
        ("0.0.0.0", 8081),
    )


def test_the_dashboard_command_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _dispatched(monkeypatch, command_list(_service("dashboard"))) == (
        "_dashboard",
        ("0.0.0.0", 8050, None),
    )


def test_a_misspelled_server_option_fails_to_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: the real parser refuses what it does not know."""
    with pytest.raises(SystemExit):
        _dispatched(monkeypatch, ["sparkpoint", "server", "--hots", "0.0.0.0"])


def _pv_count() -> ModuleType:
    path = REPO / "jobs" / "examples" / "pv_count.py"
    spec = importlib.util.spec_from_file_location("pv_count_in_compose", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_job_command_parses_as_product_options_and_job_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``sparkpoint run`` gets the job file (relative to the image's WORKDIR, the repository's
    root) and its arguments; the product's option parser and the job's own accept them."""
    service = _service("pv-job")
    target, (job, args) = _dispatched(monkeypatch, command_list(service))
    assert target == "_run"
    assert (REPO / job).is_file()
    for name, value in service_environment(service).items():
        monkeypatch.setenv(name, value)
    pv_count = _pv_count()
    env = StreamExecutionEnvironment.from_args(list(args))
    job_args = pv_count.build(env, env.args)
    options = env.options
    assert options.master == "spark://spark-master:7077"
    assert not options.standalone
    assert options.redis_url == "redis://redis:6379/0"
    assert options.checkpoint_dir == "file:///shared/chk"
    assert options.checkpoint_storage == "filesystem"
    assert options.checkpoint.interval_ms == 1000
    assert options.checkpoint.retained == 5
    assert options.local_dir == "/tmp/sparkpoint-local"
    assert (job_args.events, job_args.apps, job_args.rate) == (2_400_000, 10, 20_000)
    assert job_args.output == "/shared/output"


def test_a_misspelled_job_option_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkpoint.errors import ConfigurationError

    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/0")
    with pytest.raises(ConfigurationError, match="--checkpoint-interval"):
        StreamExecutionEnvironment.from_args(
            ["--checkpoint-intervall", "1", "--output", "/o"], job_options=["--output"]
        )


def _pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@pytest.mark.parametrize("name", sorted(SPARK_CLASSES))
def test_spark_class_names_a_class_of_the_installed_pyspark(name: str) -> None:
    command = command_list(_service(name))
    assert command[0] == "spark-class"
    assert command[1] == SPARK_CLASSES[name]
    # pip installs PySpark's scripts beside the interpreter: /usr/local/bin in the image.
    assert (Path(sys.executable).parent / "spark-class").is_file()
    entry = command[1].replace(".", "/") + ".class"
    jars = sorted((_pyspark_home() / "jars").glob("spark-core_*.jar"))
    assert jars, "PySpark ships no spark-core jar"
    with zipfile.ZipFile(jars[0]) as jar:
        assert entry in jar.namelist()


def _usage_options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", text.split("Options:", 1)[-1]))


def test_spark_master_and_worker_options_are_in_their_usage() -> None:
    """Runs ``spark-class CLASS --help`` of the installed PySpark (the JVM prints its usage)
    and checks every option the compose file gives is listed, and the worker's master URL."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SPARK_HOME", None)
    helps = {
        name: subprocess.Popen(
            ["spark-class", cls, "--help"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, cls in SPARK_CLASSES.items()
    }
    usages = {name: proc.communicate(timeout=180)[0] for name, proc in helps.items()}
    for name, usage in usages.items():
        assert f"Usage: {SPARK_CLASSES[name].rsplit('.', 1)[1]} [options]" in usage, usage
        given = {a for a in command_list(_service(name))[2:] if a.startswith("-")}
        assert given, name
        assert given <= _usage_options(usage), (name, given - _usage_options(usage))
    assert "spark://hostname:port" in usages["spark-worker"]
    master_url = command_list(_service("spark-worker"))[2]
    assert re.fullmatch(r"spark://[a-z-]+:\d+", master_url)
