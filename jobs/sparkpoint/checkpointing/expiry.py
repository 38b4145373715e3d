"""Why a checkpoint expired, told from when the job's epochs ended.

On Spark a barrier travels with an epoch (one Spark job): a source subtask injects it when the
first epoch planned after the trigger reads its split, and a subtask acknowledges when the
epoch has carried the barrier through it. An epoch that runs longer than the checkpoint
timeout (a slow operator, an epoch planned too large) therefore expires the checkpoint, and
``0/4 subtasks acknowledged`` alone does not say so. :class:`EpochEnds` keeps when the
latest epochs ended, on the authority's clock; its :meth:`~EpochEnds.why_expired` is what the
coordinator adds to an expired checkpoint's message (``expire_overdue(why=...)``), before the
failure counts: which epoch ended last and how long before the expiry, how long no epoch ended.
"""

from __future__ import annotations

from collections import deque

from sparkpoint.checkpointing.pending import FailedCheckpoint

__all__ = ["EpochEnds"]

#: Epoch ends kept: a checkpoint's trigger is never more than a few epochs back.
KEPT = 32
#: Epochs of an attempt (after its first) measured before :meth:`EpochEnds.shortest_ms` tells.
SHORTEST_AFTER = 3

ADVICE = (
    "a barrier travels with an epoch (one Spark job), so an epoch that runs longer than the "
    "checkpoint timeout expires it: look for a slow operator in that epoch, or plan shorter "
    "epochs (--epoch-target-ms, --max-epoch-records), or give checkpoints a longer "
    "--checkpoint-timeout"
)


class EpochEnds:
    """When the job's latest epochs ended: ``(attempt, epoch, time in ms)``, oldest first."""

    def __init__(self) -> None:
        self._ends: deque[tuple[int, int, int]] = deque(maxlen=KEPT)
        # (attempt, duration ms) of the latest epochs that reported how long they ran.
        self._durations: deque[tuple[int, float]] = deque(maxlen=KEPT)
        self._newest_attempt = 0  # the newest attempt with an epoch that ended

    def ended(self, attempt: int, epoch: int, at_ms: int, duration_ms: float | None = None) -> None:
        """Epoch ``epoch`` of ``attempt`` ended at ``at_ms`` (the clock the checkpoints'
        trigger and failure times are on), after running ``duration_ms`` if known."""
        if duration_ms is not None and self.any_of(attempt):
            self._durations.append((attempt, duration_ms))  # not an attempt's first: start-up
        self._ends.append((attempt, epoch, at_ms))
        self._newest_attempt = max(self._newest_attempt, attempt)

    def any_of(self, attempt: int) -> bool:
        """Whether an epoch of ``attempt`` ended (its tasks ran). The control plane asks of
        every running job's current attempt at every tick: that one is answered without a
        scan."""
        return attempt == self._newest_attempt or any(a == attempt for a, _, _ in self._ends)

    def shortest_ms(self, attempt: int, at_least: int = SHORTEST_AFTER) -> float | None:
        """The shortest of the latest epochs of ``attempt`` (its first, which starts the
        Python workers, left out); None until ``at_least`` of them are known. No checkpoint
        completes in less: its barrier rides one whole epoch."""
        mine = [d for a, d in self._durations if a == attempt]
        return min(mine) if len(mine) >= at_least else None

    def why_expired(self, f: FailedCheckpoint) -> str | None:
        """How long no epoch had ended when the checkpoint ``f`` expired; None when two or
        more epochs ended between its trigger and its expiry (the one that carried its
        barrier ended too: an epoch was not what held it up), or when no end of an epoch of
        its attempt is known."""
        trigger, expiry = f.trigger_timestamp, f.failure_timestamp
        mine = [(epoch, at) for attempt, epoch, at in self._ends if attempt == f.attempt]
        since = [(epoch, at) for epoch, at in mine if trigger < at <= expiry]
        before = [(epoch, at) for epoch, at in mine if at <= trigger]
        if len(since) >= 2:
            return None
        if since:
            epoch, at = since[0]
            running = (
                f"Epoch {epoch} ended {at - trigger} ms after the trigger, and no epoch ended "
                f"in the {expiry - at} ms from then to the expiry"
            )
        elif before:
            epoch, at = before[-1]
            running = (
                f"No epoch ended between the trigger and the expiry: the last to end, epoch "
                f"{epoch}, ended {trigger - at} ms before the trigger and {expiry - at} ms "
                "before the expiry"
            )
        else:  # no end of this attempt's epochs is known (or kept): nothing to tell
            return None
        return f"{running}; {ADVICE}"
