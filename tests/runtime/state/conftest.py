"""What the keyed state tests share: the states they use, keys to fill them with, and how to
fill and read a backend of either kind."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.state import backends as backend_registry
from sparkpoint.state.backend import KeyedStateBackend
from sparkpoint.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import KeyGroupRange, key_group_for

FULL = KeyGroupRange(0, 127)
COUNT = ValueStateDescriptor("count", default=0)
EVENTS = ListStateDescriptor("events")
LAST_SEEN = MapStateDescriptor("last-seen")
PAYLOAD = ValueStateDescriptor("payload", serializer="bytes")

#: Keys of every kind a key may be (str, negative and positive int, None, a tuple).
KEYS: list[Any] = [f"user-{i}" for i in range(500)] + list(range(-50, 250)) + [None, (1, "x")]


def fill(backend: KeyedStateBackend, keys: list[Any]) -> None:
    """For the i-th key: ``count`` i + 1; ``events`` [i, str(i)] when i is even;
    ``last-seen`` {("page", i): float(i)} when i is a multiple of 3."""
    count = backend.get_state(COUNT)
    events = backend.get_state(EVENTS)
    last = backend.get_state(LAST_SEEN)
    for i, key in enumerate(keys):
        backend.set_current_key(key)
        count.update(i + 1)
        if i % 2 == 0:
            events.add_all([i, str(i)])
        if i % 3 == 0:
            last.put(("page", i), float(i))


def contents(backend: KeyedStateBackend) -> dict[str, dict[Any, Any]]:
    """Every registered state's entries, key -> a deep copy of the value (from
    :meth:`~KeyedStateBackend.entries`, which touches no key); a key listed twice fails."""
    out: dict[str, dict[Any, Any]] = {name: {} for name in backend.states}
    for _, name, key, value in backend.entries():
        assert key not in out[name], f"key {key!r} of state {name!r} is listed twice"
        out[name][key] = copy.deepcopy(value)
    return out


def contents_of_subtasks(subtasks: Sequence[KeyedStateBackend]) -> dict[str, dict[Any, Any]]:
    """The entries of an operator's subtasks together, as :func:`contents`; fails unless every
    key is held once, by the subtask whose key group range holds its key group."""
    union: dict[str, dict[Any, Any]] = {}
    for subtask in subtasks:
        for name, table in contents(subtask).items():
            seen = union.setdefault(name, {})
            assert not seen.keys() & table.keys(), f"state {name!r}: a key in two subtasks"
            assert all(key_group_for(k) in subtask.key_group_range for k in table)
            seen.update(table)
    return union


def filled_hashmap(n: int) -> HashMapKeyedStateBackend:
    """Keys ``k0`` to ``k{n-1}`` in a value, a list and a map state."""
    backend = HashMapKeyedStateBackend(128, FULL)
    count = backend.get_state(COUNT)
    events = backend.get_state(EVENTS)
    last = backend.get_state(LAST_SEEN)
    for i in range(n):
        backend.set_current_key(f"k{i}")
        count.update(i)
        if i % 2 == 0:
            events.add_all([i, f"e{i}"])
        if i % 3 == 0:
            last.put("first", i)
    backend.channel_watermarks = {0: 100, 1: 150}
    backend.take_changes()  # as after a restore: the filling is not an epoch's change
    return backend


def copy_of_tables(backend: HashMapKeyedStateBackend) -> dict[str, dict[Any, Any]]:
    """A deep copy of every table (reading them this way touches no key)."""
    return {name: copy.deepcopy(dict(backend.table(name).items())) for name in backend.states}


@pytest.fixture(params=backend_registry.BACKEND_NAMES)
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Backends of each kind (``contract.Backends``), closed after the test."""
    from .contract import Backends  # it imports this module's constants

    made = Backends(request.param, tmp_path)
    yield made
    made.close()


@pytest.fixture
def backend(backends: Any) -> KeyedStateBackend:
    """An empty backend of each kind for key groups 0 to 127 of 128."""
    return backends.create()
