"""``sparkpoint server`` never runs with an open or guessable API: an empty or short token,
from ``SPARKPOINT_API_TOKEN`` or the data directory's ``api-token`` file, stops it at once with
one line and exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint_server import server
from sparkpoint_server.config import load_settings
from sparkpoint_server.data_dir_lock import DataDirectoryLock
from sparkpoint_server.errors import SettingsError

HINT = (
    "it needs at least 16 characters (unset SPARKPOINT_API_TOKEN and delete the token file "
    "to have one generated)"
)


@pytest.fixture(autouse=True)
def _no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKPOINT_API_TOKEN", raising=False)


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ("", "empty"),
        ("\n", "empty"),
        ("   \n", "empty"),
        ("fifteen-chars-x\n", "15 characters long"),
    ],
)
def test_a_token_file_too_short_is_refused_naming_it(
    tmp_path: Path, content: str, what: str
) -> None:
    (tmp_path / "api-token").write_text(content)

    with pytest.raises(SettingsError) as err:
        server.ensure_token(load_settings(data_dir=str(tmp_path)))

    assert str(err.value) == f"the API token in {tmp_path / 'api-token'} is {what}; {HINT}"


@pytest.mark.parametrize(("token", "what"), [("", "empty"), ("s3cret", "6 characters long")])
def test_a_variable_too_short_is_refused_even_when_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str, what: str
) -> None:
    monkeypatch.setenv("SPARKPOINT_API_TOKEN", token)

    with pytest.raises(SettingsError) as err:
        server.ensure_token(load_settings(data_dir=str(tmp_path)))

    assert str(err.value) == f"the API token in SPARKPOINT_API_TOKEN is {what}; {HINT}"
    assert not (tmp_path / "api-token").exists()


def test_tokens_of_16_characters_or_more_are_used(tmp_path: Path) -> None:
    (tmp_path / "api-token").write_text("sixteen-chars-ok\n")

    settings, generated = server.ensure_token(load_settings(data_dir=str(tmp_path)))

    assert (settings.api_token, generated) == ("sixteen-chars-ok", False)


def test_a_generated_token_is_long_enough_and_kept(tmp_path: Path) -> None:
    settings, generated = server.ensure_token(load_settings(data_dir=str(tmp_path)))

    assert generated
    assert settings.api_token is not None and len(settings.api_token) >= 16
    assert (tmp_path / "api-token").read_text() == settings.api_token + "\n"


def test_the_server_exits_2_with_one_line_on_an_empty_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "api-token").write_text("")
    monkeypatch.setenv("SPARKPOINT_DATA_DIR", str(tmp_path))

    def run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the server started with an empty token")

    monkeypatch.setattr(server.uvicorn, "run", run)

    status = server.serve("127.0.0.1", 0)

    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert err == f"sparkpoint server: the API token in {tmp_path / 'api-token'} is empty; {HINT}\n"
    lock = DataDirectoryLock(tmp_path)  # released: another server may start
    lock.acquire()
    lock.release()
