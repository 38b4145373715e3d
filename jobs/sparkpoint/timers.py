"""Event-time timers of keyed operators, kept in keyed state (Flink's ``InternalTimerService``).

Timers are keyed state: the map state ``__timers__`` holds, per key, the timestamps of its
pending timers, so key-group snapshots, restores to another parallelism and working state
carry them like any other state. An in-memory index (timestamp -> keys, and a heap of
timestamps) is rebuilt from that state whenever an operator opens. When the subtask's
watermark advances, the timers up to it fire in timestamp order, then key order, so the
output does not depend on the order in which the timers were registered.

Processing-time timers are not supported: the job runs in epochs over offset ranges, so
wall-clock timers would make a replay after recovery differ from the first run.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

from sparkpoint.errors import ConfigurationError
from sparkpoint.state.backend import KeyedStateBackend, StateTable
from sparkpoint.state.descriptors import MapStateDescriptor

TIMERS_STATE = "__timers__"


def ordered_keys(keys: Iterable[Any]) -> list[Any]:
    """Keys in their natural order, or by ``repr`` when they cannot be compared."""
    keys = list(keys)
    try:
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=repr)


class InternalTimerService:
    """The event-time timers of one keyed subtask, in its state backend."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend
        backend.get_state(MapStateDescriptor(TIMERS_STATE))  # registers (or finds restored)
        self._table: StateTable = backend.table(TIMERS_STATE)
        self._by_time: dict[int, set[Any]] = {}
        self._heap: list[int] = []
        for key, stamps in self._table.items():
            for ts in stamps:
                self._index(key, ts)

    @property
    def watermark(self) -> int:
        """The subtask's current watermark (the minimum over its input channels)."""
        return self._backend.current_watermark

    def _index(self, key: Any, ts: int) -> None:
        keys = self._by_time.get(ts)
        if keys is None:
            keys = self._by_time[ts] = set()
            heapq.heappush(self._heap, ts)
        keys.add(key)

    def register(self, key: Any, ts: int) -> None:
        stamps = self._table.get(key)
        if stamps is None:
            stamps = self._table[key] = {}
        if ts not in stamps:
            stamps[ts] = None
            self._index(key, ts)

    def delete(self, key: Any, ts: int) -> None:
        stamps = self._table.get(key)
        if stamps is None or ts not in stamps:
            return
        self._remove(key, ts, stamps)
        keys = self._by_time.get(ts)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_time[ts]  # its heap entry is skipped when popped

    def _remove(self, key: Any, ts: int, stamps: dict[int, None]) -> None:
        del stamps[ts]
        if not stamps:
            del self._table[key]

    def pending(self, key: Any) -> list[int]:
        """The timestamps of ``key``'s pending timers, ascending."""
        return sorted(self._table.get(key, ()))

    def __len__(self) -> int:
        return sum(len(keys) for keys in self._by_time.values())

    def advance(self, on_timer: Callable[[int, Any], Iterable[Any]]) -> list[Any]:
        """Fire every timer up to the watermark; ``on_timer(timestamp, key)`` runs with the
        key current. Timers registered while firing fire too when they are due."""
        out: list[Any] = []
        watermark = self.watermark
        while self._heap and self._heap[0] <= watermark:
            ts = heapq.heappop(self._heap)
            keys = self._by_time.pop(ts, None)
            if not keys:
                continue
            for key in ordered_keys(keys):
                self._remove(key, ts, self._table[key])
                self._backend.set_current_key(key)
                out.extend(on_timer(ts, key))
        return out


class TimerService:
    """Flink's ``TimerService`` as a keyed function sees it: timers of the current key."""

    def __init__(self, backend: KeyedStateBackend, timers: InternalTimerService) -> None:
        self._backend = backend
        self._timers = timers

    def current_watermark(self) -> int:
        return self._timers.watermark

    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` for the current key once the watermark passes
        ``timestamp`` (one timer per key and timestamp; registering it again does nothing)."""
        self._timers.register(self._backend.current_key, int(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._timers.delete(self._backend.current_key, int(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        raise ConfigurationError(
            "processing-time timers are not supported: use event-time timers "
            "(register_event_time_timer) with assign_timestamps_and_watermarks"
        )
