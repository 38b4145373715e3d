"""Checkpoint barriers and the per-subtask handler that aligns them across input channels.

A keyed subtask reads N input channels (one per upstream subtask) through Spark's shuffle. Each
channel delivers data elements and :class:`CheckpointBarrier` records in order; channels
interleave arbitrarily. :class:`BarrierHandler` turns that stream into :class:`Release` (process
this element now), :class:`Aligned` (snapshot now) and :class:`Aborted` (this checkpoint cannot
complete here) items, as Flink's ``CheckpointBarrierHandler`` family does:

- ``EXACTLY_ONCE`` mirrors Flink's aligned checkpoints (``CheckpointBarrierAligner``): a channel
  that delivered barrier *n* is blocked and its later elements are buffered until barrier *n*
  has come from every channel; then the subtask snapshots and the buffer is drained first.
- ``AT_LEAST_ONCE`` mirrors Flink's ``CheckpointBarrierTracker``: nothing is held back, and the
  snapshot is taken when the last channel's barrier arrives, so records read after an early
  channel's barrier are already in the snapshot's state and are processed again after a restore.

Pure logic: no threads; time comes from an injected :class:`~sparkpoint.clock.Clock`, and the
only I/O is the spill file it is given (see :mod:`~sparkpoint.checkpointing.spill`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.checkpointing.spill import Spilled, SpillFile
from sparkpoint.clock import Clock
from sparkpoint.errors import CheckpointError, ConfigurationError
from sparkpoint.protocol import CheckpointingMode, CheckpointKind


@dataclass(frozen=True, slots=True)
class CheckpointBarrier:
    """Flink's ``CheckpointBarrier``: the record that splits a channel at checkpoint *n*.

    It travels through Spark's shuffle behind the records that precede it, so it pickles as a
    bare tuple of its fields (under 100 bytes, mostly the class reference).
    """

    checkpoint_id: int
    timestamp: int  # wall-clock ms at which the checkpoint was triggered
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    is_final: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.kind, CheckpointKind):  # a plain string, e.g. from unpickling
            object.__setattr__(self, "kind", CheckpointKind(self.kind))

    def __reduce__(self) -> tuple[type[CheckpointBarrier], tuple[Any, ...]]:
        if self.kind is CheckpointKind.CHECKPOINT and not self.is_final:
            return (CheckpointBarrier, (self.checkpoint_id, self.timestamp))
        return (
            CheckpointBarrier,
            (self.checkpoint_id, self.timestamp, self.kind.value, self.is_final),
        )


@dataclass
class AlignmentStats:
    """What one alignment cost (Flink's alignment duration and ``checkpointStartDelay`` inputs).

    Times are the handler's monotonic clock when it read the first and the last barrier;
    ``duration_ms`` is their difference. Because Spark's shuffle is blocking, this measures input
    skew and read order, not network backpressure. ``buffered_*`` count the data elements held
    back while aligning (always 0 in at-least-once mode).
    """

    checkpoint_id: int
    first_barrier_ms: float
    last_barrier_ms: float
    duration_ms: float
    buffered_bytes: int
    buffered_records: int
    barrier_wall_ms: dict[int, int]  # channel -> wall ms when its barrier was read
    spilled_bytes: int = 0  # of buffered_bytes, what went to local disk past the limit


@dataclass(frozen=True, slots=True)
class Release:
    """A data element the subtask processes now."""

    channel: int
    element: object


@dataclass(frozen=True, slots=True)
class Aligned:
    """Barrier *n* has come from every channel: snapshot now, before any later item."""

    barrier: CheckpointBarrier
    stats: AlignmentStats


@dataclass(frozen=True, slots=True)
class Aborted:
    """Checkpoint *n* can no longer align on this subtask (Flink: declined, subsumed)."""

    checkpoint_id: int
    reason: str


HandlerOutput = Release | Aligned | Aborted


def default_size_of(element: object) -> int:
    """A cheap size estimate: ``element.nbytes`` (numpy, pyarrow), ``len`` of bytes and str.

    Anything else counts as 0 bytes: pass a ``size_of`` that knows the runtime's batch type.
    """
    nbytes = getattr(element, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(element, (bytes, bytearray)):
        return len(element)
    if isinstance(element, str):
        return len(element.encode("utf-8", "surrogatepass"))
    return 0


@dataclass
class _Alignment:
    """One checkpoint whose barriers are being collected."""

    barrier: CheckpointBarrier
    first_ms: float
    last_ms: float
    wall_ms: dict[int, int] = field(default_factory=dict)  # channels seen, in order
    buffered_bytes: int = 0
    buffered_records: int = 0
    spilled_bytes: int = 0

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    def stats(self) -> AlignmentStats:
        return AlignmentStats(
            checkpoint_id=self.checkpoint_id,
            first_barrier_ms=self.first_ms,
            last_barrier_ms=self.last_ms,
            duration_ms=self.last_ms - self.first_ms,
            buffered_bytes=self.buffered_bytes,
            buffered_records=self.buffered_records,
            barrier_wall_ms=dict(self.wall_ms),
            spilled_bytes=self.spilled_bytes,
        )


class BarrierHandler:
    """Flink's ``CheckpointBarrierHandler`` for one subtask with ``num_channels`` inputs.

    Feed every element in the order the subtask reads it; act on the returned items in order.

    Rules shared by both modes (Flink's ``currentCheckpointId`` / ``latestPendingCheckpointID``):

    - A barrier whose id is at most the highest id this handler has started (and is not being
      aligned now) is stale: it is dropped and counted in :attr:`ignored_barriers`. The same
      holds for a second barrier *n* from a channel that already delivered *n*.
    - Barrier *m* on a channel that has not delivered barrier *n* < *m* of an alignment in
      progress means that channel will never deliver *n* (channels are FIFO): checkpoint *n* is
      aborted (Flink's "barrier n+1 before n", ``CHECKPOINT_DECLINED_SUBSUMED``).

    Exactly-once: only one alignment at a time. A channel that delivered barrier *n* is blocked:
    its later elements (data and barriers) are buffered in arrival order. When barrier *n* has
    come from all channels the handler emits :class:`Aligned`, unblocks all channels and replays
    the buffer through itself before anything read later, so a buffered barrier *n+1* starts the
    next alignment then (its time is read then, as Flink reads a blocked channel only once it
    is unblocked). On an abort the buffer is released the same way, after the new barrier has
    started its own alignment (Flink's ``releaseBlocksAndResetBarriers`` then
    ``beginNewAlignment``).

    At-least-once: data is always released at once and several checkpoints may be tracked at
    the same time; :class:`Aligned` comes with the last channel's barrier *n*.

    ``buffer_limit``: the bytes of held elements kept in memory; past it, each further one is
    written to ``spill`` (a :class:`~sparkpoint.checkpointing.spill.SpillFile`) and read back
    when its turn comes, in the same order. None: no limit.
    """

    def __init__(
        self,
        num_channels: int,
        mode: CheckpointingMode,
        clock: Clock,
        *,
        size_of: Callable[[object], int] = default_size_of,
        count_of: Callable[[Any], int] = len,
        buffer_limit: int | None = None,
        spill: SpillFile | None = None,
    ) -> None:
        if num_channels < 1:
            raise ConfigurationError(f"a barrier handler needs >= 1 channel, got {num_channels}")
        self._num_channels = num_channels
        self._mode = mode
        self._clock = clock
        self._size_of = size_of
        self._count_of = count_of
        self._alignments: list[_Alignment] = []  # ascending ids; at most one in exactly-once
        self._latest_started = 0  # highest checkpoint id ever started here
        self._blocked: set[int] = set()
        self._buffer: deque[tuple[int, object]] = deque()
        self._buffered_records = 0
        self._ignored = 0
        self._buffer_limit = buffer_limit if spill is not None else None
        self._spill = spill
        self._in_memory = 0  # bytes of the buffer's elements held in memory

    @property
    def pending_checkpoint_id(self) -> int | None:
        """The checkpoint being aligned (the lowest one, in at-least-once mode), or None."""
        return self._alignments[0].checkpoint_id if self._alignments else None

    @property
    def blocked_channels(self) -> frozenset[int]:
        return frozenset(self._blocked)

    @property
    def buffered_records(self) -> int:
        """Records held back right now (exactly-once mode only)."""
        return self._buffered_records

    @property
    def ignored_barriers(self) -> int:
        """Stale or duplicate barriers dropped so far."""
        return self._ignored

    def process(self, channel: int, element: object) -> list[HandlerOutput]:
        """Take the next element read from ``channel``; return what to do now, in order."""
        if not 0 <= channel < self._num_channels:
            raise ValueError(f"channel {channel} out of range 0..{self._num_channels - 1}")
        out: list[HandlerOutput] = []
        work: deque[tuple[int, object]] = deque([(channel, element)])
        while work:
            ch, item = work.popleft()
            if isinstance(item, Spilled):
                assert self._spill is not None
                item = self._spill.take(item)
            if ch in self._blocked:
                self._hold(ch, item)
            elif isinstance(item, CheckpointBarrier):
                self._on_barrier(ch, item, out, work)
            else:
                out.append(Release(ch, item))
        return out

    def end_of_input(self) -> None:
        """All channels are exhausted; an alignment still open here is a planning bug.

        Raises:
            CheckpointError: naming the checkpoint and the channels whose barrier never came.
        """
        if not self._alignments:
            return
        pending = self._alignments[0]
        missing = [ch for ch in range(self._num_channels) if ch not in pending.wall_ms]
        raise CheckpointError(
            f"end of input while aligning checkpoint {pending.checkpoint_id}: no barrier from "
            f"channel(s) {', '.join(map(str, missing))} of {self._num_channels}"
        )

    # ------------------------------------------------------------------------- internals

    def _hold(self, channel: int, item: object) -> None:
        if isinstance(item, CheckpointBarrier):
            self._buffer.append((channel, item))
            return
        records = self._count_of(item)
        size = self._size_of(item)
        self._buffered_records += records
        alignment = self._alignments[0]
        alignment.buffered_records += records
        alignment.buffered_bytes += size
        limit = self._buffer_limit
        if limit is not None and self._in_memory + size > limit:
            assert self._spill is not None
            self._buffer.append((channel, self._spill.put(item)))
            alignment.spilled_bytes += size
            return
        self._in_memory += size
        self._buffer.append((channel, item))

    def _on_barrier(
        self,
        channel: int,
        barrier: CheckpointBarrier,
        out: list[HandlerOutput],
        work: deque[tuple[int, object]],
    ) -> None:
        cid = barrier.checkpoint_id
        # Step 1: lower alignments this channel skipped can never complete.
        for doomed in [a for a in self._alignments if a.checkpoint_id < cid]:
            if channel not in doomed.wall_ms:
                self._alignments.remove(doomed)
                n = doomed.checkpoint_id
                reason = f"subsumed: barrier {cid} arrived on channel {channel} before barrier {n}"
                out.append(Aborted(n, reason))
                self._release_buffer(work)
        # Step 2: join the alignment of this id, start a new one, or drop a stale barrier.
        current = next((a for a in self._alignments if a.checkpoint_id == cid), None)
        now = self._clock.monotonic_ms()
        if current is None and cid > self._latest_started:
            current = _Alignment(barrier, first_ms=now, last_ms=now)
            self._alignments.append(current)
            self._latest_started = cid
        elif current is None or channel in current.wall_ms:
            self._ignored += 1
            return
        current.last_ms = now
        current.wall_ms[channel] = self._clock.now_ms()
        if self._mode is CheckpointingMode.EXACTLY_ONCE:
            self._blocked.add(channel)
        # Step 3: the last channel's barrier completes the alignment; drain the buffer first.
        if len(current.wall_ms) == self._num_channels:
            self._alignments.remove(current)
            out.append(Aligned(current.barrier, current.stats()))
            self._release_buffer(work)

    def _release_buffer(self, work: deque[tuple[int, object]]) -> None:
        """Unblock every channel; buffered elements go before the rest of ``work``."""
        self._blocked.clear()
        work.extendleft(reversed(self._buffer))
        self._buffer.clear()
        self._buffered_records = 0
        self._in_memory = 0
