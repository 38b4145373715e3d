"""The embedded Redis: starts, survives a crash of its process with its data, stops cleanly."""

from __future__ import annotations

import os
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from tests.support.waiting import wait_for

from sparkpoint import protocol as p
from sparkpoint.transport import (
    CommandChannel,
    Streams,
    TransportError,
    default_redis_url,
    redis_client,
    send_command,
)
from sparkpoint_server.ingest.embedded_redis import EmbeddedRedis, EmbeddedRedisError


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    embedded = EmbeddedRedis(tmp_path)
    embedded.start()
    yield embedded
    embedded.stop()


def written_to_its_file(client: redis.Redis) -> None:
    """Wait until what ``client`` wrote is in the append-only file. With ``appendfsync
    everysec`` Redis holds its writes back (up to 2 s) while the previous second's fsync runs,
    and a SIGKILL meanwhile loses them: these tests are about what was written surviving."""
    wait_for(
        "the writes to reach the append-only file",
        lambda: client.info("persistence")["aof_buffer_length"] == 0,
        10,
        every_s=0.01,
    )


def test_start_writes_the_url_file_that_jobs_read(server: EmbeddedRedis, tmp_path: Path) -> None:
    password = (tmp_path / "redis-password").read_text().strip()
    assert len(password) >= 32
    assert server.url == f"redis://:{password}@127.0.0.1:{server.port}/0"
    assert (tmp_path / "redis.url").read_text() == server.url + "\n"
    assert default_redis_url(str(tmp_path)) == server.url
    assert redis_client(server.url).ping() is True
    config = (tmp_path / "redis" / "redis.conf").read_text()
    assert "appendonly yes" in config
    assert "bind 127.0.0.1" in config
    assert f'requirepass "{password}"' in config
    for name in ("redis-password", "redis.url", "redis/redis.conf"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name


def test_an_unauthenticated_client_is_refused(server: EmbeddedRedis) -> None:
    anonymous = redis_client(f"redis://127.0.0.1:{server.port}/0")
    with pytest.raises(redis.AuthenticationError):
        anonymous.xadd("sparkpoint:events", {b"m": b"forged"})
    wrong = redis_client(f"redis://:wrong@127.0.0.1:{server.port}/0")
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    assert redis_client(server.url).exists("sparkpoint:events") == 0


def test_the_password_is_kept_across_restarts(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as first:
        url = first.url
    with EmbeddedRedis(tmp_path) as second:
        assert second.url == url
        assert redis_client(url).ping() is True


def test_a_killed_server_is_restarted_on_the_same_port_with_its_data(
    server: EmbeddedRedis,
) -> None:
    client = redis_client(server.url)
    entry_id = client.xadd("events", {b"m": b"survives"})
    written_to_its_file(client)
    old_pid = server.pid
    assert old_pid is not None

    os.kill(old_pid, signal.SIGKILL)

    def restarted() -> bool:
        return server.restarts == 1 and server.pid not in (None, old_pid)

    wait_for("the supervisor restarted the server", restarted, 20, every_s=0.02)
    assert client.xrange("events") == [(entry_id, {b"m": b"survives"})]
    assert server.url.endswith(f"@127.0.0.1:{server.port}/0")


def test_a_drivers_command_read_waits_out_a_restart_of_the_embedded_redis(
    server: EmbeddedRedis,
) -> None:
    """A connected driver reads its commands at every epoch boundary: while the embedded
    Redis restarts, the read retries (as publishing does) instead of failing the job; the
    reader of a running epoch (``retry_for_s=0``) gives up at once and reads again later."""
    client = redis_client(server.url)
    channel = CommandChannel(client, "job-1", "driver-1")
    channel.open()
    send_command(client, Streams(), "job-1", 1, 0, p.NotifyCheckpointComplete(checkpoint_id=7))
    written_to_its_file(client)
    old_pid = server.pid
    assert old_pid is not None

    os.kill(old_pid, signal.SIGKILL)
    with pytest.raises(TransportError, match="read commands of job job-1"):
        channel.read(retry_for_s=0)
    [message] = channel.read()  # retried until the supervisor restarted the server
    assert server.restarts == 1
    assert message.payload == p.NotifyCheckpointComplete(checkpoint_id=7)


def test_stop_ends_the_process_and_removes_the_url_file(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        pid = server.pid
        url = server.url
    assert pid is not None
    assert not (tmp_path / "redis.url").exists()
    assert server.pid is None
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()


def test_data_survives_a_stop_and_start(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        redis_client(server.url).xadd("events", {b"m": b"kept"})
    with EmbeddedRedis(tmp_path) as server:
        assert [f for _, f in redis_client(server.url).xrange("events")] == [{b"m": b"kept"}]


def test_a_port_already_taken_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        embedded = EmbeddedRedis(tmp_path, port=port)

        with pytest.raises(EmbeddedRedisError, match=f"port {port} on 127.0.0.1 is already in use"):
            embedded.start()

    assert embedded.pid is None
    assert not (tmp_path / "redis.url").exists()


def test_a_server_that_cannot_start_reports_the_end_of_its_log(tmp_path: Path) -> None:
    embedded = EmbeddedRedis(tmp_path)
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "appendonly.aof").write_bytes(b"not an append-only file\r\n")

    with pytest.raises(EmbeddedRedisError, match=r"exited with code 1 while starting(.|\n)*AOF"):
        embedded.start()
    embedded.stop()


def test_a_server_orphaned_by_a_killed_control_plane_is_stopped_before_a_new_start(
    tmp_path: Path,
) -> None:
    first = EmbeddedRedis(tmp_path)
    first.start()
    redis_client(first.url).xadd("events", {b"m": b"before"})
    orphan = first._process
    assert orphan is not None
    # The control plane dies: its supervisor is gone, its Redis lives on.
    first._stopping.set()
    assert first._supervisor is not None
    first._supervisor.join()

    with EmbeddedRedis(tmp_path) as second:
        assert orphan.wait(timeout=10) == 0  # shut down by SIGTERM, not killed
        assert [f for _, f in redis_client(second.url).xrange("events")] == [{b"m": b"before"}]
        # Jobs that still hold the killed control plane's URL reach the new server.
        assert second.url == first.url
    first.stop()


def test_a_new_start_takes_another_port_when_the_previous_one_is_taken(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        previous = server.port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", previous))
        taken.listen()
        with EmbeddedRedis(tmp_path) as server:
            assert server.port != previous
            assert redis_client(server.url).ping()
