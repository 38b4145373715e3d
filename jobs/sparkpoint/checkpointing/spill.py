"""Where an alignment buffer goes past its limit: a file of pickled elements on local disk.

While a keyed subtask aligns barrier *n* in exactly-once mode, every element of a channel that
already delivered *n* is held back (:class:`~sparkpoint.checkpointing.barriers.BarrierHandler`).
Spark's shuffle hands a task its channels one after another, so a subtask may hold most of
what the channels before the last one sent after their barriers: with wide records and a
large epoch, more than a Python worker's memory. Past the handler's limit, the held elements
are pickled into a :class:`SpillFile` and read back, in their order, when the alignment ends
(Flink holds a blocked channel's data in its bounded network buffers and applies
backpressure instead; Spark's blocking shuffle has already delivered it).

The file is an anonymous temporary file in the task's local directory (removed by the system
when it is closed or the worker dies), truncated whenever everything spilled has been read
back, so it holds at most one alignment's spill.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import dataclass
from typing import IO, Any


@dataclass(frozen=True, slots=True)
class Spilled:
    """An element held back on disk: where its pickle is in the spill file."""

    offset: int
    length: int


class SpillFile:
    """Elements pickled one after another into a file of ``directory``, read back by the
    :class:`Spilled` handle :meth:`put` returned. The file is made at the first :meth:`put`."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._file: IO[bytes] | None = None
        self._end = 0  # where the next element goes
        self._outstanding = 0  # elements put and not taken yet
        self.bytes_written = 0  # over the file's life (pickled bytes)

    def put(self, element: Any) -> Spilled:
        """Write ``element``; the handle to read it back with."""
        data = pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL)
        if self._file is None:
            os.makedirs(self._directory, exist_ok=True)
            self._file = tempfile.TemporaryFile(dir=self._directory, prefix="alignment-")
        self._file.seek(self._end)
        self._file.write(data)
        spilled = Spilled(self._end, len(data))
        self._end += len(data)
        self._outstanding += 1
        self.bytes_written += len(data)
        return spilled

    def take(self, spilled: Spilled) -> Any:
        """Read back the element of ``spilled`` (each handle is taken once). Once every
        element put has been taken, the file is emptied for the next alignment."""
        assert self._file is not None, "nothing was spilled"
        self._file.seek(spilled.offset)
        data = self._file.read(spilled.length)
        if len(data) != spilled.length:
            raise OSError(
                f"alignment spill file: {len(data)} of {spilled.length} bytes at offset "
                f"{spilled.offset} could be read back"
            )
        self._outstanding -= 1
        if self._outstanding == 0:
            self._file.truncate(0)
            self._end = 0
        return pickle.loads(data)

    @property
    def held(self) -> int:
        """Elements put and not taken back yet."""
        return self._outstanding

    def close(self) -> None:
        """Remove the file (anything not taken is lost: the task is ending)."""
        if self._file is not None:
            self._file.close()
            self._file = None


__all__ = ["SpillFile", "Spilled"]
