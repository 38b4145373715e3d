"""docs/rest.md is what the REST API's OpenAPI document generates (`make docs`)."""

from __future__ import annotations

from pathlib import Path

from sparkpoint_server.api.reference import markdown, openapi_document

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "rest.md"


def test_the_committed_reference_is_what_the_api_generates() -> None:
    generated = markdown(openapi_document())
    assert REFERENCE.read_text() == generated, "docs/rest.md is stale: run `make docs`"


def test_every_operation_is_in_the_reference_with_its_role() -> None:
    document = openapi_document()
    text = REFERENCE.read_text()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert f"### `{method.upper()} {path}`" in text
            if "x-required-role" in operation:
                assert f"Role: `{operation['x-required-role']}`" in text
