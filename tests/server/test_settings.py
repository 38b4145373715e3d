"""The control plane's settings from the environment: a bad value is refused at start,
naming the variable the operator set."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint_server.config import load_settings
from sparkpoint_server.errors import SettingsError

SECONDS = ["SPARKPOINT_HEARTBEAT_TIMEOUT", "SPARKPOINT_REDIS_RETRY_WINDOW"]


@pytest.mark.parametrize("variable", SECONDS)
@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf", "nan"])
def test_a_setting_in_seconds_is_positive_and_finite(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=f"^invalid setting {variable}: "):
        load_settings(data_dir=str(tmp_path))


def test_settings_in_seconds_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARKPOINT_HEARTBEAT_TIMEOUT", "7.5")
    monkeypatch.setenv("SPARKPOINT_REDIS_RETRY_WINDOW", "90")
    settings = load_settings(data_dir=str(tmp_path))
    assert settings.heartbeat_timeout_ms == 7500
    assert settings.redis_retry_window == 90.0


def test_a_port_out_of_range_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARKPOINT_EMBEDDED_REDIS_PORT", "70000")
    refused = r"^invalid setting SPARKPOINT_EMBEDDED_REDIS_PORT: .*65535"
    with pytest.raises(SettingsError, match=refused):
        load_settings(data_dir=str(tmp_path))


def test_a_data_directory_that_cannot_be_created_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    blocked = tmp_path / "file" / "data"
    refused = f"^invalid setting SPARKPOINT_DATA_DIR: cannot create {blocked}: Not a directory$"
    with pytest.raises(SettingsError, match=refused):
        load_settings(data_dir=str(blocked))
