"""docker/compose.yaml and docker/Dockerfile as data, read the way Docker Compose reads them.

No Docker engine runs where the tests run, so the tests read the files themselves: the compose
file with Compose's variable interpolation (``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
``${VAR:?message}``, ``${VAR?message}``, ``$VAR``, ``$$``), the Dockerfile's instructions, and
the compose-spec JSON schema that the ``check-jsonschema`` package ships.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

#: What the tests put in docker/.env (the one variable without a default).
TEST_ENV = {"SPARKPOINT_API_TOKEN": "a-test-token-of-32-characters-xx"}

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|:\?|\?)(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


class InterpolationError(ValueError):
    """A required variable (``${VAR:?message}``) is unset or empty: Compose stops with it."""


def interpolate(text: str, env: dict[str, str]) -> str:
    """``text`` with Compose's variable references replaced from ``env``.

    Raises:
        InterpolationError: naming a required variable that ``env`` lacks, with its message.
    """

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["named"]
        value = env.get(name)
        op, arg = match["op"], match["arg"] or ""
        if op == ":-":
            return value if value else arg
        if op == "-":
            return arg if value is None else value
        if op in (":?", "?") and (value is None or (op == ":?" and not value)):
            raise InterpolationError(f"required variable {name} is missing a value: {arg}")
        return value or ""

    return _VARIABLE.sub(replace, text)


def variables(text: str) -> set[str]:
    """The names of the variables that ``text`` refers to."""
    return {m["braced"] or m["named"] for m in _VARIABLE.finditer(text) if not m["escaped"]}


def _substituted(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_substituted(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _substituted(value, env) for key, value in node.items()}
    return node


def raw_compose() -> dict[str, Any]:
    """docker/compose.yaml as written (anchors and ``<<`` merges resolved)."""
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """docker/compose.yaml after interpolation with ``env`` (default :data:`TEST_ENV`)."""
    substituted: dict[str, Any] = _substituted(raw_compose(), TEST_ENV if env is None else env)
    return substituted


def compose_schema() -> dict[str, Any]:
    """The compose-spec JSON schema (the copy ``check-jsonschema`` vendors, with its licence)."""
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((vendor / "compose-spec.json").read_text())
    return schema


def service_environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's ``environment`` (a mapping or a list of ``NAME=value``) as a dict."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def command_list(service: dict[str, Any]) -> list[str]:
    """A service's ``command`` as an argument list (the exec form this file uses)."""
    command = service["command"]
    assert isinstance(command, list), f"use the exec form (a list) for commands: {command!r}"
    return [str(arg) for arg in command]


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword and its arguments (continuations joined)."""

    keyword: str
    arguments: str


def dockerfile_instructions() -> list[Instruction]:
    """The instructions of docker/Dockerfile, without comments."""
    instructions: list[Instruction] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    return instructions


def dockerignore_patterns() -> list[str]:
    """The patterns of .dockerignore (no comments, no blank lines)."""
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]
