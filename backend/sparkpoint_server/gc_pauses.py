"""How long Python's cyclic garbage collector held the control plane, per generation.

A collection holds the interpreter until it ends: every thread waits, REST requests
included. When the API is slow at one moment and fast the next, these counters tell whether
collections were the reason (``GET /metrics``: ``sparkpoint_gc_*``). Measured by a
``gc.callbacks`` hook: two clock reads per collection.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

GENERATIONS = (0, 1, 2)


class PauseSource(Protocol):
    """Where ``/metrics`` reads the pauses: this process's :class:`GcPauses`, or the
    engine's through the API process (``engine_process.RemoteGcPauses``)."""

    def snapshot(self) -> list[tuple[int, int, float, float]]: ...


@dataclass
class GcPauses:
    """Collections, their summed and their longest duration (s), per generation."""

    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    longest: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _started: float = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        # A collection runs under the interpreter lock, one at a time: no other callback
        # interleaves between its start and its stop. No lock of our own: a collection can
        # start in a thread that holds it (any allocation may start one), and wait forever.
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        generation = min(int(info.get("generation", 2)), 2)
        self.collections[generation] += 1
        self.seconds[generation] += took
        self.longest[generation] = max(self.longest[generation], took)

    def snapshot(self) -> list[tuple[int, int, float, float]]:
        """(generation, collections, seconds, longest seconds) of each generation."""
        return [(g, self.collections[g], self.seconds[g], self.longest[g]) for g in GENERATIONS]


PAUSES = GcPauses()


def install() -> GcPauses:
    """Start measuring (once per process); returns the process's counters."""
    if PAUSES not in gc.callbacks:
        gc.callbacks.append(PAUSES)
    return PAUSES
