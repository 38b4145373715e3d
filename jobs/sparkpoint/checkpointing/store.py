"""Which completed checkpoints are retained, and which the host may delete (Flink's store).

The :class:`CompletedCheckpointStore` keeps the newest ``retained`` regular checkpoints and every
savepoint. Adding a checkpoint returns the ones it subsumed: the host deletes their state. A
checkpoint that is pinned (a pending restore or an uncommitted sink transaction still needs it)
is never handed out for deletion; once its last pin is released, :meth:`unpin` returns it.
"""

from __future__ import annotations

from collections.abc import Iterable

from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError


class CompletedCheckpointStore:
    """The retained completed checkpoints of one job, in checkpoint-id order."""

    def __init__(self, retained: int) -> None:
        """Create an empty store.

        Args:
            retained: how many regular checkpoints to keep (savepoints do not count), >= 1.

        Raises:
            ConfigurationError: when ``retained`` is below 1.
        """
        _check_retained(retained)
        self._retained = retained
        self._checkpoints: dict[int, CompletedCheckpoint] = {}
        self._subsumed_pinned: dict[int, CompletedCheckpoint] = {}
        self._pins: dict[int, set[str]] = {}

    @property
    def retained(self) -> int:
        return self._retained

    def __len__(self) -> int:
        return len(self._checkpoints)

    def __contains__(self, checkpoint_id: object) -> bool:
        return checkpoint_id in self._checkpoints

    def add(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        """Retain a newly completed checkpoint.

        Args:
            checkpoint: the completed checkpoint or savepoint.

        Returns:
            The regular checkpoints it subsumed and that no pin holds, oldest first: the host
            deletes their state. Pinned ones are kept until unpinned.

        Raises:
            CheckpointError: when a checkpoint with the same id is already in the store.
        """
        cid = checkpoint.checkpoint_id
        if cid in self._checkpoints or cid in self._subsumed_pinned:
            raise CheckpointError(f"checkpoint {cid} is already in the completed-checkpoint store")
        self._checkpoints[cid] = checkpoint
        return self._subsume()

    def replay(
        self, completed: Iterable[CompletedCheckpoint], pins: Iterable[tuple[int, str]]
    ) -> list[CompletedCheckpoint]:
        """Retention again over the records of a host that restarted: each checkpoint enters
        in id order and its pins come back as it enters, before a later one can subsume it.

        Returns:
            What the replay subsumed and no pin holds: kept past retention for a reason that
            ended with the host (another job's origin, whose pin is the host's to give again).
        """
        why_pinned: dict[int, list[str]] = {}
        for checkpoint_id, why in pins:
            why_pinned.setdefault(checkpoint_id, []).append(why)
        dropped: list[CompletedCheckpoint] = []
        for checkpoint in sorted(completed, key=lambda c: c.checkpoint_id):
            dropped += self.add(checkpoint)
            for why in why_pinned.get(checkpoint.checkpoint_id, ()):
                self.pin(checkpoint.checkpoint_id, why)
        return dropped

    def remove(self, checkpoint_id: int) -> CompletedCheckpoint:
        """Take a checkpoint out of the store (a failed finalization, a disposed savepoint).

        Raises:
            CheckpointNotFoundError: when the store does not hold it.
            CheckpointError: when it is pinned.
        """
        if checkpoint_id in self._pins:
            why = ", ".join(sorted(self._pins[checkpoint_id]))
            raise CheckpointError(f"checkpoint {checkpoint_id} is pinned ({why}); cannot remove it")
        found = self._checkpoints.pop(checkpoint_id, None) or self._subsumed_pinned.pop(
            checkpoint_id, None
        )
        if found is None:
            raise CheckpointNotFoundError(f"checkpoint {checkpoint_id} is not in the store")
        return found

    def pin(self, checkpoint_id: int, why: str) -> None:
        """Keep a checkpoint's state until :meth:`unpin` releases it for the same reason.

        Args:
            checkpoint_id: a checkpoint the store holds.
            why: the holder, for example ``"restore attempt 3"`` or ``"sink transactions"``.

        Raises:
            CheckpointNotFoundError: when the store does not hold it.
        """
        if self.get(checkpoint_id) is None:
            raise CheckpointNotFoundError(
                f"cannot pin checkpoint {checkpoint_id} ({why}): it is not in the store"
            )
        self._pins.setdefault(checkpoint_id, set()).add(why)

    def unpin(self, checkpoint_id: int, why: str) -> list[CompletedCheckpoint]:
        """Release one pin; releasing a pin that is not held does nothing.

        Returns:
            ``[checkpoint]`` when it was already subsumed and this was its last pin (the host
            deletes its state now), else ``[]``.
        """
        reasons = self._pins.get(checkpoint_id)
        if reasons is None:
            return []
        reasons.discard(why)
        if reasons:
            return []
        del self._pins[checkpoint_id]
        released = self._subsumed_pinned.pop(checkpoint_id, None)
        return [released] if released is not None else []

    def keep(self, checkpoint: CompletedCheckpoint, why: str) -> None:
        """Hold a checkpoint that retention subsumed and handed out, pinned for ``why`` (the
        host found that something else still needs its state): :meth:`unpin` releases it."""
        cid = checkpoint.checkpoint_id
        if cid in self._checkpoints or cid in self._subsumed_pinned:
            raise CheckpointError(f"checkpoint {cid} is already in the completed-checkpoint store")
        self._subsumed_pinned[cid] = checkpoint
        self._pins.setdefault(cid, set()).add(why)

    def pins(self, checkpoint_id: int) -> frozenset[str]:
        """Why a checkpoint is pinned (empty when it is not)."""
        return frozenset(self._pins.get(checkpoint_id, ()))

    def is_pinned(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self._pins

    def latest(self, include_savepoints: bool = True) -> CompletedCheckpoint | None:
        """The retained checkpoint with the highest id, or None when there is none."""
        ids = [
            cid
            for cid, cp in self._checkpoints.items()
            if include_savepoints or not cp.is_savepoint
        ]
        return self._checkpoints[max(ids)] if ids else None

    def get(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        """A checkpoint whose state the store still holds (retained, or subsumed but pinned)."""
        return self._checkpoints.get(checkpoint_id) or self._subsumed_pinned.get(checkpoint_id)

    def all(self) -> list[CompletedCheckpoint]:
        """The retained checkpoints and savepoints, by increasing id."""
        return [self._checkpoints[cid] for cid in sorted(self._checkpoints)]

    def subsumed_pinned(self) -> list[CompletedCheckpoint]:
        """Subsumed checkpoints kept only because a pin holds them, by increasing id."""
        return [self._subsumed_pinned[cid] for cid in sorted(self._subsumed_pinned)]

    def set_retained(self, retained: int) -> list[CompletedCheckpoint]:
        """Change how many regular checkpoints are kept.

        Returns:
            The checkpoints subsumed by a lower count, as :meth:`add` does.

        Raises:
            ConfigurationError: when ``retained`` is below 1.
        """
        _check_retained(retained)
        self._retained = retained
        return self._subsume()

    def _subsume(self) -> list[CompletedCheckpoint]:
        regular = sorted(cid for cid, cp in self._checkpoints.items() if not cp.is_savepoint)
        released: list[CompletedCheckpoint] = []
        for cid in regular[: max(0, len(regular) - self._retained)]:
            checkpoint = self._checkpoints.pop(cid)
            if cid in self._pins:
                self._subsumed_pinned[cid] = checkpoint
            else:
                released.append(checkpoint)
        return released


def _check_retained(retained: int) -> None:
    if isinstance(retained, bool) or not isinstance(retained, int) or retained < 1:
        raise ConfigurationError(f"retained must be an integer >= 1, got {retained!r}")
