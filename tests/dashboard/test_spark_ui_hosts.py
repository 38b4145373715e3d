"""The dashboard's server asks only allowed Spark UIs, and never follows a redirect: a job
reports its Spark UI's address itself, so an address must not make the server fetch anything
else (server-side request forgery)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sparkpoint_dashboard.settings import load_settings
from sparkpoint_dashboard.spark_ui import SparkJob, SparkUi, allowed_spark_ui, spark_ui_host

APP = "app-1"
GROUP = "sparkpoint-pv-a1-e9"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:4040", True),
        ("http://127.8.9.10:4040/", True),
        ("https://localhost:4040", True),
        ("http://LOCALHOST:4040", True),
        ("http://[::1]:4040", True),
        ("http://spark-driver-7:4040", True),  # listed in the setting
        ("http://10.0.0.7:4040", True),  # listed in the setting
        ("http://169.254.169.254/latest/meta-data", False),  # cloud metadata
        ("http://10.0.0.8:4040", False),
        ("http://internal.example:80", False),
        ("http://evil.example\\@127.0.0.1:4040", False),  # a browser goes to evil.example
        ("http://127.0.0.1:4040@evil.example", False),
        ("http://user@127.0.0.1:4040", False),
        ("http://127.0.0.1.evil.example:4040", False),
        ("http://127.0.0.1%2eevil.example:4040", False),
        ("http://127.0.0.1:4040/\nHost: evil", False),
        ("file:///etc/passwd", False),
        ("javascript:alert(1)//127.0.0.1", False),
        ("ftp://127.0.0.1/", False),
        ("127.0.0.1:4040", False),
        ("", False),
    ],
)
def test_only_loopback_and_the_listed_hosts_are_allowed(url: str, allowed: bool) -> None:
    assert allowed_spark_ui(url, ["spark-driver-7", " 10.0.0.7 "]) is allowed


def test_the_host_is_read_as_the_fetching_client_reads_it() -> None:
    assert spark_ui_host("http://Driver-1.example:4040/x") == "driver-1.example"
    assert spark_ui_host("http://[::1]:4040") == "::1"
    assert spark_ui_host("http://a@b") is None


def test_the_setting_lists_hosts_separated_by_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKPOINT_DASHBOARD_SPARK_UI_HOSTS", "driver-1, 10.0.0.7,,")
    assert load_settings().spark_ui_hosts == ["driver-1", "10.0.0.7"]
    monkeypatch.delenv("SPARKPOINT_DASHBOARD_SPARK_UI_HOSTS")
    assert load_settings().spark_ui_hosts == []


def test_a_spark_ui_not_allowed_is_never_asked() -> None:
    asked: list[str] = []

    def get_json(url: str, timeout_s: float) -> Any:
        asked.append(url)
        return []

    ui = SparkUi(allowed_hosts=["driver-1"], get_json=get_json)

    assert ui.group_jobs("http://169.254.169.254/latest", APP, GROUP) is None
    assert ui.group_jobs("http://driver-2:4040", APP, GROUP) is None
    assert asked == []
    assert ui.group_jobs("http://driver-1:4040", APP, GROUP) == []
    assert asked == [f"http://driver-1:4040/api/v1/applications/{APP}/jobs"]


class _Server:
    """A real HTTP server on loopback answering every GET with ``respond(handler)``."""

    def __init__(self, respond: Any) -> None:
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.paths.append(self.path)
                respond(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[list[_Server]]:
    started: list[_Server] = []
    yield started
    for server in started:
        server.close()


def _json(body: bytes) -> Any:
    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return respond


def test_a_redirect_is_never_followed(servers: list[_Server]) -> None:
    target = _Server(
        _json(b'[{"jobId": 1, "jobGroup": "%s", "status": "SUCCEEDED"}]' % GROUP.encode())
    )
    servers.append(target)

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", f"{target.url}/secret")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    spark = _Server(redirect)
    servers.append(spark)

    assert SparkUi().group_jobs(spark.url, APP, GROUP) is None  # as if unreachable
    assert spark.paths == [f"/api/v1/applications/{APP}/jobs"]
    assert target.paths == []  # the redirect's target was never asked

    # The same answer served directly is read: the refusal above is the redirect's.
    assert SparkUi().group_jobs(target.url, APP, GROUP) == [SparkJob(1, "SUCCEEDED")]
