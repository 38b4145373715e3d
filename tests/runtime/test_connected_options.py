"""Options of connected mode, and which authority the driver runs a job under."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples import pv_count
from sparkpoint import cli
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.errors import ConfigurationError
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions, parse_job_options
from sparkpoint.runtime.authority import InProcessAuthority
from sparkpoint.runtime.connected import ControlPlaneAuthority
from sparkpoint.runtime.control_plane_link import ControlPlaneLink
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.signing import JOB_KEY_ENV, SECRET_FILE, driver_job_key, job_key
from sparkpoint.supervisor import PREVIOUS_FAILURE_ENV, SUPERVISED_ENV
from sparkpoint.testing import ListSource
from sparkpoint.transport import ControlPlaneLostError, RedisUnreachableError, TransportError

from ..support.redis_server import REDIS_URL


@pytest.fixture
def no_redis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No REDIS_URL, and a control-plane data directory without ``redis.url``."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("SPARKPOINT_DATA_DIR", str(tmp_path))
    return tmp_path


def test_connected_mode_without_a_control_plane_says_how_to_get_one(no_redis: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_job_options(["--checkpoint-interval", "1"])
    message = str(err.value)
    assert "start `sparkpoint server`" in message and "REDIS_URL" in message
    assert "--standalone" in message


def test_the_redis_url_comes_from_the_option_the_environment_or_the_servers_file(
    no_redis: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (no_redis / "redis.url").write_text("redis://127.0.0.1:7777/0\n")
    assert parse_job_options([])[0].redis_url == "redis://127.0.0.1:7777/0"
    monkeypatch.setenv("REDIS_URL", "redis://env:6379/1")
    assert parse_job_options([])[0].redis_url == "redis://env:6379/1"
    opts, rest = parse_job_options(
        [
            *("--redis-url", "redis://cli:6379/2", "--stream-prefix", "team-a"),
            *("--control-plane-timeout", "2.5", "--events", "10"),
        ]
    )
    assert (opts.standalone, opts.redis_url, opts.stream_prefix) == (
        False,
        "redis://cli:6379/2",
        "team-a",
    )
    assert opts.control_plane_timeout_ms == 2500 and rest == ["--events", "10"]
    assert JobOptions().control_plane_timeout_ms == 60_000


def test_the_stream_prefix_is_the_servers_by_default(
    no_redis: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sparkpoint server`` reads SPARKPOINT_STREAM_PREFIX: a job run from the same shell
    talks to it without saying the prefix again (it waited for an answer on the wrong
    streams and failed after the control-plane timeout)."""
    url = ("--redis-url", "redis://127.0.0.1:6379/0")
    assert parse_job_options([*url])[0].stream_prefix == "sparkpoint"
    monkeypatch.setenv("SPARKPOINT_STREAM_PREFIX", "team-b")
    assert parse_job_options([*url])[0].stream_prefix == "team-b"
    assert parse_job_options([*url, "--stream-prefix", "team-a"])[0].stream_prefix == "team-a"
    # The server's prefix in the environment is no choice of a standalone job's user.
    assert parse_job_options(["--standalone"])[0].standalone


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--control-plane-timeout", "0"], "--control-plane-timeout must be > 0 seconds"),
        (
            ["--stream-prefix", "a b"],
            r"--stream-prefix \(by default SPARKPOINT_STREAM_PREFIX\) must",
        ),
    ],
)
def test_invalid_connected_options_name_the_option(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_job_options(["--redis-url", "redis://127.0.0.1:6379/0", *argv])


def test_standalone_needs_no_redis(no_redis: Path) -> None:
    opts, _ = parse_job_options(["--standalone"])
    assert opts.standalone and opts.redis_url is None


def test_a_job_prints_its_help_without_a_control_plane(
    no_redis: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        pv_count.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pv_count") and "--events EVENTS" in out


def test_sparkpoint_run_without_a_control_plane_exits_2_before_starting_the_driver(
    no_redis: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(SUPERVISED_ENV, raising=False)
    rc = cli.main(["run", "jobs/examples/pv_count.py", "--output", str(no_redis / "out")])
    assert rc == 2
    assert "invalid configuration: no control plane to connect to" in capsys.readouterr().err


@pytest.mark.parametrize("standalone", [True, False])
def test_the_driver_runs_under_the_in_process_or_the_control_planes_authority(
    tmp_path: Path, standalone: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(JOB_KEY_ENV, "00" * 32)
    options = JobOptions(
        job_id="which", standalone=standalone, redis_url="redis://127.0.0.1:6379/0"
    )
    env = StreamExecutionEnvironment(options)
    env.from_source(ListSource((1, 2)), uid="src").sink_to(FileSink(str(tmp_path)), uid="out")
    driver = JobDriver(env.graph, options)
    expected = InProcessAuthority if standalone else ControlPlaneAuthority
    assert type(driver.authority) is expected


def test_a_connected_driver_signs_with_its_key_from_the_environment_or_the_data_directory(
    tmp_path: Path,
) -> None:
    assert driver_job_key("j", {JOB_KEY_ENV: "0a" * 32}) == bytes([10] * 32)
    (tmp_path / SECRET_FILE).write_text("ff" * 32 + "\n")
    derived = driver_job_key("j", {"SPARKPOINT_DATA_DIR": str(tmp_path)})
    assert derived == job_key(bytes([255] * 32), "j") != job_key(bytes([255] * 32), "k")
    with pytest.raises(ConfigurationError) as err:
        driver_job_key("j", {"SPARKPOINT_DATA_DIR": str(tmp_path / "elsewhere")})
    assert "job j cannot sign its events" in str(err.value) and JOB_KEY_ENV in str(err.value)


def test_a_lost_redis_is_recoverable_once_the_driver_registered_or_was_restarted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis unreachable past the retries: the driver ends as lost (exit 75, ``sparkpoint
    run`` starts the next) when it had registered or was itself a restarted driver; at a
    run's first start it stays an error (a wrong --redis-url is not retried for ever)."""
    monkeypatch.setenv(JOB_KEY_ENV, "00" * 32)
    monkeypatch.delenv(PREVIOUS_FAILURE_ENV, raising=False)
    link = ControlPlaneLink.connect(JobOptions(job_id="lost", redis_url=REDIS_URL))
    gone = RedisUnreachableError(
        "Redis at redis://127.0.0.1:6390/0 unreachable after 20 attempt(s)"
    )
    link.raise_if_lost(gone, registered=False)
    link.raise_if_lost(ConfigurationError("no"), registered=True)
    # A Redis that answers and refuses (read-only, out of memory): no restart mends that.
    link.raise_if_lost(TransportError("Redis refused: READONLY"), registered=True)
    with pytest.raises(ControlPlaneLostError) as err:
        link.raise_if_lost(gone, registered=True)
    assert str(err.value).startswith("lost the control plane's Redis: Redis at redis://127")
    monkeypatch.setenv(PREVIOUS_FAILURE_ENV, "the driver was killed (SIGKILL)")
    restarted = ControlPlaneLink.connect(JobOptions(job_id="lost", redis_url=REDIS_URL))
    with pytest.raises(ControlPlaneLostError):
        restarted.raise_if_lost(gone, registered=False)
    for each in (link, restarted):
        each.client.close()
