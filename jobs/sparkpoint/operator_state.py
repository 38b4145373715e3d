"""Operator state for user functions: Flink's ``CheckpointedFunction`` and its list states.

Keyed state belongs to a key; operator state belongs to one parallel instance of a function
(a subtask): a buffer a sink keeps, offsets a function tracks, a counter per subtask. A
function that implements :class:`CheckpointedFunction` gets an :class:`OperatorStateStore` in
:meth:`~CheckpointedFunction.initialize_state` and writes what it holds into its list states in
:meth:`~CheckpointedFunction.snapshot_state`. Each list state is redistributed when a job is
restored at another parallelism, as Flink does:

- ``get_list_state`` (even split): the lists of all subtasks are concatenated, in subtask
  order, and cut into as many contiguous pieces as there are subtasks now;
- ``get_union_list_state`` (union): every subtask gets the whole concatenation;
- ``get_broadcast_state`` (broadcast, :mod:`sparkpoint.broadcast_state`): a map every subtask
  holds a copy of; new subtask ``i`` gets the copy of old subtask ``i mod old parallelism``.

At the same parallelism each subtask gets back its own list.

Where Sparkpoint differs from Flink: a function object lives for one epoch (it is shipped to
the task with the epoch, as every Spark task's closure is), so ``initialize_state`` is called at
the start of every epoch (``is_restored()`` is True once there is state from before), and
``snapshot_state`` at every checkpoint barrier *and* at the end of every epoch
(``checkpoint_id`` is None then), which carries the lists to the next epoch. A function should
therefore keep its working data in fields and write them to its list states in
``snapshot_state``, as Flink's examples do. Each subtask's operator state is kept in the
checkpoint's metadata (as Flink keeps small state, below its ``state.storage.fs.memory-
threshold``), up to :data:`MAX_OPERATOR_STATE_BYTES` pickled bytes; a larger snapshot declines
its checkpoint with the reason.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sparkpoint.broadcast_state import BroadcastState
from sparkpoint.errors import ConfigurationError
from sparkpoint.state.descriptors import ListStateDescriptor, MapStateDescriptor

#: Pickled bytes of one subtask's operator state that a checkpoint keeps in its metadata.
MAX_OPERATOR_STATE_BYTES = 64 * 1024

Mode = Literal["split", "union", "broadcast"]


class OperatorListState:
    """A list of values that belongs to one subtask of a function (Flink's ``ListState``)."""

    def __init__(self, values: list[Any] | None = None) -> None:
        self._values: list[Any] = list(values or [])

    def get(self) -> list[Any]:
        """The values, in the order they were added (a copy)."""
        return list(self._values)

    def add(self, value: Any) -> None:
        self._values.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        self._values.extend(values)

    def update(self, values: Iterable[Any]) -> None:
        """Replace every value."""
        self._values = list(values)

    def clear(self) -> None:
        self._values = []


class OperatorStateStore:
    """The list states and broadcast states of one function in one subtask, by name."""

    def __init__(self, restored: dict[str, tuple[Mode, list[Any]]] | None = None) -> None:
        self._restored = restored or {}
        self._states: dict[str, tuple[Mode, OperatorListState | BroadcastState]] = {}

    def get_list_state(self, descriptor: ListStateDescriptor | str) -> OperatorListState:
        """A list state split evenly over the subtasks when the parallelism changes."""
        return self._list(descriptor, "split")

    def get_union_list_state(self, descriptor: ListStateDescriptor | str) -> OperatorListState:
        """A list state of which every subtask gets all values when the parallelism changes."""
        return self._list(descriptor, "union")

    def get_broadcast_state(self, descriptor: MapStateDescriptor | str) -> BroadcastState:
        """A map of which every subtask holds its own copy (Flink's ``getBroadcastState``);
        kept as its ``(key, value)`` entries."""
        state = self._state(descriptor, "broadcast")
        assert isinstance(state, BroadcastState)
        return state

    def _list(self, descriptor: ListStateDescriptor | str, mode: Mode) -> OperatorListState:
        state = self._state(descriptor, mode)
        assert isinstance(state, OperatorListState)
        return state

    def _state(
        self, descriptor: ListStateDescriptor | MapStateDescriptor | str, mode: Mode
    ) -> OperatorListState | BroadcastState:
        name = descriptor if isinstance(descriptor, str) else descriptor.name
        if name in self._states:
            known, existing = self._states[name]
            if known != mode:
                raise ConfigurationError(
                    f"operator state {name!r} is a {_kind(known)}, asked for as {_kind(mode)}"
                )
            return existing
        restored_mode, values = self._restored.get(name, (mode, []))
        if restored_mode != mode:
            raise ConfigurationError(
                f"operator state {name!r} was checkpointed as a {_kind(restored_mode)}, "
                f"asked for as {_kind(mode)}"
            )
        state: OperatorListState | BroadcastState
        if mode == "broadcast":
            state = BroadcastState(name, dict(values))
        else:
            state = OperatorListState(values)
        self._states[name] = (mode, state)
        return state

    def lists(self) -> dict[str, tuple[Mode, list[Any]]]:
        """Every state asked for, and every restored one not asked for again (kept); a
        broadcast state as its entries."""
        out = dict(self._restored)
        for name, (mode, state) in self._states.items():
            out[name] = (mode, state.items() if isinstance(state, BroadcastState) else state.get())
        return out


def _kind(mode: Mode) -> str:
    return "broadcast state" if mode == "broadcast" else f"{mode} list state"


@dataclass(frozen=True)
class FunctionInitializationContext:
    """What :meth:`CheckpointedFunction.initialize_state` gets."""

    operator_state_store: OperatorStateStore
    restored: bool
    subtask: int
    parallelism: int

    def is_restored(self) -> bool:
        """True when there is state from before: an earlier epoch's, or a restored one's."""
        return self.restored


@dataclass(frozen=True)
class FunctionSnapshotContext:
    """What :meth:`CheckpointedFunction.snapshot_state` gets: the checkpoint (or savepoint)
    id, or None at the end of an epoch (the lists then only carry over to the next one)."""

    checkpoint_id: int | None


class CheckpointedFunction(abc.ABC):
    """A user function with operator state (Flink's ``CheckpointedFunction``)."""

    @abc.abstractmethod
    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        """Ask for list states (``ctx.operator_state_store``) and read what they hold."""

    @abc.abstractmethod
    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        """Write what the function holds into its list states."""


def redistribute(
    pieces: list[tuple[int, Mode, list[Any]]], subtask: int, parallelism: int, old: int
) -> tuple[Mode, list[Any]]:
    """One list state of subtask ``subtask`` of ``parallelism`` from the checkpointed
    ``(old subtask, mode, values)`` of ``old`` subtasks (see the module docstring)."""
    pieces = sorted(pieces, key=lambda piece: piece[0])
    modes = {mode for _, mode, _ in pieces}
    if len(modes) > 1:
        raise ConfigurationError(f"one operator state checkpointed in modes {sorted(modes)}")
    mode: Mode = pieces[0][1] if pieces else "split"
    if mode == "broadcast":  # every copy is whole: the one of subtask ``i mod old``
        return mode, [v for sub, _, values in pieces if sub == subtask % old for v in values]
    if parallelism == old:
        return mode, [v for sub, _, values in pieces if sub == subtask for v in values]
    everything = [v for _, _, values in pieces for v in values]
    if mode == "union":
        return mode, everything
    start = len(everything) * subtask // parallelism
    end = len(everything) * (subtask + 1) // parallelism
    return mode, everything[start:end]
