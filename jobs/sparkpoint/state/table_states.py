"""The state objects of every keyed state backend: value, list and map state on a table.

Each object is bound to one state's :class:`~sparkpoint.state.backend.StateTable` (key ->
value; for a list state the value is a list, for a map state a dict) and always acts on its
backend's current key, which it asks the
:class:`~sparkpoint.state.backend.KeyedStateBackend` for on every access. Values are mutated
in place: a table counts every key it was asked for as changed. :func:`bind_state` makes the
object a state descriptor asks for; :func:`add_to_many` adds to the numbers of a batch of keys
at once (the built-in ``count``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkpoint.errors import ConfigurationError
from sparkpoint.state.backend import NO_KEY
from sparkpoint.state.descriptors import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    StateDescriptor,
    ValueState,
    ValueStateDescriptor,
)

if TYPE_CHECKING:
    from sparkpoint.state.backend import KeyedStateBackend, StateTable

_MISSING: Any = object()  # a missing value, for table.get


def bind_state(
    backend: KeyedStateBackend, descriptor: StateDescriptor, table: StateTable
) -> ValueState | ListState | MapState:
    """The state object for ``descriptor`` on ``table``, the state's dict in ``backend``.

    Raises:
        ConfigurationError: for a descriptor of no known kind.
    """
    if isinstance(descriptor, ValueStateDescriptor):
        return _TableValueState(backend, descriptor, table)
    if isinstance(descriptor, ListStateDescriptor):
        return _TableListState(backend, descriptor.name, table)
    if isinstance(descriptor, MapStateDescriptor):
        return _TableMapState(backend, descriptor.name, table)
    raise ConfigurationError(f"unsupported state descriptor {type(descriptor).__name__}")


class _TableState:
    __slots__ = ("_backend", "_name", "_table")

    def __init__(self, backend: KeyedStateBackend, name: str, table: StateTable):
        self._backend = backend
        self._name = name
        self._table = table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"

    def clear(self) -> None:
        self._table.pop(self._backend._key(self._name), None)


class _TableValueState(_TableState, ValueState):
    __slots__ = ("_descriptor",)

    def __init__(
        self,
        backend: KeyedStateBackend,
        descriptor: ValueStateDescriptor,
        table: StateTable,
    ) -> None:
        super().__init__(backend, descriptor.name, table)
        self._descriptor = descriptor

    # value() and update() run once or twice per record of a KeyedProcessFunction: they
    # read the current key as an attribute, and call _key only to raise when there is none.
    def value(self) -> Any:
        key = self._backend._current_key
        if key is NO_KEY:
            key = self._backend._key(self._name)
        value = self._table.get(key, _MISSING)
        return self._descriptor.default_value() if value is _MISSING else value

    def update(self, value: Any) -> None:
        key = self._backend._current_key
        if key is NO_KEY:
            key = self._backend._key(self._name)
        if value is None:
            self._table.pop(key, None)
        else:
            self._table[key] = value


class _TableListState(_TableState, ListState):
    __slots__ = ()

    def get(self) -> list[Any]:
        return list(self._table.get(self._backend._key(self._name), ()))

    def add(self, value: Any) -> None:
        key = self._backend._key(self._name)
        values = self._table.get(key)
        if values is None:
            self._table[key] = [value]
        else:
            values.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        key = self._backend._key(self._name)
        new = list(values)
        if not new:
            return
        current = self._table.get(key)
        if current is None:
            self._table[key] = new
        else:
            current.extend(new)

    def update(self, values: Iterable[Any]) -> None:
        key = self._backend._key(self._name)
        new = list(values)
        if new:
            self._table[key] = new
        else:
            self._table.pop(key, None)


class _TableMapState(_TableState, MapState):
    __slots__ = ()

    def _map(self) -> dict[Any, Any] | None:
        return self._table.get(self._backend._key(self._name))

    def get(self, key: Any) -> Any:
        entries = self._map()
        return None if entries is None else entries.get(key)

    def put(self, key: Any, value: Any) -> None:
        current = self._backend._key(self._name)
        entries = self._table.get(current)
        if entries is None:
            self._table[current] = {key: value}
        else:
            entries[key] = value

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        current = self._backend._key(self._name)
        if not entries:
            return
        existing = self._table.get(current)
        if existing is None:
            self._table[current] = dict(entries)
        else:
            existing.update(entries)

    def contains(self, key: Any) -> bool:
        entries = self._map()
        return entries is not None and key in entries

    def remove(self, key: Any) -> None:
        current = self._backend._key(self._name)
        entries = self._table.get(current)
        if entries is None:
            return
        entries.pop(key, None)
        if not entries:  # as Flink's heap backend: an empty map is no state
            del self._table[current]

    def keys(self) -> list[Any]:
        return list(self._map() or ())

    def values(self) -> list[Any]:
        entries = self._map()
        return [] if entries is None else list(entries.values())

    def items(self) -> list[tuple[Any, Any]]:
        entries = self._map()
        return [] if entries is None else list(entries.items())

    def is_empty(self) -> bool:
        return not self._map()


def add_to_many(
    table: StateTable,
    keys: list[Any],
    deltas: np.ndarray,
    array: np.ndarray | None = None,
    hashes: np.ndarray | None = None,
) -> np.ndarray:
    """Add ``deltas[i]`` to the number of ``keys[i]`` (0 where absent) for distinct ``keys``;
    the new values. A table that keeps numbers does it in one pass (``add_many``, which
    answers None for a state it cannot add to); any other reads and writes the batch.
    ``array``: the keys as a numpy array too (a table of str keys finds them from it);
    ``hashes``: their hashes in ascending order, when the keys were grouped by them
    (:class:`~sparkpoint.key_grouping.KeyGroups`)."""
    add_many = getattr(table, "add_many", None)
    strings = array if array is not None and array.dtype.kind in "US" else None
    if strings is None:
        hashes = None  # hashes of keys that are not strings: none a table could use
    totals = None if add_many is None else add_many(keys, deltas, strings, hashes)
    if totals is not None:
        return totals
    base = np.fromiter(table.get_many(keys, 0), dtype=np.int64, count=len(keys))
    totals = base + deltas
    table.put_many(keys, totals.tolist())
    return totals
