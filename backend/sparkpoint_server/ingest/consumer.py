"""The control plane's reader of the events stream: batches to a handler, bad events aside.

:class:`EventConsumer` reads ``<prefix>:events`` in the consumer group ``control-plane`` and
passes the decoded events, in stream order, to an :data:`IngestHandler` that commits their
effect to the database. An event is acknowledged only after that handler returned, so a
crash re-reads it (delivery is at-least-once, the handlers are idempotent). Events that
cannot be decoded, events the handler rejects and events that make the handler fail on their
own go to the dead-letter stream with the reason, a batch of them in one Redis transaction:
the consumer never stops on a bad event, and a flood of them does not hold up the others. With
a ``verifier`` (the control plane's), an unsigned or forged event (``sparkpoint.signing``) is
dead-lettered with the reason before anything of it is applied.
Every ``trim_interval_ms`` it removes the events the group acknowledged from the stream; the
dead-letter stream keeps about ``dead_letter_maxlen`` entries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis

from sparkpoint import protocol
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.stream_retention import trim_acknowledged
from sparkpoint.transport import (
    EVENTS_GROUP,
    FIELD,
    ReceivedMessage,
    Streams,
    client_url,
    decode_entry,
    stream_entries,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RejectedEvent:
    """An event a handler refused without applying anything of it (its job is unknown): it
    goes to the dead letters with ``reason`` while the rest of its batch is applied."""

    entry_id: str
    reason: str


IngestHandler = Callable[[list[ReceivedMessage]], Sequence[RejectedEvent] | None]
"""Applies a batch of events and commits its effect to the database before returning the
events it rejected (or None); raises on failure (raise :class:`TransientIngestError` when
the event is not to blame)."""

_Letter = tuple[str, dict[bytes, bytes] | None, str]  # entry id, its fields, the reason

_EVENT_TYPES = frozenset(cls.model_fields["type"].default for cls in protocol.EventPayload.__args__)
_MAX_BACKOFF_S = 5.0


class TransientIngestError(Exception):
    """Raised by a handler when applying failed for a reason outside the events (the database
    is unreachable): the batch stays pending and is read again after a backoff, instead of
    its events going to the dead letters one by one."""


@dataclass
class IngestStats:
    """Counters of the ingest, written by the consumer's thread and read by the API.

    Each field is a plain int or float (a read of one is atomic); :meth:`snapshot` reads them
    all at once.
    """

    events_ingested: int = 0
    dead_letters: int = 0
    stale_messages: int = 0  # events of an older job attempt, refused by the handler
    batches: int = 0
    handler_errors: int = 0
    last_batch_size: int = 0
    last_batch_ms: float = 0.0
    redis_errors: int = 0
    events_trimmed: int = 0  # acknowledged events removed from the events stream
    # Wall ms at which the latest read that drained the stream began: every event that
    # entered it before then is applied. 0: none yet.
    read_through_ms: int = 0

    def snapshot(self) -> dict[str, Any]:
        """All counters, as a dict (for ``/metrics``)."""
        return asdict(self)


class EventConsumer:
    """Reads the events stream in a consumer group and feeds the handler in batches."""

    def __init__(
        self,
        client: redis.Redis,
        handler: IngestHandler,
        stats: IngestStats,
        *,
        streams: Streams = Streams(),  # noqa: B008 - a frozen dataclass
        group: str = EVENTS_GROUP,
        consumer: str = "control-plane",
        batch_size: int = 1000,
        block_ms: int = 100,
        clock: Clock | None = None,
        on_health: Callable[[bool], None] | None = None,
        dead_letter_maxlen: int = 100_000,
        trim_interval_ms: int = 1000,
        verifier: Callable[[protocol.Envelope], str | None] | None = None,
        on_read_through: Callable[[float], None] | None = None,
    ) -> None:
        """Prepare the consumer (no I/O until :meth:`ensure_group` or :meth:`run`).

        Args:
            client: A Redis client returning bytes.
            handler: Applies and commits a batch.
            stats: The counters to update.
            streams: The stream names.
            group: The consumer group.
            consumer: This consumer's name; keep it across restarts so that the events read
                but not acknowledged before a crash are read again.
            batch_size: The most events per read (and per handler call).
            block_ms: How long a read waits for new events; 0 does not wait.
            clock: The dead letters' timestamps and the batch durations.
            on_health: Told when :meth:`run` starts reading the stream (True) and when it
                cannot (False: Redis or the handler's database is away), on each change.
            dead_letter_maxlen: About how many entries the dead-letter stream keeps (Redis
                trims whole nodes, so a few more).
            trim_interval_ms: How often the acknowledged events are removed from the stream.
            verifier: Why an event is not authentic (None: it is); such events are
                dead-lettered. None: events are not verified (tests of the ingest alone).
            on_read_through: Told, after a read that found fewer new events than a batch
                holds was processed, the monotonic time (``clock``) at which that read began:
                every event that entered the stream before it is applied.
        """
        self.client = client
        self.handler = handler
        self.stats = stats
        self.streams = streams
        self.group = group
        self.consumer = consumer
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.clock = clock or SystemClock()
        self.on_health = on_health
        self.dead_letter_maxlen = dead_letter_maxlen
        self.trim_interval_ms = trim_interval_ms
        self.verifier = verifier
        self.on_read_through = on_read_through
        self._healthy: bool | None = None
        self._trimmed_at: float | None = None

    def ensure_group(self) -> None:
        """Create the consumer group at the stream's beginning (if missing), and load the
        dead-letter count from the dead-letter stream so that it survives restarts (up to
        the stream's cap, ``dead_letter_maxlen``)."""
        try:
            self.client.xgroup_create(self.streams.events, self.group, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
        self.stats.dead_letters = int(self.client.xlen(self.streams.dead_letters))

    def poll_once(self) -> int:
        """Read and process events: first this consumer's pending ones, then new ones.

        Steps: (1) re-read the events delivered to this consumer but never acknowledged (a
        crash between read and acknowledgement), batch by batch until none is left, (2) read
        new events, waiting up to ``block_ms``. Each batch is processed by :meth:`_process`.
        (3) Every ``trim_interval_ms``, remove the acknowledged events from the stream.

        Returns:
            How many entries were processed (applied or dead-lettered).

        Raises:
            redis.RedisError: Redis failed (:meth:`run` retries).
            TransientIngestError: the handler could not apply a batch (it stays pending).
        """
        processed = 0
        # Step 1
        cursor = "0"
        while True:
            entries = self._read(cursor, block_ms=None)
            if not entries:
                break
            processed += self._process(entries)
            cursor = entries[-1][0]
        # Step 2
        started, started_at = self.clock.monotonic_ms(), self.clock.now_ms()
        entries = self._read(">", block_ms=self.block_ms or None)
        processed += self._process(entries)
        if len(entries) < self.batch_size:  # the stream held no other new event then
            self.stats.read_through_ms = started_at
            if self.on_read_through is not None:
                self.on_read_through(started)
        # Step 3
        now = self.clock.monotonic_ms()
        if self._trimmed_at is None or now - self._trimmed_at >= self.trim_interval_ms:
            self._trimmed_at = now
            self.stats.events_trimmed += trim_acknowledged(self.client, self.streams.events)
        return processed

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set; never raises.

        Redis errors and transient handler failures are logged, counted and retried with a
        capped exponential backoff.
        """
        delay = 0.1
        ready = False
        while not stop.is_set():
            try:
                if not ready:
                    self.ensure_group()
                    ready = True
                self.poll_once()
                self._health(True)
                delay = 0.1
                continue
            except (redis.ConnectionError, redis.TimeoutError) as err:
                self.stats.redis_errors += 1
                log.warning(
                    "Redis at %s unreachable while reading %s: %s; retrying in %.1f s",
                    client_url(self.client),
                    self.streams.events,
                    err,
                    delay,
                )
            except redis.ResponseError as err:
                self.stats.redis_errors += 1
                if "NOGROUP" in str(err):
                    ready = False  # the stream or group was deleted: create it again
                log.warning("Redis refused a read of %s: %s", self.streams.events, err)
            except TransientIngestError as err:
                log.warning("could not apply events, will read them again: %s", err)
            except Exception:
                log.exception("unexpected error while consuming %s", self.streams.events)
            self._health(False)
            stop.wait(delay)
            delay = min(delay * 2, _MAX_BACKOFF_S)

    def _health(self, healthy: bool) -> None:
        if healthy != self._healthy and self.on_health is not None:
            self.on_health(healthy)
        self._healthy = healthy

    # ------------------------------------------------------------------------- one batch

    def _read(
        self, cursor: str, block_ms: int | None
    ) -> list[tuple[str, dict[bytes, bytes] | None]]:
        response = self.client.xreadgroup(
            self.group,
            self.consumer,
            {self.streams.events: cursor},
            count=self.batch_size,
            block=block_ms,
        )
        return stream_entries(response)

    def _process(self, entries: Sequence[tuple[str, dict[bytes, bytes] | None]]) -> int:
        """Dead-letter the entries that do not decode, apply the others.

        Steps: (1) decode and verify each entry; a protocol error or a forged signature sets it
        aside for the dead letters,
        (2) apply the valid ones (:meth:`_apply`), (3) dead-letter what was set aside, in one
        Redis transaction.
        """
        if not entries:
            return 0
        # Step 1
        raw = dict(entries)
        letters: list[_Letter] = []
        batch: list[ReceivedMessage] = []
        for entry_id, fields in entries:
            try:
                message = decode_entry(entry_id, fields)
                if message.envelope.type not in _EVENT_TYPES:
                    raise protocol.ProtocolError(
                        f"entry {entry_id}: {message.envelope.type} is a command, not an event"
                    )
                forged = self.verifier(message.envelope) if self.verifier else None
                if forged is not None:
                    raise protocol.ProtocolError(
                        f"entry {entry_id}: forged {message.envelope.type} event of job "
                        f"{message.envelope.job_id}: {forged}"
                    )
            except protocol.ProtocolError as err:
                letters.append((entry_id, fields, str(err)))
                continue
            batch.append(message)
        # Step 2
        self._apply(batch, raw, letters)
        # Step 3
        self._dead_letter(letters)
        return len(entries)

    def _apply(
        self,
        batch: list[ReceivedMessage],
        raw: dict[str, dict[bytes, bytes] | None],
        letters: list[_Letter],
    ) -> None:
        """Apply ``batch`` in one handler call and acknowledge it; the events the handler
        rejects join ``letters``.

        If that call raises, apply the batch in chunks, in order: a chunk that fails is halved,
        one that succeeds makes the next twice as large, and an event that fails on its own
        joins ``letters``. So a few poison events cost a few calls each, and a batch of them
        one call per event, never more.
        """
        size = len(batch)
        start = 0
        while start < len(batch):
            chunk = batch[start : start + size]
            started = self.clock.monotonic_ms()
            try:
                rejected = self.handler(chunk) or ()
            except TransientIngestError:
                raise
            except Exception as err:
                if len(chunk) > 1:
                    log.warning(
                        "handler failed on a batch of %d events (%s: %s); applying it in parts",
                        len(chunk),
                        type(err).__name__,
                        err,
                    )
                    size = len(chunk) // 2
                    continue
                self.stats.handler_errors += 1
                [message] = chunk
                log.debug("event %s failed", message.entry_id, exc_info=True)
                reason = f"handler failed: {type(err).__name__}: {err}"
                letters.append((message.entry_id, raw[message.entry_id], reason))
                start += 1
                continue
            refused = {r.entry_id: r.reason for r in rejected}
            letters.extend((entry_id, raw[entry_id], why) for entry_id, why in refused.items())
            applied = [m.entry_id for m in chunk if m.entry_id not in refused]
            self._ack(applied)
            self._count_batch(len(applied), started)
            start += len(chunk)
            size = min(size * 2, len(batch))

    def _ack(self, entry_ids: list[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(entry_ids), 1000):
            pipe.xack(self.streams.events, self.group, *entry_ids[start : start + 1000])
        pipe.execute()

    def _count_batch(self, size: int, started: float) -> None:
        self.stats.events_ingested += size
        self.stats.batches += 1
        self.stats.last_batch_size = size
        self.stats.last_batch_ms = self.clock.monotonic_ms() - started

    def _dead_letter(self, letters: list[_Letter]) -> None:
        """Move entries to the dead-letter stream and acknowledge them, in one transaction."""
        if not letters:
            return
        first_id, _, first_reason = letters[0]
        log.warning(
            "%d event(s) of %s to the dead letters (%s), first %s: %s",
            len(letters),
            self.streams.events,
            self.streams.dead_letters,
            first_id,
            first_reason,
        )
        now = str(self.clock.now_ms()).encode()
        pipe = self.client.pipeline(transaction=True)
        for entry_id, fields, reason in letters:
            letter = {
                FIELD: (fields or {}).get(FIELD, b""),
                b"reason": reason.encode(),
                b"source_id": entry_id.encode(),
                b"timestamp": now,
            }
            pipe.xadd(
                self.streams.dead_letters,
                letter,  # type: ignore[arg-type]
                maxlen=self.dead_letter_maxlen,
                approximate=True,
            )
        pipe.xack(self.streams.events, self.group, *[entry_id for entry_id, _, _ in letters])
        pipe.execute()
        self.stats.dead_letters += len(letters)
