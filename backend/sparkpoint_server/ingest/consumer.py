"""The control plane's reader of the events stream: batches to a handler, bad events aside.

:class:`EventConsumer` reads ``<prefix>:events`` in the consumer group ``control-plane`` and
passes the decoded events, in stream order, to an :data:`IngestHandler` that commits their
effect to the database. An event is acknowledged only after that handler returned, so a
crash re-reads it (delivery is at-least-once, the handlers are idempotent). Events that
cannot be decoded, and events that make the handler fail on their own, go to the
dead-letter stream with the reason; the consumer never stops on a bad event.
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

IngestHandler = Callable[[list[ReceivedMessage]], None]
"""Applies a batch of events and commits its effect to the database before returning; raises
on failure (raise :class:`TransientIngestError` when the event is not to blame)."""

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

    def ensure_group(self) -> None:
        """Create the consumer group at the stream's beginning (if missing), and load the
        dead-letter count from the dead-letter stream so that it survives restarts."""
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
        processed += self._process(self._read(">", block_ms=self.block_ms or None))
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
            stop.wait(delay)
            delay = min(delay * 2, _MAX_BACKOFF_S)

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

        Steps: (1) decode each entry; a protocol error sends it to the dead letters,
        (2) apply the valid ones in one handler call and acknowledge them, (3) if that call
        raised, apply them one by one: an event that still fails goes to the dead letters.
        """
        if not entries:
            return 0
        # Step 1
        raw = dict(entries)
        batch: list[ReceivedMessage] = []
        for entry_id, fields in entries:
            try:
                message = decode_entry(entry_id, fields)
                if message.envelope.type not in _EVENT_TYPES:
                    raise protocol.ProtocolError(
                        f"entry {entry_id}: {message.envelope.type} is a command, not an event"
                    )
            except protocol.ProtocolError as err:
                self._dead_letter(entry_id, fields, str(err))
                continue
            batch.append(message)
        if not batch:
            return len(entries)
        # Step 2
        started = self.clock.monotonic_ms()
        try:
            self.handler(batch)
        except TransientIngestError:
            raise
        except Exception as err:
            log.warning(
                "handler failed on a batch of %d events (%s: %s); applying them one by one",
                len(batch),
                type(err).__name__,
                err,
            )
        else:
            self._ack([m.entry_id for m in batch])
            self._count_batch(len(batch), started)
            return len(entries)
        # Step 3
        for message in batch:
            started = self.clock.monotonic_ms()
            try:
                self.handler([message])
            except TransientIngestError:
                raise
            except Exception as err:
                self.stats.handler_errors += 1
                log.exception("event %s of job %s", message.entry_id, message.envelope.job_id)
                self._dead_letter(
                    message.entry_id,
                    raw[message.entry_id],
                    f"handler failed: {type(err).__name__}: {err}",
                )
                continue
            self._ack([message.entry_id])
            self._count_batch(1, started)
        return len(entries)

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

    def _dead_letter(self, entry_id: str, fields: dict[bytes, bytes] | None, reason: str) -> None:
        """Move an entry to the dead-letter stream and acknowledge it, atomically."""
        log.warning("event %s of %s to the dead letters: %s", entry_id, self.streams.events, reason)
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(
            self.streams.dead_letters,
            {
                FIELD: (fields or {}).get(FIELD, b""),
                b"reason": reason.encode(),
                b"source_id": entry_id.encode(),
                b"timestamp": str(self.clock.now_ms()).encode(),
            },
        )
        pipe.xack(self.streams.events, self.group, entry_id)
        pipe.execute()
        self.stats.dead_letters += 1
