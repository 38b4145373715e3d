"""The Redis transport between jobs and the control plane: stream names, events out, commands in.

A job publishes its events to ``<prefix>:events`` through :class:`RedisEventSink` and reads its
own commands from ``<prefix>:commands:<job_id>`` through :class:`CommandChannel`; the control
plane sends those commands with :func:`send_command`. Every stream entry carries one encoded
:class:`~sparkpoint.protocol.Envelope` in the field ``m`` (see ``docs/control-plane.md``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from pydantic import BaseModel
from redis.backoff import NoBackoff
from redis.retry import Retry

from sparkpoint import protocol
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.events import EventSink

log = logging.getLogger(__name__)

EVENTS_GROUP = "control-plane"
COMMANDS_GROUP = "job"
FIELD = b"m"

DEFAULT_DATA_DIR = ".sparkpoint/server"
URL_FILE = "redis.url"
RETRY_FOR_S = 30.0  # how long a write keeps retrying while Redis is unreachable
SOCKET_TIMEOUT_S = 30.0  # a blocking read's ``block_ms`` must stay below this

_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError)
_COMMAND_TYPES = frozenset(
    cls.model_fields["type"].default for cls in protocol.CommandPayload.__args__
)
_T = TypeVar("_T")


class TransportError(SparkpointError):
    """Redis could not be reached (or refused a write); the message names the URL and stream."""


@dataclass(frozen=True)
class Streams:
    """The names of the streams, all under one configurable prefix."""

    prefix: str = "sparkpoint"

    @property
    def events(self) -> str:
        """The stream every job publishes its events to."""
        return f"{self.prefix}:events"

    @property
    def dead_letters(self) -> str:
        """Where the control plane puts the events it could not decode or apply."""
        return f"{self.prefix}:dead-letters"

    def commands(self, job_id: str) -> str:
        """The stream of commands to one job."""
        return f"{self.prefix}:commands:{job_id}"


@dataclass(frozen=True)
class ReceivedMessage:
    """One decoded stream entry."""

    entry_id: str
    envelope: protocol.Envelope
    payload: BaseModel  # the envelope's payload validated against its type's model


# ----------------------------------------------------------------------------- connections


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


def _retrying(
    action: Callable[[], _T],
    what: str,
    client: redis.Redis,
    *,
    retry_for_s: float = RETRY_FOR_S,
    clock: Clock | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> _T:
    """Run ``action``, retrying with capped exponential backoff while Redis is unreachable.

    Args:
        action: The Redis call(s); run again after a connection error.
        what: What the action does, for messages ("publish 3 events to sparkpoint:events").
        client: The client the action uses (its URL goes into the error).
        retry_for_s: Give up once this many seconds passed since the first attempt.
        clock: The monotonic clock of the deadline (the system clock by default).
        sleep: How to wait between attempts.

    Raises:
        TransportError: Redis stayed unreachable for ``retry_for_s`` or refused the command.
    """
    clock = clock or SystemClock()
    deadline = clock.monotonic_ms() + retry_for_s * 1000
    delay = 0.1
    attempts = 0
    while True:
        attempts += 1
        try:
            return action()
        except _CONNECTION_ERRORS as err:
            left_s = (deadline - clock.monotonic_ms()) / 1000
            if left_s <= 0:
                raise TransportError(
                    f"could not {what}: Redis at {client_url(client)} unreachable "
                    f"after {attempts} attempt(s) over {retry_for_s:g} s: {err}"
                ) from err
            log.warning("could not %s (Redis at %s): %s; retrying", what, client_url(client), err)
            sleep(min(delay, left_s))
            delay = min(delay * 2, 2.0)
        except redis.RedisError as err:
            raise TransportError(
                f"could not {what}: Redis at {client_url(client)} refused: {err}"
            ) from err


# ----------------------------------------------------------------------------- reading


def stream_entries(response: Any) -> list[tuple[str, dict[bytes, bytes] | None]]:
    """The ``(entry id, fields)`` pairs of an ``XREADGROUP`` answer on one stream.

    Accepts both the RESP2 (list) and RESP3 (dict) shapes; ``fields`` is empty or None for a
    pending entry that was deleted from the stream.
    """
    if not response:
        return []
    streams = response.values() if isinstance(response, dict) else (s[1] for s in response)
    entries: list[tuple[str, dict[bytes, bytes] | None]] = []
    for stream in streams:
        # RESP3 wraps each stream's entries in one more list.
        items = stream[0] if stream and isinstance(stream[0], list) else stream
        for entry_id, fields in items:
            key = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            entries.append((key, fields))
    return entries


def decode_entry(entry_id: str, fields: dict[bytes, bytes] | None) -> ReceivedMessage:
    """Decode one stream entry.

    Raises:
        ProtocolError: the entry has no ``m`` field, or its message is malformed, of an
            unknown type or has an invalid payload (the message says which, with the id).
    """
    raw = (fields or {}).get(FIELD)
    if raw is None:
        raise protocol.ProtocolError(f"entry {entry_id} has no {FIELD.decode()!r} field")
    try:
        env, payload = protocol.decode(raw)
    except protocol.ProtocolError as err:
        raise protocol.ProtocolError(f"entry {entry_id}: {err}") from err
    return ReceivedMessage(entry_id=entry_id, envelope=env, payload=payload)


# ----------------------------------------------------------------------------- events


class RedisEventSink(EventSink):
    """Publishes a job's events to the events stream, one entry per envelope.

    The stream is never trimmed: the control plane reads every event. While Redis is
    unreachable a publish retries for ``retry_for_s``; a retried batch may be written twice
    (delivery is at-least-once, the control plane's handlers are idempotent).
    """

    def __init__(
        self,
        client: redis.Redis,
        streams: Streams = Streams(),
        max_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
        *,
        retry_for_s: float = RETRY_FOR_S,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.streams = streams
        self.max_bytes = max_bytes
        self._retry_for_s = retry_for_s
        self._clock = clock
        self._sleep = sleep

    def publish(self, events: Sequence[protocol.Envelope]) -> None:
        """Append ``events`` to the events stream in order, in one round trip.

        Raises:
            ProtocolError: an event is above ``max_bytes`` (nothing is published then).
            TransportError: Redis stayed unreachable for ``retry_for_s``.
        """
        if not events:
            return
        encoded = [protocol.encode(event, self.max_bytes) for event in events]
        stream = self.streams.events

        def xadd_all() -> None:
            pipe = self.client.pipeline(transaction=False)
            for raw in encoded:
                pipe.xadd(stream, {FIELD: raw})
            pipe.execute()

        _retrying(
            xadd_all,
            f"publish {len(encoded)} event(s) to {stream}",
            self.client,
            retry_for_s=self._retry_for_s,
            clock=self._clock,
            sleep=self._sleep,
        )


# ----------------------------------------------------------------------------- commands


def send_command(
    client: redis.Redis,
    streams: Streams,
    job_id: str,
    attempt: int,
    timestamp: int,
    payload: protocol.CommandPayload,
    *,
    max_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
    retry_for_s: float = RETRY_FOR_S,
) -> str:
    """Send one command to a job.

    Args:
        client: The Redis client.
        streams: The stream names.
        job_id: The job the command is for.
        attempt: The job attempt the command belongs to.
        timestamp: Epoch milliseconds.
        payload: One of the protocol's command models.
        max_bytes: The size limit of the encoded message.
        retry_for_s: How long to retry while Redis is unreachable.

    Returns:
        The entry id in the job's command stream.

    Raises:
        ProtocolError: the message is above ``max_bytes``.
        TransportError: Redis stayed unreachable for ``retry_for_s``.
    """
    message = protocol.envelope(job_id, attempt, timestamp, payload)
    return send_commands(client, streams, [message], max_bytes=max_bytes, retry_for_s=retry_for_s)[
        0
    ]


def send_commands(
    client: redis.Redis,
    streams: Streams,
    items: Sequence[protocol.Envelope],
    *,
    max_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
    retry_for_s: float = RETRY_FOR_S,
) -> list[str]:
    """Send commands (each to its envelope's job) in one round trip, in order.

    Returns:
        The entry ids, one per command.

    Raises:
        ProtocolError: a message is above ``max_bytes`` (nothing is sent then).
        TransportError: Redis stayed unreachable for ``retry_for_s``.
    """
    if not items:
        return []
    encoded = [(streams.commands(item.job_id), protocol.encode(item, max_bytes)) for item in items]

    def xadd_all() -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for stream, raw in encoded:
            pipe.xadd(stream, {FIELD: raw})
        return pipe.execute()

    what = f"send {len(items)} command(s) ({', '.join(sorted({s for s, _ in encoded}))})"
    ids = _retrying(xadd_all, what, client, retry_for_s=retry_for_s)
    return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]


class CommandChannel:
    """A job's reader of its own command stream (consumer group ``job``).

    Malformed entries (and events sent to a command stream) are logged, acknowledged, counted
    in :attr:`malformed` and skipped: a bad command never crashes the job.
    """

    def __init__(
        self,
        client: redis.Redis,
        job_id: str,
        consumer: str,
        streams: Streams = Streams(),
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.consumer = consumer
        self.stream = streams.commands(job_id)
        self.malformed = 0

    def open(self) -> None:
        """Create the consumer group at the stream's end, or move an existing one there.

        Commands sent before this call (to an earlier driver process) are never read.

        Raises:
            TransportError: Redis stayed unreachable.
        """

        def create_or_move() -> None:
            try:
                self.client.xgroup_create(self.stream, COMMANDS_GROUP, id="$", mkstream=True)
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise
                self.client.xgroup_setid(self.stream, COMMANDS_GROUP, id="$")

        _retrying(create_or_move, f"open command stream {self.stream}", self.client)

    def read(self, block_ms: int | None = None, count: int = 100) -> list[ReceivedMessage]:
        """The next commands, in order; acknowledge each with :meth:`ack` once obeyed.

        Args:
            block_ms: Wait up to this many milliseconds for a command (below
                :data:`SOCKET_TIMEOUT_S`); None or 0: return at once.
            count: The most commands to return.

        Raises:
            TransportError: Redis is unreachable (no retry: the caller reads again later).
        """
        try:
            response = self.client.xreadgroup(
                COMMANDS_GROUP,
                self.consumer,
                {self.stream: ">"},
                count=count,
                block=block_ms or None,
            )
        except redis.RedisError as err:
            raise TransportError(
                f"could not read commands of job {self.job_id} from {self.stream} "
                f"(Redis at {client_url(self.client)}): {err}"
            ) from err
        received: list[ReceivedMessage] = []
        bad: list[str] = []
        for entry_id, fields in stream_entries(response):
            try:
                message = decode_entry(entry_id, fields)
                if message.envelope.type not in _COMMAND_TYPES:
                    raise protocol.ProtocolError(
                        f"entry {entry_id}: {message.envelope.type} is not a command"
                    )
            except protocol.ProtocolError as err:
                log.warning("skipping malformed command in %s: %s", self.stream, err)
                bad.append(entry_id)
                continue
            received.append(message)
        if bad:
            self.ack(bad)
            self.malformed += len(bad)
        return received

    def ack(self, entry_ids: Iterable[str]) -> None:
        """Acknowledge commands that were obeyed.

        Raises:
            TransportError: Redis stayed unreachable.
        """
        ids = list(entry_ids)
        if ids:
            _retrying(
                lambda: self.client.xack(self.stream, COMMANDS_GROUP, *ids),
                f"acknowledge {len(ids)} command(s) in {self.stream}",
                self.client,
            )
