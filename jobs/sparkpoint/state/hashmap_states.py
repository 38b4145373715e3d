"""The state objects of the ``hashmap`` keyed state backend: value, list and map state on dicts.

Each object is bound to one state's dict (key -> value; for a list state the value is a list,
for a map state a dict) and always acts on its backend's current key, which it asks the
:class:`~sparkpoint.state.hashmap.HashMapKeyedStateBackend` for on every access.
:func:`bind_state` makes the object a state descriptor asks for.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sparkpoint.errors import ConfigurationError
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
    from sparkpoint.state.hashmap import HashMapKeyedStateBackend


class _NoKey(enum.Enum):
    """Markers that survive pickling as the same objects (``object()`` would not)."""

    NO_KEY = 0
    MISSING = 1  # a missing value, for dict.get


NO_KEY = _NoKey.NO_KEY  # the backend's current key when none was set
_MISSING = _NoKey.MISSING


def bind_state(
    backend: HashMapKeyedStateBackend, descriptor: StateDescriptor, table: dict[Any, Any]
) -> ValueState | ListState | MapState:
    """The state object for ``descriptor`` on ``table``, the state's dict in ``backend``.

    Raises:
        ConfigurationError: for a descriptor of no known kind.
    """
    if isinstance(descriptor, ValueStateDescriptor):
        return _HashMapValueState(backend, descriptor, table)
    if isinstance(descriptor, ListStateDescriptor):
        return _HashMapListState(backend, descriptor.name, table)
    if isinstance(descriptor, MapStateDescriptor):
        return _HashMapMapState(backend, descriptor.name, table)
    raise ConfigurationError(f"unsupported state descriptor {type(descriptor).__name__}")


class _HashMapState:
    __slots__ = ("_backend", "_name", "_table")

    def __init__(self, backend: HashMapKeyedStateBackend, name: str, table: dict[Any, Any]):
        self._backend = backend
        self._name = name
        self._table = table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"

    def clear(self) -> None:
        self._table.pop(self._backend._key(self._name), None)


class _HashMapValueState(_HashMapState, ValueState):
    __slots__ = ("_descriptor",)

    def __init__(
        self,
        backend: HashMapKeyedStateBackend,
        descriptor: ValueStateDescriptor,
        table: dict[Any, Any],
    ) -> None:
        super().__init__(backend, descriptor.name, table)
        self._descriptor = descriptor

    def value(self) -> Any:
        value = self._table.get(self._backend._key(self._name), _MISSING)
        return self._descriptor.default_value() if value is _MISSING else value

    def update(self, value: Any) -> None:
        key = self._backend._key(self._name)
        if value is None:
            self._table.pop(key, None)
        else:
            self._table[key] = value


class _HashMapListState(_HashMapState, ListState):
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


class _HashMapMapState(_HashMapState, MapState):
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
