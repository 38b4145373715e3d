"""How a job or the control plane finds and connects to its Redis (``transport`` re-exports it).

``REDIS_URL``, else the ``redis.url`` that a control plane with an embedded Redis writes into
its data directory; a client that retries a broken connection once and names the server in
errors without its credentials.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sparkpoint.errors import ConfigurationError

DEFAULT_DATA_DIR = ".sparkpoint/server"
URL_FILE = "redis.url"
SOCKET_TIMEOUT_S = 30.0  # a blocking read's ``block_ms`` must stay below this


def redis_client(url: str) -> redis.Redis:
    """A client of the Redis at ``url`` that returns bytes (``decode_responses=False``).

    A command that fails on a broken connection is retried once at once (that reconnects a
    pooled connection to a restarted server); longer outages are the callers' to retry.
    Blocking reads must ask for less than :data:`SOCKET_TIMEOUT_S`.

    Raises:
        ConfigurationError: the URL is malformed (it is named in the message).
    """
    parts = urlsplit(url)
    db = parts.path.lstrip("/")
    if parts.scheme in ("redis", "rediss") and db and not db.isdigit():
        raise ConfigurationError(f"invalid Redis URL {url!r}: database {db!r} is not a number")
    try:
        return redis.Redis.from_url(
            url,
            decode_responses=False,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=5.0,
            retry=Retry(NoBackoff(), retries=1),
        )
    except ValueError as err:
        raise ConfigurationError(f"invalid Redis URL {url!r}: {err}") from err


_SHARED: dict[str, redis.Redis] = {}


def shared_client(url: str) -> redis.Redis:
    """One :func:`redis_client` per URL and process: the tasks of one Spark executor (and
    the connectors they run) share its connection pool."""
    client = _SHARED.get(url)
    if client is None:
        client = _SHARED[url] = redis_client(url)
    return client


def default_redis_url(data_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The Redis a job or the control plane should use when none is given.

    Args:
        data_dir: The control plane's data directory; defaults to ``SPARKPOINT_DATA_DIR``,
            else ``.sparkpoint/server``.

    Returns:
        ``REDIS_URL`` if set, else the contents of ``<data_dir>/redis.url`` (written by a
        control plane that runs an embedded Redis) if that file exists, else None.
    """
    url = os.environ.get("REDIS_URL", "").strip()
    if url:
        return url
    directory = data_dir or os.environ.get("SPARKPOINT_DATA_DIR") or DEFAULT_DATA_DIR
    path = Path(directory) / URL_FILE
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def client_url(client: redis.Redis) -> str:
    """Where ``client`` connects, as a URL without credentials (for error messages)."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    host = kwargs.get("host", "localhost")
    return f"redis://{host}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
