"""The keyed state API that operators use: state descriptors and the state interfaces.

As in Flink (``org.apache.flink.api.common.state``), an operator declares its state with a
descriptor (a name and a kind) and asks the keyed state backend for it; the returned state
object always acts on the backend's *current key*. Every backend (``hashmap``, ``rocksdb``)
implements :class:`ValueState`, :class:`ListState` and :class:`MapState`.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from sparkpoint.errors import ConfigurationError, SparkpointError

StateKind = Literal["value", "list", "map"]

_IMMUTABLE_DEFAULTS = (type(None), bool, int, float, complex, str, bytes, tuple, frozenset)


class NoCurrentKeyError(SparkpointError):
    """Keyed state was accessed before a current key was set on the backend."""


@dataclass(frozen=True)
class StateDescriptor:
    """Names a piece of keyed state; the name is unique per operator and is kept in snapshots."""

    name: str
    kind: ClassVar[StateKind]
    # How values become bytes in snapshots: a TypeSerializer or the name of one in
    # sparkpoint.state.serializers; None is "pickle" (recorded as such).
    serializer: Any = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(
                f"a {type(self).__name__} needs a non-empty str name, got {self.name!r}"
            )


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    """A single value per key; ``default`` is what :meth:`ValueState.value` returns when unset."""

    default: Any = None
    kind: ClassVar[StateKind] = "value"

    def default_value(self) -> Any:
        """The default, copied when it is mutable so that no key changes it for another."""
        if isinstance(self.default, _IMMUTABLE_DEFAULTS):
            return self.default
        return copy.deepcopy(self.default)


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list of values per key."""

    kind: ClassVar[StateKind] = "list"


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A map (user key -> user value) per key."""

    kind: ClassVar[StateKind] = "map"


class ValueState(abc.ABC):
    """One value for the current key (Flink's ``ValueState``)."""

    @abc.abstractmethod
    def value(self) -> Any:
        """The value of the current key, or the descriptor's default when unset."""

    @abc.abstractmethod
    def update(self, value: Any) -> None:
        """Set the value of the current key; ``None`` clears it, as Flink's ``update(null)``."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove the value of the current key."""


class ListState(abc.ABC):
    """A list of values for the current key (Flink's ``ListState``)."""

    @abc.abstractmethod
    def get(self) -> list[Any]:
        """A copy of the current key's list (empty when unset)."""

    @abc.abstractmethod
    def add(self, value: Any) -> None:
        """Append ``value`` to the current key's list."""

    @abc.abstractmethod
    def add_all(self, values: Iterable[Any]) -> None:
        """Append every value to the current key's list."""

    @abc.abstractmethod
    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's list (an empty iterable clears it)."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove the current key's list."""


class MapState(abc.ABC):
    """A map for the current key (Flink's ``MapState``)."""

    @abc.abstractmethod
    def get(self, key: Any) -> Any:
        """The value under ``key`` in the current key's map, or None."""

    @abc.abstractmethod
    def put(self, key: Any, value: Any) -> None:
        """Set ``key`` to ``value`` in the current key's map."""

    @abc.abstractmethod
    def put_all(self, entries: Mapping[Any, Any]) -> None:
        """Set every entry of ``entries`` in the current key's map."""

    @abc.abstractmethod
    def contains(self, key: Any) -> bool:
        """Whether the current key's map has ``key``."""

    @abc.abstractmethod
    def remove(self, key: Any) -> None:
        """Remove ``key`` from the current key's map (nothing happens when absent)."""

    @abc.abstractmethod
    def keys(self) -> list[Any]:
        """The keys of the current key's map (a copy)."""

    @abc.abstractmethod
    def values(self) -> list[Any]:
        """The values of the current key's map (a copy)."""

    @abc.abstractmethod
    def items(self) -> list[tuple[Any, Any]]:
        """The entries of the current key's map (a copy)."""

    @abc.abstractmethod
    def is_empty(self) -> bool:
        """Whether the current key's map has no entries."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove the current key's whole map."""
