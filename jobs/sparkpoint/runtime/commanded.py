"""The checkpoints a connected driver was commanded: barriers to carry, acks held until told.

:class:`CommandedCheckpoints` is the pure bookkeeping of connected mode (no I/O): the barriers
the control plane triggered, waiting in id order for the epochs that carry them; the
acknowledgements of the driver's tasks, held per checkpoint until ``checkpoint_complete``
(the sinks commit exactly those) or ``checkpoint_abort`` (forgotten); and the final
checkpoint or stop-with-savepoint in flight, which ends the job once it completes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import CheckpointBarrier

#: Back-pressure: with more checkpoints than this acknowledged but neither completed nor
#: aborted (the control plane is away), the driver runs no epoch.
MAX_UNCOMMITTED_CHECKPOINTS = 8


@dataclass(frozen=True)
class QueuedBarrier:
    """A barrier the control plane triggered, waiting for the epoch that carries it."""

    barrier: CheckpointBarrier
    stops_job: bool = False  # stop-with-savepoint: the job finishes once it committed

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    @property
    def at_end(self) -> bool:
        """A final or stop-with-savepoint barrier goes after the epoch's last record."""
        return self.barrier.is_final or self.stops_job


@dataclass(frozen=True)
class Completion:
    """What ``checkpoint_complete`` means here: the acks to commit, whether the job ends, and
    what the barrier was (a checkpoint or a savepoint)."""

    acks: list[p.SnapshotCompleted]
    ends_job: bool
    kind: p.CheckpointKind


class CommandedCheckpoints:
    """Triggered barriers, held acknowledgements, and the checkpoint that ends the job."""

    def __init__(self) -> None:
        self._queue: dict[int, QueuedBarrier] = {}
        self._last_carried = 0  # ids only increase: an older trigger is a duplicate
        self._held: dict[int, tuple[QueuedBarrier, list[p.SnapshotCompleted]]] = {}
        self._ending: QueuedBarrier | None = None  # the final or stop-with-savepoint in flight
        self._end_of_input_asked = False

    def reset(self) -> None:
        """Forget everything (a restore: the control plane aborted what was pending)."""
        self._queue.clear()
        self._held.clear()
        self._ending = None
        self._end_of_input_asked = False

    # ------------------------------------------------------------------ barriers
    def queue(self, queued: QueuedBarrier) -> bool:
        """Queue a triggered barrier; False for a duplicate or one older than a carried one."""
        cid = queued.checkpoint_id
        if cid <= self._last_carried or cid in self._queue:
            return False
        self._queue[cid] = queued
        return True

    @property
    def may_run_epoch(self) -> bool:
        """False while the checkpoint that ends the job is in flight, or under back-pressure."""
        return self._ending is None and len(self._held) <= MAX_UNCOMMITTED_CHECKPOINTS

    def next_barrier(self, exhausts_input: bool) -> QueuedBarrier | None:
        """Take the oldest queued barrier for the next epoch; a final one only for the epoch
        that ends the input (it waits in the queue until then)."""
        if not self._queue:
            return None
        head = self._queue[min(self._queue)]
        if head.barrier.is_final and not exhausts_input:
            return None
        del self._queue[head.checkpoint_id]
        self._last_carried = head.checkpoint_id
        return head

    def ask_end_of_input(self) -> bool:
        """True once per ask: the input ends and no barrier is left to carry before it."""
        if self._end_of_input_asked:
            return False
        self._end_of_input_asked = True
        return True

    def carried(self, queued: QueuedBarrier) -> None:
        """The epoch carrying ``queued`` was accepted."""
        if queued.at_end:
            self._ending = queued

    # ------------------------------------------------------------------ acknowledgements
    def hold(self, queued: QueuedBarrier, ack: p.SnapshotCompleted) -> None:
        """Keep an acknowledgement of the driver's tasks until its checkpoint is decided."""
        self._held.setdefault(ack.checkpoint_id, (queued, []))[1].append(ack)

    @property
    def uncommitted(self) -> int:
        """Checkpoints acknowledged but neither completed nor aborted."""
        return len(self._held)

    def complete(self, checkpoint_id: int) -> Completion | None:
        """The held acknowledgements of a completed checkpoint (None: none held, a duplicate
        or another attempt's). Regular checkpoints before it are subsumed, as Flink's
        ``notifyCheckpointComplete`` subsumes them: their sink transactions travel in its
        acknowledgements too."""
        held = self._held.pop(checkpoint_id, None)
        if held is None:
            return None
        for older, (queued, _) in list(self._held.items()):
            if older < checkpoint_id and queued.barrier.kind is p.CheckpointKind.CHECKPOINT:
                del self._held[older]
        ends = self._ending is not None and self._ending.checkpoint_id == checkpoint_id
        return Completion(held[1], ends, held[0].barrier.kind)

    def abort(self, checkpoint_id: int) -> None:
        """Forget an aborted checkpoint. An aborted final checkpoint is asked for again; an
        aborted stop-with-savepoint leaves the job running."""
        self._held.pop(checkpoint_id, None)
        queued = self._queue.pop(checkpoint_id, None)
        if self._ending is not None and self._ending.checkpoint_id == checkpoint_id:
            queued, self._ending = self._ending, None
        if queued is not None and queued.barrier.is_final:
            self._end_of_input_asked = False
