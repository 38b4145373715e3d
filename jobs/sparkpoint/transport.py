"""The Redis transport between jobs and the control plane: stream names, events out, commands in.

A job publishes its events to ``<prefix>:events`` through :class:`RedisEventSink` and reads its
own commands from ``<prefix>:commands:<job_id>`` through :class:`CommandChannel`; the control
plane sends those commands with :func:`send_command`. Every stream entry carries one encoded
:class:`~sparkpoint.protocol.Envelope` in the field ``m`` (see ``docs/control-plane.md``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import BaseModel

from sparkpoint import protocol
from sparkpoint.clock import Clock
from sparkpoint.errors import SparkpointError
from sparkpoint.events import EventSink
from sparkpoint.redis_connection import DEFAULT_DATA_DIR as DEFAULT_DATA_DIR
from sparkpoint.redis_connection import SOCKET_TIMEOUT_S as SOCKET_TIMEOUT_S
from sparkpoint.redis_connection import URL_FILE as URL_FILE
from sparkpoint.redis_connection import client_url as client_url
from sparkpoint.redis_connection import default_redis_url as default_redis_url
from sparkpoint.redis_connection import redis_client as redis_client
from sparkpoint.redis_retry import RETRY_FOR_S as RETRY_FOR_S
from sparkpoint.redis_retry import RedisUnreachableError as RedisUnreachableError
from sparkpoint.redis_retry import TransportError as TransportError
from sparkpoint.redis_retry import passing_refusal as passing_refusal
from sparkpoint.redis_retry import retrying as retrying
from sparkpoint.signing import Signer
from sparkpoint.stream_retention import trim_acknowledged

log = logging.getLogger(__name__)

EVENTS_GROUP = "control-plane"
COMMANDS_GROUP = "job"
FIELD = b"m"

_COMMAND_TYPES = frozenset(
    cls.model_fields["type"].default for cls in protocol.CommandPayload.__args__
)


class ControlPlaneLostError(SparkpointError):
    """Redis stayed unreachable while a connected driver ran: the driver ends as one that lost
    its Spark does (exit 75), and ``sparkpoint run`` starts the next, which registers again
    once Redis is back; the control plane then fails the job over to its latest checkpoint."""


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

    The control plane removes the events it acknowledged (:mod:`sparkpoint.stream_retention`).
    While Redis is unreachable a publish retries for ``retry_for_s``; a retried batch may be
    written twice (the control plane dead-letters the second copy as a replay). With a
    ``signer`` every event is numbered and signed (:mod:`sparkpoint.signing`), and written under
    the signer's lock, so that a sender's sequence numbers reach the stream in order.
    """

    def __init__(
        self,
        client: redis.Redis,
        streams: Streams = Streams(),
        max_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
        *,
        retry_for_s: float | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
        signer: Signer | None = None,
    ) -> None:
        self.client = client
        self.streams = streams
        self.max_bytes = max_bytes
        self.signer = signer
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
        if self.signer is None:
            self._publish(events)
            return
        with self.signer.lock:
            self._publish(self.signer.sign(events))

    def _publish(self, events: Sequence[protocol.Envelope]) -> None:
        encoded = [protocol.encode(event, self.max_bytes) for event in events]
        stream = self.streams.events

        def xadd_all() -> None:
            pipe = self.client.pipeline(transaction=False)
            for raw in encoded:
                pipe.xadd(stream, {FIELD: raw})
            pipe.execute()

        retrying(
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
    retry_for_s: float | None = None,
    signer: Signer | None = None,
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
        retry_for_s: How long to retry while Redis is unreachable (None: the retry window,
            :func:`~sparkpoint.redis_retry.retry_window_s`).
        signer: Numbers and signs the command (:mod:`sparkpoint.signing`).

    Returns:
        The entry id in the job's command stream.

    Raises:
        ProtocolError: the message is above ``max_bytes``.
        TransportError: Redis stayed unreachable for ``retry_for_s``.
    """
    message = protocol.envelope(job_id, attempt, timestamp, payload)
    return send_commands(
        client, streams, [message], max_bytes=max_bytes, retry_for_s=retry_for_s, signer=signer
    )[0]


def send_commands(
    client: redis.Redis,
    streams: Streams,
    items: Sequence[protocol.Envelope],
    *,
    max_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
    retry_for_s: float | None = None,
    signer: Signer | None = None,
) -> list[str]:
    """Send commands (each to its envelope's job) in one round trip, in order; numbered and
    signed by ``signer`` when given (under its lock, so they reach the streams in order).

    Returns:
        The entry ids, one per command.

    Raises:
        ProtocolError: a message is above ``max_bytes`` (nothing is sent then).
        TransportError: Redis stayed unreachable for ``retry_for_s``.
    """
    if not items:
        return []
    if signer is not None:
        with signer.lock:
            return send_commands(
                client, streams, signer.sign(items), max_bytes=max_bytes, retry_for_s=retry_for_s
            )
    encoded = [(streams.commands(item.job_id), protocol.encode(item, max_bytes)) for item in items]

    def xadd_all() -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for stream, raw in encoded:
            pipe.xadd(stream, {FIELD: raw})
        return pipe.execute()

    what = f"send {len(items)} command(s) ({', '.join(sorted({s for s, _ in encoded}))})"
    ids = retrying(xadd_all, what, client, retry_for_s=retry_for_s)
    return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]


class CommandChannel:
    """A job's reader of its own command stream (consumer group ``job``).

    Malformed entries (and events sent to a command stream) are logged, acknowledged, counted
    in :attr:`malformed` and skipped: a bad command never crashes the job. With a ``verifier``
    (:class:`sparkpoint.signing.CommandVerifier`), so are unsigned, forged and replayed ones.
    ``fence`` runs before each read and after one that returned commands, and raises when this
    reader may no longer take the job's commands (another driver took its lease).
    """

    def __init__(
        self,
        client: redis.Redis,
        job_id: str,
        consumer: str,
        streams: Streams = Streams(),
        verifier: Callable[[protocol.Envelope], str | None] | None = None,
        fence: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.consumer = consumer
        self.stream = streams.commands(job_id)
        self.verifier = verifier
        self.fence = fence
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

        retrying(create_or_move, f"open command stream {self.stream}", self.client)

    def read(
        self,
        block_ms: int | None = None,
        count: int = 100,
        client: redis.Redis | None = None,
        *,
        retry_for_s: float | None = None,
    ) -> list[ReceivedMessage]:
        """The next commands, in order; acknowledge each with :meth:`ack` once obeyed.

        Args:
            block_ms: Wait up to this many milliseconds for a command (below
                :data:`SOCKET_TIMEOUT_S`); None or 0: return at once.
            count: The most commands to return.
            client: Read on this client instead (a connection of its own, whose blocking
                read another client can end with ``CLIENT UNBLOCK``).
            retry_for_s: Keep trying this long while Redis is unreachable (it restarts:
                the embedded Redis of a control plane comes back within seconds), as
                publishing and :meth:`ack` do; None: the retry window
                (:func:`~sparkpoint.redis_retry.retry_window_s`); 0: raise at once.

        Raises:
            TransportError: Redis stayed unreachable, or refused the read.
        """

        def read_group() -> Any:
            self.check_fence()  # on every attempt: a driver paused in its retries reads nothing
            try:
                return (client or self.client).xreadgroup(
                    COMMANDS_GROUP,
                    self.consumer,
                    {self.stream: ">"},
                    count=count,
                    block=block_ms or None,
                )
            except redis.ResponseError as err:
                if "NOGROUP" not in str(err):
                    raise
                return None  # the stream was deleted

        what = f"read commands of job {self.job_id} from {self.stream}"
        response = retrying(read_group, what, self.client, retry_for_s=retry_for_s)
        if response:
            self.check_fence()  # paused during the read: what it took stays unacknowledged
        if response is None:
            self._reopen_deleted()
            return []
        received: list[ReceivedMessage] = []
        bad: list[str] = []
        for entry_id, fields in stream_entries(response):
            try:
                message = decode_entry(entry_id, fields)
                if message.envelope.type not in _COMMAND_TYPES:
                    raise protocol.ProtocolError(
                        f"entry {entry_id}: {message.envelope.type} is not a command"
                    )
                refusal = self.verifier(message.envelope) if self.verifier else None
                if refusal is not None:
                    raise protocol.ProtocolError(
                        f"entry {entry_id}: {message.envelope.type} command refused: {refusal}"
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

    def check_fence(self) -> None:
        """Raise when this reader may no longer take the job's commands (``fence``)."""
        if self.fence is not None:
            self.fence()

    def ack(self, entry_ids: Iterable[str]) -> None:
        """Acknowledge commands that were obeyed, and remove them from the stream.

        Raises:
            TransportError: Redis stayed unreachable.
        """
        ids = list(entry_ids)
        if not ids:
            return
        retrying(
            lambda: self.client.xack(self.stream, COMMANDS_GROUP, *ids),
            f"acknowledge {len(ids)} command(s) in {self.stream}",
            self.client,
        )
        try:
            trim_acknowledged(self.client, self.stream)
        except redis.RedisError as err:  # the next acknowledgement trims them
            log.warning("could not trim the acknowledged commands of %s: %s", self.stream, err)

    def _reopen_deleted(self) -> None:
        """The stream was deleted (the control plane drops a finished job's commands): read
        it again from its first entry, since whatever was added since is meant for us."""
        log.warning("command stream %s was deleted; reading it again from the start", self.stream)
        try:
            self.client.xgroup_create(self.stream, COMMANDS_GROUP, id="0", mkstream=True)
        except redis.RedisError as err:
            if "BUSYGROUP" not in str(err):
                raise TransportError(
                    f"could not re-create the consumer group of {self.stream} "
                    f"(Redis at {client_url(self.client)}): {err}"
                ) from err
