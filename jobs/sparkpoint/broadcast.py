"""The broadcast pattern: a keyed stream connected with a broadcast stream (Flink's
``KeyedBroadcastProcessFunction``).

    rules = env.from_source(rule_source, uid="rules").broadcast(RULES)
    (
        events.key_by(user_of)
        .connect(rules)
        .process(ApplyRules(), uid="apply-rules")
        .sink_to(FileSink(out), uid="sink")
    )

Every record of the broadcast input goes to every subtask of the keyed vertex (the keyed input
keeps its key-group routing); barriers align across the channels of both inputs. A subtask
calls ``process_broadcast_element`` for each broadcast record, which may change the broadcast
state (:mod:`sparkpoint.broadcast_state`: a map per descriptor, one copy per subtask) and visit
the keyed state of every key of the subtask with ``ctx.apply_to_keyed_state``; and
``process_element`` for each keyed record, with that record's keyed state and timers and the
broadcast state read-only. Event-time timers fire when the keyed input is one source with
timestamps and watermarks and the broadcast source has watermarks too (the vertex's watermark
is the minimum over the channels of both inputs, as in Flink).

Where Sparkpoint differs from Flink: records go out as the functions yield them, so the
function given to ``apply_to_keyed_state`` returns the records it emits (or None) and
``apply_to_keyed_state`` returns them all, to be yielded (Flink's ``KeyedStateFunction``
collects through the ``Collector`` it closes over). Keys are visited in their natural order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sparkpoint.broadcast_state import BroadcastState, ReadOnlyBroadcastState
from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import KeyedContext, KeyedOperator, KeySelector, OutputTag, select_keys
from sparkpoint.operator_state import (
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
)
from sparkpoint.records import Batch
from sparkpoint.state.backend import KeyedStateBackend
from sparkpoint.state.descriptors import MapStateDescriptor, StateDescriptor
from sparkpoint.timers import InternalTimerService, ordered_keys
from sparkpoint.watermarks import TimestampSelector, extract_timestamps

#: What ``apply_to_keyed_state`` calls per key: ``fn(key, state)`` -> records to emit, or None.
KeyedStateFunction = Callable[[Any, Any], Iterable[Any] | None]


def _lookup(
    states: dict[str, BroadcastState], descriptor: MapStateDescriptor | str, uid: str
) -> BroadcastState:
    name = descriptor if isinstance(descriptor, str) else descriptor.name
    state = states.get(name)
    if state is None:
        raise ConfigurationError(
            f"{uid}: no broadcast state named {name!r} (the broadcast stream declares "
            f"{sorted(states)}); pass its descriptor to broadcast(...)"
        )
    return state


class KeyedReadOnlyContext(KeyedContext):
    """What ``process_element`` and ``on_timer`` see (Flink's ``ReadOnlyContext``): the
    current key, its keyed state and timers, and the broadcast state read-only."""

    def __init__(
        self,
        backend: KeyedStateBackend,
        timers: InternalTimerService,
        broadcast: dict[str, BroadcastState],
        uid: str,
    ) -> None:
        super().__init__(backend, timers)
        self._broadcast = broadcast
        self._uid = uid

    def get_broadcast_state(self, descriptor: MapStateDescriptor | str) -> ReadOnlyBroadcastState:
        """The broadcast state ``descriptor`` names; writing to it raises
        :class:`~sparkpoint.broadcast_state.ReadOnlyBroadcastStateError`."""
        return _lookup(self._broadcast, descriptor, self._uid).read_only()


class KeyedBroadcastContext:
    """What ``process_broadcast_element`` sees (Flink's ``Context``): the broadcast state,
    writable, and the keyed state of every key through :meth:`apply_to_keyed_state`; there is
    no current key (keyed state accessed directly raises ``NoCurrentKeyError``). ``timestamp``
    is None: a broadcast record's event time is not taken."""

    def __init__(self, keyed: KeyedReadOnlyContext, backend: KeyedStateBackend, uid: str) -> None:
        self._keyed = keyed
        self._backend = backend
        self._uid = uid
        self.timestamp: int | None = None

    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to side output ``tag`` (beside the records the function yields)."""
        self._keyed.output(tag, value)

    @property
    def current_watermark(self) -> int:
        """The subtask's event-time watermark (Flink's ``Context.currentWatermark``)."""
        return self._backend.current_watermark

    def get_broadcast_state(self, descriptor: MapStateDescriptor | str) -> BroadcastState:
        """The broadcast state ``descriptor`` names, writable."""
        return _lookup(self._keyed._broadcast, descriptor, self._uid)

    def apply_to_keyed_state(
        self, descriptor: StateDescriptor, fn: KeyedStateFunction
    ) -> list[Any]:
        """Call ``fn(key, state)`` for every key of this subtask that has state
        ``descriptor``, in key order, with ``state`` bound to that key (Flink's
        ``applyToKeyedState``); ``fn`` may change or clear it. Returns every record ``fn``
        returned, in order, for the caller to yield."""
        backend = self._backend
        state = backend.get_state(descriptor)  # type: ignore[call-overload]  # any kind
        keys = ordered_keys(key for key, _ in backend.table(descriptor.name).items())
        out: list[Any] = []
        try:
            for key in keys:
                backend.set_current_key(key)
                emitted = fn(key, state)
                if emitted is not None:
                    out.extend(emitted)
        finally:
            backend.clear_current_key()
        return out


class KeyedBroadcastProcessFunction:
    """Flink's ``KeyedBroadcastProcessFunction``: a keyed stream connected with a broadcast
    stream (:mod:`sparkpoint.broadcast`). Both ``process_*`` methods yield their outputs."""

    def open(self, ctx: KeyedReadOnlyContext) -> None:
        """Called once per subtask and epoch before the first record (create state here)."""

    def process_element(self, value: Any, ctx: KeyedReadOnlyContext) -> Iterable[Any]:
        """A record of the keyed input, with its key's state; broadcast state read-only."""
        raise NotImplementedError

    def process_broadcast_element(self, value: Any, ctx: KeyedBroadcastContext) -> Iterable[Any]:
        """A record of the broadcast input; every subtask sees every one, in the same order."""
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: KeyedReadOnlyContext) -> Iterable[Any]:
        """An event-time timer of ``ctx.current_key`` fired (the watermark passed it)."""
        return ()


class BroadcastProcessOperator(KeyedOperator, CheckpointedFunction):
    """Runs a :class:`KeyedBroadcastProcessFunction`. Inputs before ``keyed_inputs`` are the
    keyed ones (a union's), the last one the broadcast input. The operator is the checkpointed
    function of its own broadcast state (mode ``"broadcast"``), and hands the store on to the
    user's function when that is a :class:`CheckpointedFunction` too."""

    kind = "broadcast_process"

    def __init__(
        self,
        uid: str,
        selector: KeySelector,
        fn: KeyedBroadcastProcessFunction,
        descriptors: tuple[MapStateDescriptor, ...],
        keyed_inputs: int,
        timestamps: TimestampSelector | None = None,
    ) -> None:
        super().__init__(uid, selector, "every")
        if not isinstance(fn, KeyedBroadcastProcessFunction):
            raise ConfigurationError(
                f"{uid}: a keyed stream connected with a broadcast stream is processed by a "
                f"KeyedBroadcastProcessFunction, got {type(fn).__name__}"
            )
        self.fn = fn
        self.descriptors = descriptors
        self.keyed_inputs = keyed_inputs
        self.timestamps = timestamps
        self._states: dict[str, BroadcastState] = {}

    # ------------------------------------------------------------------ operator state
    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        store = ctx.operator_state_store
        self._states = {d.name: store.get_broadcast_state(d) for d in self.descriptors}
        if isinstance(self.fn, CheckpointedFunction):
            self.fn.initialize_state(ctx)

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        # The broadcast states are the store's own maps: nothing to copy into it.
        if isinstance(self.fn, CheckpointedFunction):
            self.fn.snapshot_state(ctx)

    # ------------------------------------------------------------------ records
    def open(self, backend: KeyedStateBackend) -> None:
        super().open(backend)
        for d in self.descriptors:  # without operator state (a unit test): empty copies
            self._states.setdefault(d.name, BroadcastState(d.name, {}))
        self._timers = InternalTimerService(backend)
        self._ctx = KeyedReadOnlyContext(backend, self._timers, self._states, self.uid)
        self._broadcast_ctx = KeyedBroadcastContext(self._ctx, backend, self.uid)
        self.fn.open(self._ctx)

    def process(self, batch: Batch, backend: KeyedStateBackend) -> Batch:
        return self.process_input(0, batch, backend)

    def process_input(self, input_index: int, batch: Batch, backend: KeyedStateBackend) -> Batch:
        out: list[Any] = []
        if input_index >= self.keyed_inputs:
            backend.clear_current_key()
            for value in batch.rows:
                emitted = self.fn.process_broadcast_element(value, self._broadcast_ctx)
                if emitted is not None:
                    out.extend(emitted)
            return Batch.of_rows(out)
        rows = batch.rows
        keys = select_keys(self.selector, batch).tolist()
        stamps: list[Any] = [None] * len(rows)
        if self.timestamps is not None:
            stamps = extract_timestamps(self.timestamps, batch).tolist()
        for key, value, ts in zip(keys, rows, stamps, strict=True):
            backend.set_current_key(key)
            self._ctx.timestamp = ts
            emitted = self.fn.process_element(value, self._ctx)
            if emitted is not None:
                out.extend(emitted)
        return Batch.of_rows(out)

    def on_watermark(self, backend: KeyedStateBackend) -> Batch:
        return Batch.of_rows(self._timers.advance(self._on_timer))

    def _on_timer(self, timestamp: int, key: Any) -> Iterable[Any]:
        self._ctx.timestamp = timestamp
        return self.fn.on_timer(timestamp, self._ctx) or ()
