"""docker/Dockerfile builds from what the repository holds, and the variables the image and the
compose file set are ones that Sparkpoint or PySpark read."""

from __future__ import annotations

import fnmatch
import re
import sys
import zipfile
from pathlib import Path

from sparkpoint_dashboard.settings import DashboardSettings
from sparkpoint_server.config import Settings
from tests.docker.compose_file import (
    REPO,
    Instruction,
    dockerfile_instructions,
    dockerignore_patterns,
    load_compose,
    service_environment,
)
from tests.docker.test_compose import SPARKPOINT_SERVICES

if sys.version_info >= (3, 11):
    import tomllib
else:  # check-jsonschema installs tomli on 3.10
    import tomli as tomllib


def _of(keyword: str) -> list[Instruction]:
    return [i for i in dockerfile_instructions() if i.keyword == keyword]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (later patterns win; a
    pattern also excludes what lies under a matching directory)."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negated = pattern.startswith("!")
        bare = pattern.lstrip("!").rstrip("/")
        if bare.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, bare[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(prefix, bare) for prefix in prefixes)
        if hit:
            ignored = not negated
    return ignored


def test_the_base_image_is_python_311_slim_with_a_jre_17() -> None:
    assert _of("FROM")[0].arguments.startswith("python:3.11-slim")
    runs = " ".join(i.arguments for i in _of("RUN"))
    assert "openjdk-17-jre-headless" in runs
    assert "--no-install-recommends" in runs


def test_copy_sources_exist_and_reach_the_build_context() -> None:
    """Every COPY source is in the repository (the context is its root, as compose.yaml
    builds it) and .dockerignore does not exclude it."""
    patterns = dockerignore_patterns()
    copies = _of("COPY")
    assert copies
    sources = [src for c in copies for src in c.arguments.split()[:-1]]
    for source in sources:
        assert (REPO / source).exists(), source
        assert not _ignored(source, patterns), f"{source} is excluded by .dockerignore"
    # What the package needs to install: pyproject.toml, its readme, the package roots.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    roots = project["tool"]["setuptools"]["packages"]["find"]["where"]
    needed = {"pyproject.toml", project["project"]["readme"], "migrations", *roots}
    assert needed <= set(sources)


def test_dockerignore_keeps_local_state_out_and_is_checked_by_this_test() -> None:
    patterns = dockerignore_patterns()
    for path in (".venv/bin/python", ".sparkpoint/server/api-token", "docker/.env", ".git/HEAD"):
        assert _ignored(path, patterns), path
    assert not _ignored("jobs/sparkpoint/cli.py", patterns)
    assert _ignored("jobs/sparkpoint/__pycache__/cli.cpython-311.pyc", patterns)


def test_the_package_is_installed_editable_with_its_s3_extra_and_no_dev_tools() -> None:
    """Editable: the control plane applies the migrations that live beside the packages."""
    installs = [i.arguments for i in _of("RUN") if "pip install" in i.arguments]
    assert installs == ["pip install --no-cache-dir -e '.[s3]'"]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "s3" in extras
    migrations = REPO / "backend" / "sparkpoint_server" / "storage" / "db.py"
    assert 'parents[3] / "migrations"' in migrations.read_text()


def test_the_image_runs_as_a_non_root_user_owning_the_volume_paths() -> None:
    users = _of("USER")
    assert users and users[-1].arguments not in ("root", "0")
    runs = " ".join(i.arguments for i in _of("RUN"))
    assert f"useradd --create-home --uid 10001 {users[-1].arguments}" in runs
    mounted = {
        v.split(":")[1]
        for name in SPARKPOINT_SERVICES
        for v in load_compose()["services"][name].get("volumes", [])
    }
    chown = re.search(r"chown -R \S+ ([^&]+)", runs)
    assert chown is not None
    owned = chown.group(1).split()
    made = re.search(r"mkdir -p ([^&]+)", runs)
    assert made is not None
    for path in mounted:
        assert any(d == path or d.startswith(path + "/") for d in made.group(1).split()), path
        assert any(path == o or path.startswith(o + "/") for o in owned), path


def _settings_variables() -> set[str]:
    """The variables the control plane's and the dashboard's settings classes read."""
    names: set[str] = set()
    for cls in (Settings, DashboardSettings):
        prefix = str(cls.model_config.get("env_prefix", ""))
        for field_name, field in cls.model_fields.items():
            alias = field.validation_alias
            names.add(alias if isinstance(alias, str) else (prefix + field_name).upper())
    return names


def _sources() -> str:
    """The text of Sparkpoint's runtime, of PySpark's scripts and top-level modules, and the
    strings of Spark's ``Utils`` class."""
    import pyspark

    pyspark_home = Path(pyspark.__file__).parent
    paths = [
        *(REPO / "jobs" / "sparkpoint").rglob("*.py"),
        *(pyspark_home / "bin").iterdir(),
        *pyspark_home.glob("*.py"),
    ]
    texts = [p.read_text(errors="replace") for p in paths if p.is_file()]
    # The variables Spark's JVM reads itself (SPARK_LOCAL_HOSTNAME, ...): Utils' constants.
    jar = next((pyspark_home / "jars").glob("spark-core_*.jar"))
    with zipfile.ZipFile(jar) as classes:
        constants = classes.read("org/apache/spark/util/Utils$.class")
    texts += (f'"{name.decode()}"' for name in re.findall(rb"[A-Z][A-Z0-9_]{3,}", constants))
    return "\n".join(texts)


def _read_in(name: str, text: str) -> bool:
    """Whether ``text`` reads variable ``name``: a quoted literal or a shell ``$NAME``."""
    return re.search(rf"[\"']{name}[\"']|\$\{{?{name}\b", text) is not None


def test_every_variable_the_image_and_compose_set_is_read_by_the_code() -> None:
    """Settings fields for the servers; names the runtime or PySpark (scripts and modules)
    read for the rest: a typo (SPARKPOINT_API_ULR) would be set and silently ignored."""
    settings = _settings_variables()
    assert {"REDIS_URL", "DATABASE_URL", "SPARKPOINT_DATA_DIR", "SPARKPOINT_API_URL"} <= settings
    services = load_compose()["services"]
    set_here = {n for name in SPARKPOINT_SERVICES for n in service_environment(services[name])}
    for env in _of("ENV"):
        set_here |= set(re.findall(r"([A-Z][A-Z0-9_]*)=", env.arguments))
    assert {"PYSPARK_PYTHON", "SPARK_LOCAL_HOSTNAME", "SPARKPOINT_STORAGE_ROOTS"} <= set_here
    python_own = {"PYTHONUNBUFFERED"}  # read by the interpreter itself
    text = _sources()
    unread = {n for n in set_here - python_own - settings if not _read_in(n, text)}
    assert unread == set()
    assert not _read_in("SPARKPOINT_API_ULR", text)
