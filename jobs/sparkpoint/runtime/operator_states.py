"""The operator state of one subtask's checkpointed functions, from epoch to epoch and into
checkpoints (``sparkpoint.operator_state`` explains the user's side).

At the start of an epoch a subtask opens its functions' list states from the checkpoint it is
restored from (redistributed to its parallelism) or else from the previous epoch's working
state, and calls each function's ``initialize_state``; on a barrier it calls ``snapshot_state``
and puts the pickled lists into its acknowledgement; at the end of the epoch it does the same
into the working state the next epoch opens.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterable
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.job_graph import Vertex, checkpointed_functions
from sparkpoint.operator_state import (
    MAX_OPERATOR_STATE_BYTES,
    CheckpointedFunction,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    Mode,
    OperatorStateStore,
    redistribute,
)

#: One subtask's lists: function uid -> state name -> (mode, values).
Lists = dict[str, dict[str, tuple[Mode, list[Any]]]]


class OperatorStateTooLargeError(Exception):
    """A snapshot of a subtask's operator state is over :data:`MAX_OPERATOR_STATE_BYTES`."""


def from_checkpoint(
    models: Iterable[p.OperatorStateModel], subtask: int, parallelism: int
) -> Lists:
    """Subtask ``subtask``'s lists from every subtask's entries of a checkpoint."""
    pieces: dict[tuple[str, str], list[tuple[int, Mode, list[Any]]]] = {}
    old: dict[tuple[str, str], int] = {}
    for m in models:
        values = pickle.loads(base64.b64decode(m.data))
        pieces.setdefault((m.function, m.name), []).append((m.subtask, m.mode, values))
        old[(m.function, m.name)] = m.parallelism
    lists: Lists = {}
    for (function, name), parts in pieces.items():
        lists.setdefault(function, {})[name] = redistribute(
            parts, subtask, parallelism, old[(function, name)]
        )
    return lists


class SubtaskOperatorState:
    """The checkpointed functions of one subtask and their stores, for one epoch."""

    def __init__(
        self,
        functions: dict[str, CheckpointedFunction],
        lists: Lists,
        restored: bool,
        subtask: int,
        parallelism: int,
    ) -> None:
        self.functions = functions
        self.subtask = subtask
        self.parallelism = parallelism
        self.stores = {uid: OperatorStateStore(lists.get(uid)) for uid in functions}
        for uid, fn in functions.items():
            fn.initialize_state(
                FunctionInitializationContext(self.stores[uid], restored, subtask, parallelism)
            )

    @classmethod
    def open(
        cls,
        vertex: Vertex,
        subtask: int,
        carried: Lists | None,
        restored: tuple[p.OperatorStateModel, ...],
        restoring: bool,
    ) -> SubtaskOperatorState | None:
        """None when the vertex has no checkpointed function. ``restoring``: this epoch
        starts from a checkpoint (``restored`` are its entries of the vertex, maybe none);
        else ``carried`` is what the previous epoch left (None: the job's first epoch)."""
        functions = checkpointed_functions(vertex)
        if not functions:
            return None
        if restoring:
            lists = from_checkpoint(restored, subtask, vertex.parallelism)
            return cls(functions, lists, True, subtask, vertex.parallelism)
        return cls(functions, carried or {}, carried is not None, subtask, vertex.parallelism)

    def _lists(self, checkpoint_id: int | None) -> Lists:
        for fn in self.functions.values():
            fn.snapshot_state(FunctionSnapshotContext(checkpoint_id))
        return {uid: store.lists() for uid, store in self.stores.items()}

    def snapshot(self, checkpoint_id: int) -> list[p.OperatorStateModel]:
        """The synchronous part of a checkpoint: every list, pickled.

        Raises:
            OperatorStateTooLargeError: more than :data:`MAX_OPERATOR_STATE_BYTES` in all.
        """
        models = []
        total = 0
        for uid, states in self._lists(checkpoint_id).items():
            for name, (mode, values) in sorted(states.items()):
                data = pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
                total += len(data)
                models.append(
                    p.OperatorStateModel(
                        function=uid,
                        name=name,
                        mode=mode,
                        subtask=self.subtask,
                        parallelism=self.parallelism,
                        values=len(values),
                        data=base64.b64encode(data).decode("ascii"),
                    )
                )
        if total > MAX_OPERATOR_STATE_BYTES:
            raise OperatorStateTooLargeError(
                f"operator state of {sorted(self.functions)} in subtask {self.subtask} is "
                f"{total} bytes pickled, more than the {MAX_OPERATOR_STATE_BYTES} a checkpoint "
                "keeps in its metadata; keep large state in keyed state"
            )
        return models

    def carry(self) -> Lists:
        """At the end of the epoch: the lists the next epoch opens."""
        return self._lists(None)
