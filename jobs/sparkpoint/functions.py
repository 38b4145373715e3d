"""Operators of a job graph: stateless chained functions and keyed operators.

Stateless operators (``map``, ``filter``, ``flat_map``, ``map_batch``) transform a whole
:class:`~sparkpoint.records.Batch`; user functions are called once per record, built-in ones
work on columns. Keyed operators run after the key-group exchange with keyed state.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkpoint.errors import ConfigurationError
from sparkpoint.key_grouping import KeyGroups, grouped, grouped_parts, narrow
from sparkpoint.records import Batch, Column, DictColumn
from sparkpoint.state.backend import KeyedStateBackend
from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.state.table_states import add_to_many
from sparkpoint.timers import InternalTimerService, TimerService
from sparkpoint.watermarks import TimestampSelector, extract_timestamps

KeySelector = str | Callable[[Any], Any]


#: The column of a partial count (:meth:`CountOperator.partial`): the records each row stands
#: for.
WEIGHT = "__sparkpoint_weight__"
# A batch is counted before the exchange when it has this many records and its keys repeat
# this many times on average (judged from up to _PARTIAL_SAMPLE keys when not a dictionary).
_PARTIAL_MIN_RECORDS = 256
_PARTIAL_MIN_REPEATS = 4
_PARTIAL_SAMPLE = 1024


def records_of(element: Any) -> int:
    """The records an exchanged element stands for: the sum of a partial count's weights,
    else its length (a watermark's is 0)."""
    if isinstance(element, Batch) and element.is_columnar and WEIGHT in element.columns:
        return int(np.asarray(element.column(WEIGHT)).sum())
    return len(element)


def select_keys(selector: KeySelector, batch: Batch) -> Column:
    """The key of every record of ``batch`` (a column lookup for a field-name selector).

    A field-name selector returns the column as stored, so a :class:`DictColumn` stays
    encoded; a callable selector gives an object array.
    """
    if isinstance(selector, str):
        return batch.column(selector)
    keys = np.empty(len(batch), dtype=object)
    keys[:] = list(map(selector, batch.iter_rows()))
    return keys


class StatelessOperator(abc.ABC):
    """An operator chained into its upstream task."""

    def __init__(self, uid: str, kind: str) -> None:
        self.uid = uid
        self.kind = kind

    @abc.abstractmethod
    def apply(self, batch: Batch) -> Batch: ...


class MapOperator(StatelessOperator):
    def __init__(self, uid: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(uid, "map")
        self.fn = fn

    def apply(self, batch: Batch) -> Batch:
        return Batch.of_rows(map(self.fn, batch.iter_rows()))


class FilterOperator(StatelessOperator):
    def __init__(self, uid: str, fn: Callable[[Any], bool]) -> None:
        super().__init__(uid, "filter")
        self.fn = fn

    def apply(self, batch: Batch) -> Batch:
        if batch.is_columnar:
            kept = map(bool, map(self.fn, batch.iter_rows()))
            keep = np.fromiter(kept, dtype=bool, count=len(batch))
            return batch.take(np.flatnonzero(keep))
        return Batch.of_rows(filter(self.fn, batch.rows))


class FlatMapOperator(StatelessOperator):
    def __init__(self, uid: str, fn: Callable[[Any], Iterable[Any]]) -> None:
        super().__init__(uid, "flat_map")
        self.fn = fn

    def apply(self, batch: Batch) -> Batch:
        return Batch.of_rows(itertools.chain.from_iterable(map(self.fn, batch.iter_rows())))


class MapBatchOperator(StatelessOperator):
    """A vectorized user function: ``Batch -> Batch``, or ``Batch -> pyarrow.Table`` (or
    ``RecordBatch``), which becomes a Batch through :meth:`Batch.from_arrow`."""

    def __init__(self, uid: str, fn: Callable[[Batch], Any]) -> None:
        super().__init__(uid, "map_batch")
        self.fn = fn

    def apply(self, batch: Batch) -> Batch:
        out = self.fn(batch)
        if isinstance(out, Batch):
            return out
        from sparkpoint.arrow_batches import as_batch  # pyarrow only for jobs that use it

        return as_batch(out, self.uid)


class TimestampsAndWatermarksOperator(StatelessOperator):
    """Marks where the source task takes record timestamps and makes watermarks
    (Flink's ``assignTimestampsAndWatermarks`` with ``forBoundedOutOfOrderness``).

    Records pass unchanged; the source task observes them here with a
    :class:`~sparkpoint.watermarks.BoundedOutOfOrdernessWatermarks` of its own.
    """

    def __init__(self, uid: str, timestamps: TimestampSelector, out_of_orderness_ms: int):
        super().__init__(uid, "timestamps_watermarks")
        if out_of_orderness_ms < 0:
            raise ConfigurationError(
                f"max_out_of_orderness_ms must be >= 0, got {out_of_orderness_ms} ({uid})"
            )
        self.timestamps = timestamps
        self.out_of_orderness_ms = out_of_orderness_ms

    def apply(self, batch: Batch) -> Batch:
        return batch


@dataclass(frozen=True)
class OutputTag:
    """Names a side output (Flink's ``OutputTag``): ``ctx.output(tag, value)`` in a keyed
    function, ``stream.get_side_output(tag)`` in the graph."""

    name: str


class KeyedContext:
    """What a keyed function sees: the current key, its keyed state and its timers.

    ``timestamp`` is the event time of the record being processed (or of the timer firing),
    None when the job assigns no timestamps.
    """

    def __init__(
        self, backend: KeyedStateBackend, timers: InternalTimerService | None = None
    ) -> None:
        self._backend = backend
        self._timers = timers
        self.timestamp: int | None = None
        self.side_outputs: dict[str, list[Any]] = {}

    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to side output ``tag`` (beside the records the function yields)."""
        self.side_outputs.setdefault(tag.name, []).append(value)

    def take_side_outputs(self) -> dict[str, Batch]:
        """The side outputs emitted since the last call, by tag name."""
        out = {name: Batch.of_rows(values) for name, values in self.side_outputs.items()}
        self.side_outputs = {}
        return out

    @property
    def current_key(self) -> Any:
        return self._backend.current_key

    def timer_service(self) -> TimerService:
        """Event-time timers of the current key, and the current watermark."""
        if self._timers is None:
            raise ConfigurationError("this keyed operator has no timer service")
        return TimerService(self._backend, self._timers)

    def get_state(self, descriptor: Any) -> Any:
        """The ValueState / ListState / MapState for ``descriptor``, scoped to the current key."""
        return self._backend.get_state(descriptor)


class KeyedProcessFunction:
    """Flink's KeyedProcessFunction: per record, with keyed state; yields its outputs."""

    def open(self, ctx: KeyedContext) -> None:
        """Called once per subtask and epoch before the first record (create state here)."""

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterable[Any]:
        """An event-time timer of ``ctx.current_key`` fired (the watermark passed it)."""
        return ()


def _add_counts(
    backend: KeyedStateBackend, state: str, groups: KeyGroups, per_key: np.ndarray
) -> np.ndarray:
    """Each distinct key's new count: ``per_key`` added to the count in state ``state``."""
    table = backend.table(state)
    return add_to_many(table, groups.keys, per_key, groups.distinct, groups.hashes)


class KeyedOperator(abc.ABC):
    """An operator after the key-group exchange, with keyed state."""

    kind = "keyed"

    def __init__(self, uid: str, selector: KeySelector, emit: str = "every") -> None:
        if emit not in ("every", "epoch"):
            raise ConfigurationError(f"emit must be 'every' or 'epoch', not {emit!r} ({uid})")
        self.uid = uid
        self.selector = selector
        self.emit = emit
        self.key_field = selector if isinstance(selector, str) else "key"

    @abc.abstractmethod
    def process(self, batch: Batch, backend: KeyedStateBackend) -> Batch:
        """Process a batch of records of this subtask's key groups; return the output."""

    def selector_for(self, input_index: int) -> KeySelector:
        """The key of the records of input ``input_index`` (all inputs share one here)."""
        return self.selector

    def process_input(self, input_index: int, batch: Batch, backend: KeyedStateBackend) -> Batch:
        """Process a batch of input ``input_index`` (a union's inputs are alike)."""
        return self.process(batch, backend)

    def fields_read(self, input_index: int) -> frozenset[str] | None:
        """The fields of input ``input_index``'s records that this operator reads, or None
        when it may read any (a user function of the whole record, a key selector that is a
        function). The sending task ships only these fields through the exchange (column
        pruning); nothing downstream of the operator sees its input records."""
        return None

    def partial(self, batch: Batch) -> Batch | None:
        """What the sending task may ship instead of ``batch`` (map-side partial aggregation,
        before the key-group exchange), or None to ship the records. A sending task calls it
        on the records between two barriers at most, so a partial never merges what
        precedes a barrier with what follows it."""
        return None

    def take_side_outputs(self) -> dict[str, Batch]:
        """Records emitted to side outputs since the last call, by tag name."""
        ctx = getattr(self, "_ctx", None)
        return ctx.take_side_outputs() if isinstance(ctx, KeyedContext) else {}

    def open(self, backend: KeyedStateBackend) -> None:
        self._changed: dict[Any, Any] = {}
        self.late_records_dropped = 0

    def on_watermark(self, backend: KeyedStateBackend) -> Batch:
        """The subtask's watermark (``backend.current_watermark``) advanced: fire timers."""
        return Batch.of_rows([])

    def flush_updates(self, backend: KeyedStateBackend) -> Batch:
        """With ``emit="epoch"``: the latest value of every key updated since the last flush.

        Called at the end of every epoch and on every aligned barrier, before the snapshot:
        updates made before barrier *n* are emitted into the transaction that checkpoint *n*
        commits, so a restore from *n* never loses the latest value of a key that changed
        only before the barrier.
        """
        return Batch.of_rows([])


class CountOperator(KeyedOperator):
    """Running count per key, vectorized: one ``numpy`` pass per batch, no call per record."""

    kind = "count"
    STATE = "count"

    def __init__(self, uid: str, selector: KeySelector, output: str, emit: str) -> None:
        super().__init__(uid, selector, emit)
        self.output = output

    def open(self, backend: KeyedStateBackend) -> None:
        super().open(backend)
        # Counts are int64 (a backend may keep them as numbers in columns); a state restored
        # from a snapshot of an earlier version, written with pickle, stays pickle.
        restored = backend.state_infos.get(self.STATE)
        serializer = "pickle" if restored and restored.serializer == "pickle" else "int64"
        backend.get_state(ValueStateDescriptor(self.STATE, 0, serializer=serializer))
        self._pending: list[np.ndarray | DictColumn] = []  # key columns not yet counted
        self._weights: list[np.ndarray | None] = []  # their partial counts (None: 1 each)

    def fields_read(self, input_index: int) -> frozenset[str] | None:
        """A count reads the key and nothing else of a record."""
        return frozenset({self.selector}) if isinstance(self.selector, str) else None

    def partial(self, batch: Batch) -> Batch | None:
        """With ``emit="epoch"`` (no output per record), a batch whose keys repeat becomes
        one record per distinct key and its count (:data:`WEIGHT`): the exchange carries
        and the keyed subtask counts a fraction of the records. Keys that barely repeat
        (judged from the dictionary's size, or a sample) are shipped as they are."""
        if self.emit != "epoch" or not isinstance(self.selector, str) or not batch.is_columnar:
            return None
        if WEIGHT in batch.columns or len(batch) < _PARTIAL_MIN_RECORDS:
            return None
        keys = batch.column(self.selector)
        if isinstance(keys, DictColumn):
            if len(keys.values) * _PARTIAL_MIN_REPEATS > len(keys):
                return None
        else:
            sample = keys[:: max(1, len(keys) // _PARTIAL_SAMPLE)].tolist()
            with contextlib.suppress(TypeError):  # unhashable keys: decided by the grouping
                if len(set(sample)) * _PARTIAL_MIN_REPEATS > len(sample):
                    return None
        groups = grouped(keys)
        per_key = np.bincount(groups.inverse, minlength=len(groups.keys))
        if len(per_key) * _PARTIAL_MIN_REPEATS > len(keys):
            return None
        return Batch.of_columns(**{self.selector: groups.distinct, WEIGHT: per_key})

    def process(self, batch: Batch, backend: KeyedStateBackend) -> Batch:
        keys = select_keys(self.selector, batch)
        if not len(keys):
            return Batch.of_rows([])
        weights = None
        if batch.is_columnar and WEIGHT in batch.columns:
            weights = np.asarray(batch.column(WEIGHT), dtype=np.int64)
        if self.emit == "epoch":
            # Counted at the next flush (an aligned barrier or the epoch's end), the batches
            # since the last one together: a key costs one state access per flush, and
            # nothing reads the counts in between (the snapshot follows the flush).
            self._pending.append(keys)
            self._weights.append(weights)
            return Batch.of_rows([])
        assert weights is None, "a partial count reached a count that emits every record"
        groups = grouped(keys)
        inverse = groups.inverse
        per_key = np.bincount(inverse, minlength=len(groups.keys))
        totals = _add_counts(backend, self.STATE, groups, per_key)
        # Running count of each record: base + its 1-based rank among its key's records.
        order = np.argsort(narrow(inverse, len(groups.keys)), kind="stable")
        starts = np.concatenate(([0], np.cumsum(per_key)[:-1]))
        rank = np.empty(len(keys), dtype=np.int64)
        rank[order] = np.arange(len(keys)) - np.repeat(starts, per_key) + 1
        base = totals - per_key
        return Batch.of_columns(**{self.key_field: keys, self.output: base[inverse] + rank})

    def flush_updates(self, backend: KeyedStateBackend) -> Batch:
        if not self._pending:
            return Batch.of_rows([])
        parts, self._pending = self._pending, []
        weights, self._weights = self._weights, []
        groups = grouped_parts(parts)
        if all(w is None for w in weights):
            per_key = np.bincount(groups.inverse, minlength=len(groups.keys))
        else:  # partial counts: each row counts its weight
            each = [
                np.ones(len(k)) if w is None else w for k, w in zip(parts, weights, strict=True)
            ]
            # float64 sums of integers are exact below 2**53 records per key and flush
            summed = np.bincount(groups.inverse, np.concatenate(each), len(groups.keys))
            per_key = summed.astype(np.int64)
        totals = _add_counts(backend, self.STATE, groups, per_key)
        return Batch.of_columns(**{self.key_field: groups.distinct, self.output: totals})


class ReduceOperator(KeyedOperator):
    """Flink's ``reduce``: folds each key's records with ``fn``, emits the running value."""

    kind = "reduce"

    def __init__(self, uid: str, selector: KeySelector, fn: Callable[[Any, Any], Any], emit: str):
        super().__init__(uid, selector, emit)
        self.fn = fn
        self.descriptor = ValueStateDescriptor("reduce")

    def process(self, batch: Batch, backend: KeyedStateBackend) -> Batch:
        out = []
        keys = backend.each_key(select_keys(self.selector, batch))
        state = backend.get_state(self.descriptor)
        for key, value in zip(keys, batch.iter_rows(), strict=True):
            acc = state.value()
            acc = value if acc is None else self.fn(acc, value)
            state.update(acc)
            if self.emit == "every":
                out.append(acc)
            else:
                self._changed[key] = acc
        return Batch.of_rows(out)

    def flush_updates(self, backend: KeyedStateBackend) -> Batch:
        out = Batch.of_rows(list(self._changed.values()))
        self._changed = {}
        return out


class ProcessOperator(KeyedOperator):
    """Runs a :class:`KeyedProcessFunction` once per record, with its key set."""

    kind = "process"

    def __init__(
        self,
        uid: str,
        selector: KeySelector,
        fn: KeyedProcessFunction,
        timestamps: TimestampSelector | None = None,
    ) -> None:
        super().__init__(uid, selector, "every")
        self.fn = fn
        self.timestamps = timestamps

    def open(self, backend: KeyedStateBackend) -> None:
        super().open(backend)
        self._timers = InternalTimerService(backend)
        self._ctx = KeyedContext(backend, self._timers)
        self.fn.open(self._ctx)

    def process(self, batch: Batch, backend: KeyedStateBackend) -> Batch:
        out: list[Any] = []
        keys = backend.each_key(select_keys(self.selector, batch))
        stamps: list[Any] = [None] * len(batch)
        if self.timestamps is not None:
            stamps = extract_timestamps(self.timestamps, batch).tolist()
        ctx, process_element = self._ctx, self.fn.process_element
        for _, value, ts in zip(keys, batch.iter_rows(), stamps, strict=True):
            ctx.timestamp = ts
            out.extend(process_element(value, ctx))
        return Batch.of_rows(out)

    def on_watermark(self, backend: KeyedStateBackend) -> Batch:
        return Batch.of_rows(self._timers.advance(self._on_timer))

    def _on_timer(self, timestamp: int, key: Any) -> Iterable[Any]:
        self._ctx.timestamp = timestamp
        return self.fn.on_timer(timestamp, self._ctx)


class KeyedCoProcessFunction:
    """Flink's KeyedCoProcessFunction: two connected inputs keyed alike, one keyed state."""

    def open(self, ctx: KeyedContext) -> None:
        """Called once per subtask and epoch before the first record (create state here)."""

    def process_element1(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        raise NotImplementedError

    def process_element2(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        raise NotImplementedError


class CoProcessOperator(KeyedOperator):
    """Runs a :class:`KeyedCoProcessFunction`: records of input 0 go to
    ``process_element1``, of input 1 to ``process_element2``, each keyed by its own selector
    (the two keys must be alike: equal keys meet in one subtask and one state entry)."""

    kind = "co_process"

    def __init__(
        self, uid: str, selectors: tuple[KeySelector, KeySelector], fn: KeyedCoProcessFunction
    ) -> None:
        super().__init__(uid, selectors[0], "every")
        self.selectors = selectors
        self.fn = fn

    def open(self, backend: KeyedStateBackend) -> None:
        super().open(backend)
        self._ctx = KeyedContext(backend)
        self.fn.open(self._ctx)

    def selector_for(self, input_index: int) -> KeySelector:
        return self.selectors[input_index]

    def process(self, batch: Batch, backend: KeyedStateBackend) -> Batch:
        return self.process_input(0, batch, backend)

    def process_input(self, input_index: int, batch: Batch, backend: KeyedStateBackend) -> Batch:
        handle = self.fn.process_element1 if input_index == 0 else self.fn.process_element2
        keys = backend.each_key(select_keys(self.selectors[input_index], batch))
        out: list[Any] = []
        for _, value in zip(keys, batch.iter_rows(), strict=True):
            out.extend(handle(value, self._ctx))
        return Batch.of_rows(out)
