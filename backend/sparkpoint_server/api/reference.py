"""The REST reference (``docs/rest.md``), generated from the API's own OpenAPI document.

``python -m sparkpoint_server.api.reference > docs/rest.md`` (``make docs``) writes it; a test
checks that the committed file is what the code generates, so the reference never drifts from
what the server answers.
"""

from __future__ import annotations

import sys
from typing import Any

from fastapi import FastAPI

HEADER = """# REST API reference

Generated from the control plane's OpenAPI document (`GET /openapi.json` on a running server;
`make docs` regenerates this file). Paths and shapes follow Flink's REST API where Flink has
the resource. Every call carries `Authorization: Bearer <token>`; the role each operation needs
is listed with it (reads need none unless the server protects them).
"""

METHODS = ("get", "post", "put", "patch", "delete")


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of the REST API, as ``sparkpoint server`` serves it."""
    from sparkpoint_server.api import install_api
    from sparkpoint_server.config import Settings

    app = FastAPI(title="Sparkpoint control plane")
    # A token (so that roles are documented) and open reads: what `sparkpoint server` does
    # unless SPARKPOINT_PROTECT_READS is set; explicit, whatever this environment says.
    app.state.settings = Settings(api_token="a-token-for-the-reference", protect_reads=False)
    install_api(app)
    document: dict[str, Any] = app.openapi()
    return document


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _schema_name(schema: dict[str, Any] | None) -> str:
    """A response or body schema as a short name: its ``$ref`` name, or its type."""
    if not schema:
        return ""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items'))}"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_name(s) for s in schema[key] if s.get("type") != "null")
    return f"`{schema.get('type', 'object')}`"


def _parameters(operation: dict[str, Any]) -> list[str]:
    rows = []
    for param in operation.get("parameters", []):
        if param.get("in") == "header":
            continue
        required = "required" if param.get("required") else "optional"
        rows.append(
            f"| `{param['name']}` | {param['in']}, {required} | "
            f"{_one_line(param.get('description'))} |"
        )
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if body is not None:
        rows.append(f"| body | JSON | {_schema_name(body.get('schema'))} |")
    if not rows:
        return []
    return ["| parameter | where | meaning |", "|---|---|---|", *rows, ""]


def _responses(operation: dict[str, Any], common: dict[tuple[str, str], str]) -> list[str]:
    rows = ["| status | meaning | body |", "|---|---|---|"]
    for status, response in sorted(operation.get("responses", {}).items()):
        content = response.get("content", {}).get("application/json", {})
        text = _one_line(response.get("description"))
        if (status, text) in common:
            text = f"see [errors](#errors): {common[(status, text)]}"
        rows.append(f"| {status} | {text} | {_schema_name(content.get('schema'))} |")
    return [*rows, ""]


def _common_responses(
    operations: list[tuple[str, str, dict[str, Any]]],
) -> dict[tuple[str, str], str]:
    """Error answers shared by several operations (listed once): (status, text) -> a label."""
    seen: dict[tuple[str, str], int] = {}
    for _, _, operation in operations:
        for status, response in operation.get("responses", {}).items():
            if status.startswith(("4", "5")):
                key = (status, _one_line(response.get("description")))
                seen[key] = seen.get(key, 0) + 1
    shared = sorted(key for key, n in seen.items() if n >= 3)
    labels: dict[tuple[str, str], str] = {}
    for status, text in shared:
        same_status = [k for k in shared if k[0] == status]
        labels[(status, text)] = (
            status if len(same_status) == 1 else f"{status}.{same_status.index((status, text)) + 1}"
        )
    return labels


def markdown(document: dict[str, Any]) -> str:
    """The reference: operations grouped by tag, each with its parameters and responses."""
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is not None:
                tag = (operation.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((path, method, operation))
    everything = [op for ops in by_tag.values() for op in ops]
    common = _common_responses(everything)
    out = [HEADER]
    out.append("| operation | summary |")
    out.append("|---|---|")
    for tag in sorted(by_tag):
        for path, method, operation in by_tag[tag]:
            out.append(f"| `{method.upper()} {path}` | {_one_line(operation.get('summary'))} |")
    out.append("")
    out.append("## Errors")
    out.append("")
    out.append('Every error answers `{"errors": ["<message>", ...]}` with messages that name')
    out.append("the problem. These answers are common to many operations:")
    out.append("")
    out.append("| | status | when |")
    out.append("|---|---|---|")
    for (status, text), label in sorted(common.items(), key=lambda kv: kv[1]):
        out.append(f"| {label} | {status} | {text} |")
    out.append("")
    for tag in sorted(by_tag):
        out.append(f"## {tag}")
        out.append("")
        for path, method, operation in by_tag[tag]:
            out.append(f"### `{method.upper()} {path}`")
            out.append("")
            summary = _one_line(operation.get("summary"))
            role = operation.get("x-required-role")
            out.append(f"**{summary}.**" + (f" Role: `{role}`." if role else ""))
            out.append("")
            if operation.get("description"):
                out.append(_one_line(operation["description"]).replace("\\|", "|"))
                out.append("")
            out += _parameters(operation)
            out += _responses(operation, common)
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(markdown(openapi_document()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
