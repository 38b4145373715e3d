"""Where a job's protocol events go: one interface, an in-memory and a JSON-lines sink.

The driver wraps every payload in a :class:`~sparkpoint.protocol.Envelope` and publishes a
whole accepted epoch at once. The control plane's Redis sink implements the same interface.
"""

from __future__ import annotations

import abc
import os
import threading
from collections import deque
from collections.abc import Sequence
from typing import TypeVar

from sparkpoint import protocol as p

M = TypeVar("M", bound=p._Model)


class EventSink(abc.ABC):
    """Receives the job's events in the order the driver publishes them."""

    @abc.abstractmethod
    def publish(self, events: Sequence[p.Envelope]) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release resources."""


class InMemoryEventSink(EventSink):
    """Keeps the latest events (all of them unless ``max_events``); for tests and summaries."""

    def __init__(self, max_events: int | None = None) -> None:
        self.events: deque[p.Envelope] = deque(maxlen=max_events)
        self._lock = threading.Lock()

    def publish(self, events: Sequence[p.Envelope]) -> None:
        with self._lock:
            self.events.extend(events)

    def of_type(self, kind: type[M]) -> list[M]:
        """The decoded payloads of one type, in order."""
        name = kind.model_fields["type"].default
        decoded = (e.decoded() for e in self.events if e.type == name)
        return [payload for payload in decoded if isinstance(payload, kind)]


class JsonLinesEventSink(EventSink):
    """Appends each event as one JSON line (the protocol's wire form) to a file."""

    def __init__(self, path: str, max_bytes: int = p.DEFAULT_MAX_MESSAGE_BYTES) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fh = open(path, "ab")
        self._max = max_bytes

    def publish(self, events: Sequence[p.Envelope]) -> None:
        self._fh.write(b"".join(p.encode(e, self._max) + b"\n" for e in events))
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class FanOutEventSink(EventSink):
    """Publishes to several sinks."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = sinks

    def publish(self, events: Sequence[p.Envelope]) -> None:
        for sink in self.sinks:
            sink.publish(events)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
