"""Job authors import from the package root; the control plane's imports stay light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sparkpoint


@pytest.mark.parametrize("name", sparkpoint.__all__)
def test_every_public_name_resolves_to_the_object_its_module_defines(name: str) -> None:
    value = getattr(sparkpoint, name)
    assert value.__name__ == name
    assert name in dir(sparkpoint)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="NoSuchOperator"):
        sparkpoint.NoSuchOperator  # noqa: B018


def test_importing_the_protocol_does_not_load_the_job_library() -> None:
    heavy = ("sparkpoint.graph", "sparkpoint.connectors.sql_sink", "sparkpoint.state.backends")
    code = f"import sys, sparkpoint.protocol; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
