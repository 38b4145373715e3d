"""``sparkpoint server`` that cannot use its Redis or its database says so in one line.

A malformed or unreachable ``DATABASE_URL`` or ``REDIS_URL`` used to end the server with two
tracebacks (the engine's and uvicorn's, 100-200 lines) and exit status 3. Each case here runs
the real command and reads what an operator reads.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint import cli
from tests.support.ports import free_port

from .control_plane import ROOT, TOKEN

PASSWORD = "s3cret-in-the-url"

CASES = {
    "database unreachable": (
        {"DATABASE_URL": f"postgresql://sparkpoint:{PASSWORD}@127.0.0.1:{{port}}/none"},
        "cannot use the database at postgresql://sparkpoint:***@127.0.0.1:{port}/none: "
        "connection failed",
    ),
    "database of an unknown kind": (
        {"DATABASE_URL": "mysql+nodriver://db/x"},
        "cannot use the database at mysql+nodriver://db/x: Can't load plugin",
    ),
    "database file in a missing directory": (
        {"DATABASE_URL": "sqlite:////nonexistent-dir/sparkpoint.db"},
        "cannot use the database at sqlite:////nonexistent-dir/sparkpoint.db: "
        "unable to open database file",
    ),
    "redis unreachable": (
        {"REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{{port}}/0"},
        "cannot use Redis at redis://127.0.0.1:{port}/0: Error 111 connecting",
    ),
    "embedded redis port taken": (
        {"SPARKPOINT_EMBEDDED_REDIS_PORT": "{taken}"},
        "cannot start the embedded Redis: port {taken} on 127.0.0.1 is already in use",
    ),
    "redis url malformed": (
        {"REDIS_URL": "http://example/0"},
        "invalid Redis URL 'http://example/0': Redis URL must specify one of the following schemes",
    ),
}


# Every case with the API in a process of its own (the default); one with a single process,
# which takes the same start path.
RUNS = [(case, "true") for case in CASES] + [("database unreachable", "false")]


@pytest.mark.parametrize(("case", "api_process"), RUNS)
def test_a_server_that_cannot_use_redis_or_its_database_says_so_in_one_line(
    case: str, api_process: str, tmp_path: Path
) -> None:
    variables, said = CASES[case]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = {"port": free_port(), "taken": taken.getsockname()[1]}  # port: nothing there
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")},
            "SPARKPOINT_DATA_DIR": str(tmp_path / "data"),
            "SPARKPOINT_API_TOKEN": TOKEN,
            "SPARKPOINT_API_PROCESS": api_process,
            **{k: v.format(**ports) for k, v in variables.items()},
        }
        server = [str(Path(sys.executable).with_name("sparkpoint")), "server"]
        done = subprocess.run(
            [*server, "--port", str(free_port())],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, (done.returncode, done.stderr)
    output = done.stdout + done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("sparkpoint server:")]
    assert line.startswith(f"sparkpoint server: cannot start: {said.format(**ports)}"), line
    assert "Traceback" not in output, output
    assert PASSWORD not in output
    # What had started was stopped: the embedded Redis (REDIS_URL unset) removes its pid file
    # when it shuts down.
    pid_file = tmp_path / "data" / "redis" / "redis.pid"
    assert not pid_file.exists(), f"the embedded Redis was left running: {pid_file.read_text()}"


def test_a_server_whose_port_is_taken_says_so_in_one_line_before_it_starts_anything(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(Path(sys.executable).with_name("sparkpoint")), "server", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, "SPARKPOINT_DATA_DIR": str(tmp_path / "data")},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.strip().splitlines() == [
        f"sparkpoint server: cannot listen on 127.0.0.1:{port}: [Errno 98] Address already in use"
    ]
    assert not (tmp_path / "data" / "redis").exists()  # no embedded Redis was started


@pytest.mark.parametrize("command", ["server", "dashboard"])
@pytest.mark.parametrize(
    ("port", "said"),
    [("99999", "a port is between 1 and 65535, got 99999"), ("x", "not a port number: 'x'")],
)
def test_a_port_that_is_no_port_is_a_usage_error(
    command: str, port: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the server failed with an OverflowError traceback, and the dashboard served
    on a random port while it said 99999."""
    with pytest.raises(SystemExit) as ended:
        cli.main([command, "--port", port])
    assert ended.value.code == 2
    assert f"sparkpoint {command}: error: argument --port: {said}" in capsys.readouterr().err
