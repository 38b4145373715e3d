"""Event-time windows: tumbling and sliding window assigners and the keyed window operator.

Flink's ``TumblingEventTimeWindows`` / ``SlidingEventTimeWindows`` with an incremental
aggregate (``count``, ``reduce``, ``aggregate``). Per key, the operator keeps one accumulator
per open window in keyed state (map state ``windows``: key -> {(start, end): accumulator}) and
an event-time timer at ``end - 1`` (the window's max timestamp); when the watermark passes it,
the window fires once, emits ``{<key field>: key, "window_start": s, "window_end": e,
<output>: value}`` and is cleared. A record whose windows have all fired already (their max
timestamp is at or below the watermark) is late: it is dropped and counted, as Flink does
with no allowed lateness.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import KeyedOperator, KeySelector, select_keys
from sparkpoint.records import Batch
from sparkpoint.state.backend import KeyedStateBackend, StateTable
from sparkpoint.state.descriptors import MapStateDescriptor
from sparkpoint.timers import InternalTimerService
from sparkpoint.watermarks import TimestampSelector, extract_timestamps

Window = tuple[int, int]  # [start, end) in ms


@dataclass(frozen=True)
class SlidingEventTimeWindows:
    """Windows of ``size_ms`` starting every ``slide_ms`` (aligned to ``offset_ms``)."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise ConfigurationError(
                f"window size and slide must be > 0 ms, got {self.size_ms} and {self.slide_ms}"
            )
        if not 0 <= self.offset_ms < self.slide_ms:
            raise ConfigurationError(f"window offset must lie in [0, slide), got {self.offset_ms}")

    def assign(self, timestamp: int) -> list[Window]:
        """The windows holding ``timestamp``, by start ascending."""
        last = timestamp - (timestamp - self.offset_ms) % self.slide_ms
        starts = range(last, timestamp - self.size_ms, -self.slide_ms)
        return [(s, s + self.size_ms) for s in reversed(starts)]


@dataclass(frozen=True)
class TumblingEventTimeWindows:
    """Back-to-back windows of ``size_ms`` (aligned to ``offset_ms``)."""

    size_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ConfigurationError(f"window size must be > 0 ms, got {self.size_ms}")
        if not 0 <= self.offset_ms < self.size_ms:
            raise ConfigurationError(f"window offset must lie in [0, size), got {self.offset_ms}")

    def assign(self, timestamp: int) -> list[Window]:
        start = timestamp - (timestamp - self.offset_ms) % self.size_ms
        return [(start, start + self.size_ms)]


WindowAssigner = TumblingEventTimeWindows | SlidingEventTimeWindows


class _Initial(enum.Enum):
    """The marker for "no ``initial`` given" (``reduce``). An enum member pickles by name, so
    the copy a Spark worker unpickles is the same object (an ``object()`` would not be)."""

    NONE = 0


_NO_INITIAL = _Initial.NONE


def count_one(acc: int, _value: Any) -> int:
    return acc + 1


class WindowOperator(KeyedOperator):
    """Aggregates each key's records per event-time window; a window fires once.

    ``add(acc, value)`` folds a record into a window's accumulator, starting from a copy of
    ``initial``; with ``initial`` left out (``reduce``) the first record is the accumulator.
    Whether there is an ``initial`` is kept as the flag ``has_initial``, not as a marker
    object, so the operator means the same after it is pickled to the Spark workers.
    """

    kind = "window"
    STATE = "windows"

    def __init__(
        self,
        uid: str,
        selector: KeySelector,
        assigner: WindowAssigner,
        timestamps: TimestampSelector,
        add: Callable[[Any, Any], Any],
        output: str,
        initial: Any = _NO_INITIAL,
        needs_values: bool = True,
    ) -> None:
        super().__init__(uid, selector, "every")
        self.assigner = assigner
        self.timestamps = timestamps
        self.add = add
        self.output = output
        self.has_initial = initial is not _NO_INITIAL
        self.initial = initial if self.has_initial else None
        self.needs_values = needs_values

    def open(self, backend: KeyedStateBackend) -> None:
        super().open(backend)
        backend.get_state(MapStateDescriptor(self.STATE))  # registers the state
        self._windows: StateTable = backend.table(self.STATE)
        self._timers = InternalTimerService(backend)

    def fields_read(self, input_index: int) -> frozenset[str] | None:
        """A window count reads a record's key and timestamp; a window that folds records
        (``reduce``, ``aggregate``) hands the whole record to its function."""
        if self.needs_values or not isinstance(self.selector, str):
            return None
        if not isinstance(self.timestamps, str):
            return None
        return frozenset({self.selector, self.timestamps})

    def _first(self, value: Any) -> Any:
        """The accumulator of a window whose first record is ``value``."""
        if not self.has_initial:
            return value
        return self.add(copy.deepcopy(self.initial), value)

    def process(self, batch: Batch, backend: KeyedStateBackend) -> Batch:
        if not len(batch):
            return Batch.of_rows([])
        keys = select_keys(self.selector, batch).tolist()
        stamps = extract_timestamps(self.timestamps, batch).tolist()
        values: list[Any] = batch.rows if self.needs_values else [None] * len(keys)
        watermark = backend.current_watermark
        for key, ts, value in zip(keys, stamps, values, strict=True):
            windows = [w for w in self.assigner.assign(ts) if w[1] - 1 > watermark]
            if not windows:
                self.late_records_dropped += 1
                continue
            accs = self._windows.get(key)
            if accs is None:
                backend.set_current_key(key)  # checks the key's key group, once per key
                accs = self._windows[key] = {}
            for w in windows:
                if w in accs:
                    accs[w] = self.add(accs[w], value)
                else:
                    self._timers.register(key, w[1] - 1)
                    accs[w] = self._first(value)
        return Batch.of_rows([])

    def on_watermark(self, backend: KeyedStateBackend) -> Batch:
        return Batch.of_rows(self._timers.advance(self._fire))

    def _fire(self, timestamp: int, key: Any) -> list[dict[str, Any]]:
        accs = self._windows.get(key, {})
        due = sorted(w for w in accs if w[1] - 1 == timestamp)
        out = [
            {self.key_field: key, "window_start": s, "window_end": e, self.output: accs.pop((s, e))}
            for s, e in due
        ]
        if not accs:
            self._windows.pop(key, None)
        return out
