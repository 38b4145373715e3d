"""Broadcast state: a map that every subtask of a keyed broadcast function holds a copy of
(Flink's ``BroadcastState`` and ``ReadOnlyBroadcastState``).

A :class:`~sparkpoint.broadcast.KeyedBroadcastProcessFunction` changes it only in
``process_broadcast_element``, where every subtask sees the same broadcast elements in the same
order, so every copy stays the same; ``process_element`` sees it read-only (a write there would
make the copies differ, and a restore at another parallelism keeps only some of them). It is
operator state of redistribution mode ``"broadcast"`` (:mod:`sparkpoint.operator_state`): each
subtask snapshots its own copy, and on a restore at another parallelism new subtask ``i`` gets
the copy of old subtask ``i mod old parallelism``, as Flink does. Entries are pickled, as all
operator state is: a descriptor's ``serializer`` is not used here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.state.descriptors import MapStateDescriptor


class ReadOnlyBroadcastStateError(SparkpointError):
    """A function wrote to broadcast state where it is read-only (in ``process_element``)."""


def broadcast_descriptors(
    descriptors: tuple[Any, ...], where: str
) -> tuple[MapStateDescriptor, ...]:
    """``descriptors`` checked: at least one, each a :class:`MapStateDescriptor`, names unique.

    Raises:
        ConfigurationError: naming ``where`` (the stream or operator) and what is wrong.
    """
    if not descriptors:
        raise ConfigurationError(
            f"{where}: broadcast() needs at least one MapStateDescriptor, the broadcast state "
            "its elements fill"
        )
    names: set[str] = set()
    for d in descriptors:
        if not isinstance(d, MapStateDescriptor):
            raise ConfigurationError(
                f"{where}: broadcast state is described by a MapStateDescriptor, got "
                f"{type(d).__name__} {d!r}"
            )
        if d.name in names:
            raise ConfigurationError(
                f"{where}: broadcast state {d.name!r} is described twice; names must be unique"
            )
        names.add(d.name)
    return descriptors


class ReadOnlyBroadcastState:
    """A view of one broadcast state that reads only (Flink's ``ReadOnlyBroadcastState``)."""

    def __init__(self, name: str, entries: dict[Any, Any]) -> None:
        self.name = name
        self._entries = entries

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self._entries)} entries)"

    def get(self, key: Any) -> Any:
        """The value under ``key``, or None."""
        return self._entries.get(key)

    def contains(self, key: Any) -> bool:
        return key in self._entries

    def keys(self) -> list[Any]:
        """The keys, in the order they were first put (a copy)."""
        return list(self._entries)

    def values(self) -> list[Any]:
        return list(self._entries.values())

    def items(self) -> list[tuple[Any, Any]]:
        """The entries, in the order their keys were first put (a copy)."""
        return list(self._entries.items())

    def is_empty(self) -> bool:
        return not self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._entries))

    def _refuse(self, what: str) -> None:
        raise ReadOnlyBroadcastStateError(
            f"broadcast state {self.name!r} is read-only in process_element: {what} it in "
            "process_broadcast_element, where every subtask sees the same elements (a write "
            "per key would make the subtasks' copies differ)"
        )

    def put(self, key: Any, value: Any) -> None:
        self._refuse("put into")

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        self._refuse("put into")

    def remove(self, key: Any) -> None:
        self._refuse("remove from")

    def clear(self) -> None:
        self._refuse("clear")


class BroadcastState(ReadOnlyBroadcastState):
    """One broadcast state, writable (Flink's ``BroadcastState``)."""

    def put(self, key: Any, value: Any) -> None:
        self._entries[key] = value

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        self._entries.update(entries)

    def remove(self, key: Any) -> None:
        """Remove ``key`` (nothing happens when absent)."""
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def read_only(self) -> ReadOnlyBroadcastState:
        """A read-only view of the same entries."""
        return ReadOnlyBroadcastState(self.name, self._entries)
