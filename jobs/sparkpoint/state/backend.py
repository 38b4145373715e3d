"""The keyed state backend interface (Flink's ``KeyedStateBackend`` and ``SnapshotStrategy``).

Every keyed operator, the timers, the windows and ``KeyedProcessFunction`` see keyed state only
through :class:`KeyedStateBackend`; the runtime creates and restores backends through
:mod:`sparkpoint.state.backends` by name (``hashmap`` or ``rocksdb``, Flink's
``state.backend.type``). No module outside ``sparkpoint.state`` names a concrete backend.

A backend holds the state of one keyed subtask: for each registered state (a name, a kind and
a value serializer, from its descriptor) a :class:`StateTable` of key -> value, where the value
of a list state is a list and of a map state a dict. The state objects that
:meth:`KeyedStateBackend.get_state` returns (:mod:`sparkpoint.state.table_states`) act on the
table through the backend's current key. Vectorized built-in operators use the table itself.

**Tables and mutation.** A value read from a table may be mutated in place (a list appended to,
a dict updated): the backend treats every key read or written since the last
:meth:`KeyedStateBackend.take_changes` as changed (a table of numbers, which cannot change in
place, counts only the keys written). That is what makes the epoch-to-epoch changelog and
RocksDB's write-back cache correct without asking operators to write back.

**Snapshots** have two phases, as in Flink: :meth:`KeyedStateBackend.snapshot` is the
synchronous part, run on the task thread while processing waits; it only captures (a
copy-on-write view, a RocksDB native checkpoint of hard-linked files) and returns a
:class:`SnapshotCapture`. :meth:`SnapshotCapture.materialize`, the asynchronous part, runs on
an upload thread while processing goes on: it serializes and writes through a
:class:`SnapshotTarget` and returns the state handles.

**Working state between epochs** (execution contract 4): an epoch opens version *v* of a
subtask's state and writes *v+1*; a failed epoch's writes must never be seen by the retry.
:meth:`KeyedStateBackend.save_version` writes the version at a cost proportional to what the
epoch changed and :meth:`KeyedStateBackend.open_version` opens one, both through a
:class:`VersionStore` (the executor's local directory and, on clusters, a durable copy).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, overload

from sparkpoint.errors import ConfigurationError
from sparkpoint.state.descriptors import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    NoCurrentKeyError,
    StateDescriptor,
    StateKind,
    ValueState,
    ValueStateDescriptor,
)
from sparkpoint.state.key_groups import (
    KeyGroupOutOfRangeError,
    KeyGroupRange,
    check_max_parallelism,
    key_groups_of,
    stable_hash,
)
from sparkpoint.state.serializers import serializer_of
from sparkpoint.state.snapshot_contracts import (
    SavedVersion,
    SnapshotCapture,
    VersionStore,
)
from sparkpoint.watermarks import MIN_WATERMARK

if TYPE_CHECKING:
    from sparkpoint.records import Column


def key_outside_range(
    key: Any,
    key_group: int,
    key_group_range: KeyGroupRange,
    max_parallelism: int,
    state: str | None = None,
) -> KeyGroupOutOfRangeError:
    """The error for ``key``, of ``key_group``, given to a backend of ``key_group_range``: as
    its current key, or (``state``) written straight to that state's table."""
    given = (
        f"key {key!r} is in key group {key_group}"
        if state is None
        else f"keyed state {state!r} was given key {key!r} of key group {key_group}"
    )
    return KeyGroupOutOfRangeError(
        f"{given}, outside the key group range {key_group_range} of this state backend "
        f"(max_parallelism {max_parallelism})"
    )


class _NoKey:
    """The current key before any was set (pickles to the same object)."""

    def __reduce__(self) -> str:
        return "NO_KEY"

    def __repr__(self) -> str:
        return "NO_KEY"


NO_KEY: Any = _NoKey()


class StateTable(Protocol):
    """The entries of one state: key -> value (a list for list state, a dict for map state).

    Every key read or written counts as changed until the next
    :meth:`KeyedStateBackend.take_changes`, so values may be mutated in place.
    """

    def get(self, key: Any, default: Any = None) -> Any: ...
    def __getitem__(self, key: Any) -> Any: ...
    def __setitem__(self, key: Any, value: Any) -> None: ...
    def __delitem__(self, key: Any) -> None: ...
    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...
    def pop(self, key: Any, default: Any = None) -> Any: ...
    def items(self) -> Iterable[tuple[Any, Any]]: ...

    def get_many(self, keys: list[Any], default: Any) -> list[Any]:
        """The value of every key of ``keys`` (``default`` where absent), in order."""
        ...

    def put_many(self, keys: list[Any], values: list[Any]) -> None:
        """Set ``keys[i]`` to ``values[i]`` for every i."""
        ...


@dataclass(frozen=True)
class StateInfo:
    """What a snapshot records of a registered state: its name, kind and value serializer."""

    name: str
    kind: StateKind
    serializer: str  # a name from sparkpoint.state.serializers, e.g. "pickle"


@dataclass
class ChangeSet:
    """The entries changed since the last :meth:`KeyedStateBackend.take_changes`: per state,
    key -> value, where a value of :data:`DELETED` is a removed entry."""

    states: dict[str, StateInfo] = field(default_factory=dict)
    changes: dict[str, Mapping[Any, Any]] = field(default_factory=dict)
    watermarks: dict[int, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(c) for c in self.changes.values())


class _Deleted:
    def __reduce__(self) -> str:
        return "DELETED"

    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()


class KeyedStateBackend(abc.ABC):
    """Keyed state of one subtask, for the key groups in ``key_group_range``.

    Args:
        max_parallelism: the operator's max parallelism (number of key groups).
        key_group_range: the key groups this subtask owns.

    Raises:
        ConfigurationError: when the range does not fit in ``[0, max_parallelism)``.
    """

    name: ClassVar[str]

    def __init__(self, max_parallelism: int, key_group_range: KeyGroupRange) -> None:
        self._max_parallelism = check_max_parallelism(max_parallelism)
        if not isinstance(key_group_range, KeyGroupRange):
            raise ConfigurationError(
                f"key_group_range must be a KeyGroupRange, got {type(key_group_range).__name__}"
            )
        if key_group_range.end >= self._max_parallelism:
            raise ConfigurationError(
                f"key group range {key_group_range} does not fit in max_parallelism "
                f"{self._max_parallelism} (key groups 0 to {self._max_parallelism - 1})"
            )
        self._key_group_range = key_group_range
        self._infos: dict[str, StateInfo] = {}
        self._current_key: Any = NO_KEY
        self._current_key_group = -1
        # Operator state of event time: the latest watermark of every input channel (in
        # snapshots and working state) and the subtask's watermark, their minimum.
        self.channel_watermarks: dict[int, int] = {}
        self.current_watermark = MIN_WATERMARK

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_parallelism={self._max_parallelism}, "
            f"key_group_range={self._key_group_range}, states={sorted(self._infos)})"
        )

    @property
    def max_parallelism(self) -> int:
        return self._max_parallelism

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self._key_group_range

    @property
    def states(self) -> dict[str, StateKind]:
        """The registered (or restored) states: name -> kind."""
        return {name: info.kind for name, info in self._infos.items()}

    @property
    def state_infos(self) -> dict[str, StateInfo]:
        """The registered (or restored) states with their serializers."""
        return dict(self._infos)

    # ------------------------------------------------------------------------- current key

    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Make ``key`` the key that every state object of this backend acts on.

        Args:
            key: the key (a type :func:`~sparkpoint.state.key_groups.stable_hash` accepts).
            key_group: the key's key group when the caller has already computed it (the
                runtime has, to route the record here); computed from ``key`` otherwise.

        Raises:
            KeyGroupOutOfRangeError: when the key's key group is not in this backend's range.
        """
        if key_group is None:
            key_group = stable_hash(key) % self._max_parallelism
        if not self._key_group_range.start <= key_group <= self._key_group_range.end:
            raise key_outside_range(key, key_group, self._key_group_range, self._max_parallelism)
        self._current_key = key
        self._current_key_group = key_group

    def each_key(self, keys: Column) -> Iterator[Any]:
        """Make each key of a batch the current key in turn (yielding it), as
        :meth:`set_current_key` of every key in order would: the key groups of the whole batch
        are computed at once (:func:`~sparkpoint.state.key_groups.key_groups_of`, numpy), not
        hashed record by record. A key outside this backend's range raises when its turn
        comes; keys that cannot be hashed as an array are set one by one."""
        listed = keys.tolist()
        try:
            groups = key_groups_of(keys, self._max_parallelism).tolist()
        except TypeError:  # a key stable_hash refuses: set_current_key names it in order
            for key in listed:
                self.set_current_key(key)
                yield key
            return
        start, end = self._key_group_range.start, self._key_group_range.end
        for key, key_group in zip(listed, groups, strict=True):
            if not start <= key_group <= end:
                raise key_outside_range(
                    key, key_group, self._key_group_range, self._max_parallelism
                )
            self._current_key = key
            self._current_key_group = key_group
            yield key

    def clear_current_key(self) -> None:
        """No current key: keyed state accessed now raises :class:`NoCurrentKeyError` (a
        broadcast element is processed for no key)."""
        self._current_key = NO_KEY
        self._current_key_group = -1

    @property
    def current_key(self) -> Any:
        """The current key; raises :class:`NoCurrentKeyError` when none was set."""
        if self._current_key is NO_KEY:
            raise NoCurrentKeyError("no current key: call set_current_key(key) first")
        return self._current_key

    @property
    def current_key_group(self) -> int:
        """The key group of the current key."""
        if self._current_key is NO_KEY:
            raise NoCurrentKeyError("no current key: call set_current_key(key) first")
        return self._current_key_group

    def _key(self, name: str) -> Any:
        key = self._current_key
        if key is NO_KEY:
            raise NoCurrentKeyError(
                f"keyed state {name!r} was accessed with no current key: keyed state is only "
                "available in a keyed operator, after set_current_key(key)"
            )
        return key

    # ------------------------------------------------------------------------- states

    @overload
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...

    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...

    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...

    def get_state(self, descriptor: StateDescriptor) -> ValueState | ListState | MapState:
        """The state ``descriptor`` names, bound to this backend's current key.

        Registers the state on first use; a restored state of the same name and kind gets
        its restored contents.

        Raises:
            ConfigurationError: when a state of that name exists with another kind or
                serializer.
        """
        from sparkpoint.state.table_states import bind_state

        info = StateInfo(descriptor.name, descriptor.kind, serializer_of(descriptor).name)
        table = self.register(info)
        return bind_state(self, descriptor, table)

    def table(self, name: str) -> StateTable:
        """The table (key -> value) of state ``name``, for vectorized operators.

        Writers must only add keys of this backend's key group range.

        Raises:
            ConfigurationError: when no state of that name was registered or restored.
        """
        if name not in self._infos:
            known = ", ".join(sorted(self._infos)) or "none"
            raise ConfigurationError(
                f"no keyed state named {name!r} (registered: {known}); "
                "call get_state(descriptor) first"
            )
        return self._table(name)

    def register(self, info: StateInfo) -> StateTable:
        """Register state ``info`` (or find it registered or restored); its table.

        Raises:
            ConfigurationError: the name is registered with another kind or serializer.
        """
        existing = self._infos.get(info.name)
        if existing is None:
            self._infos[info.name] = info
            self._create_table(info)
        elif existing.kind != info.kind:
            raise ConfigurationError(
                f"keyed state {info.name!r} is a {existing.kind} state; it cannot be used as a "
                f"{info.kind} state"
            )
        elif existing.serializer != info.serializer:
            raise ConfigurationError(
                f"keyed state {info.name!r} was written with serializer "
                f"{existing.serializer!r}; its descriptor now declares {info.serializer!r}"
            )
        return self._table(info.name)

    @abc.abstractmethod
    def _create_table(self, info: StateInfo) -> None:
        """Create the (empty) table of a newly registered state."""

    @abc.abstractmethod
    def _table(self, name: str) -> StateTable:
        """The table of a registered state."""

    # ------------------------------------------------------------------------- sizes

    @abc.abstractmethod
    def num_keys(self) -> int:
        """How many distinct keys have some state."""

    @abc.abstractmethod
    def state_size(self) -> int:
        """Approximate size of the state in bytes (cheap: reported at every checkpoint)."""

    # ------------------------------------------------------------------------- export

    @abc.abstractmethod
    def entries(self) -> Iterable[tuple[int, str, Any, Any]]:
        """Every entry as ``(key group, state name, key, value)``, in no promised order (the
        canonical encoder groups them by key group itself; an ``EntryColumns`` it encodes a
        column at a time)."""

    def load(self, entries: Iterable[tuple[int, str, Any, Any]]) -> None:
        """Add restored entries (their states registered before); a value of
        :data:`DELETED` removes the key; keys outside this backend's range are skipped."""
        start, end = self._key_group_range.start, self._key_group_range.end
        tables: dict[str, StateTable] = {}
        for key_group, name, key, value in entries:
            if not start <= key_group <= end:
                continue
            table = tables.get(name)
            if table is None:
                table = tables[name] = self._table(name)
            if value is DELETED:
                table.pop(key, None)
            else:
                table[key] = value

    def load_columns(self, name: str, keys: list[Any], values: list[Any]) -> None:
        """Like :meth:`load`, for keys of state ``name`` (registered before) that are all in
        this backend's key-group range, and their values (``DELETED`` removes the key)."""
        table = self._table(name)
        for key, value in zip(keys, values, strict=True):
            if value is DELETED:
                table.pop(key, None)
            else:
                table[key] = value

    # ------------------------------------------------------------------------- changes

    @abc.abstractmethod
    def take_changes(self) -> ChangeSet:
        """The entries read or written since the last call (then forgotten)."""

    # ------------------------------------------------------------------------- snapshots

    @abc.abstractmethod
    def snapshot(self, checkpoint_id: int, *, native: bool) -> SnapshotCapture:
        """The synchronous part of a snapshot for checkpoint ``checkpoint_id``.

        ``native`` False asks for the canonical format (:mod:`sparkpoint.state.canonical`),
        which every backend restores: savepoints and full checkpoints. True lets the backend
        write its own format (RocksDB: its files, incremental when the target says so).
        """

    # ------------------------------------------------------------------------- versions

    @abc.abstractmethod
    def save_version(self, store: VersionStore, tag: str, previous: str | None) -> SavedVersion:
        """Write working-state version ``tag`` (the one after ``previous``, None: the first
        since a restore). Its cost follows what the epoch changed, not the state's size."""

    @classmethod
    @abc.abstractmethod
    def open_version(
        cls, store: VersionStore, tag: str, max_parallelism: int, key_group_range: KeyGroupRange
    ) -> KeyedStateBackend | None:
        """Open version ``tag`` from this executor's disk or the durable copy; None when
        neither has it."""

    @abc.abstractmethod
    def prune_versions(self, store: VersionStore, keep: set[str]) -> None:
        """Delete local versions other than ``keep``."""

    def close(self) -> None:  # noqa: B027 - a backend without resources
        """Release what the backend holds (files, native handles)."""
