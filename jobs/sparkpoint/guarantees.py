"""A job's end-to-end delivery guarantee, derived from its sources, its sinks and its mode.

Checkpoints make a job's *state* exactly-once; what reaches the outside world depends on the
ends of the pipeline (the seeds' consistency table, as Flink's documentation explains it):

=====================  ==============  ================  ==================  ===============
source \\ sink          none            idempotent        write-ahead log     two-phase commit
=====================  ==============  ================  ==================  ===============
not resettable         at-most-once    at-most-once      at-most-once        at-most-once
resettable             at-least-once   exactly-once (*)  at-least-once       exactly-once
=====================  ==============  ================  ==================  ===============

(*) effectively: a replay after a restore writes the same rows again and overwrites them.

A job with several sources and sinks gets the weakest of its parts, and the ``at_least_once``
checkpointing mode (barriers not aligned) caps it at at-least-once, since state may then count
records that a restore replays. The ``reason`` names the operator uids that weaken the
guarantee; it is None only for exactly-once without caveat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sparkpoint.connectors.sinks import TwoPhaseCommitSink
from sparkpoint.connectors.sources import Source
from sparkpoint.errors import ConfigurationError
from sparkpoint.protocol_types import CheckpointingMode

Level = Literal["exactly_once", "at_least_once", "at_most_once"]

# From the strongest to the weakest: a job gets the last level any of its parts allows.
LEVELS: tuple[Level, ...] = ("exactly_once", "at_least_once", "at_most_once")

# A sink's ``delivery`` -> what a resettable source achieves through it, and why when it is
# weaker than exactly-once (or exactly-once with a caveat). ``{uid}`` is the sink's uid.
_SINK_DELIVERY: dict[str, tuple[Level, str | None]] = {
    "two_phase_commit": ("exactly_once", None),
    "idempotent": (
        "exactly_once",
        "sink '{uid}' makes idempotent writes: replays overwrite, so its target ends as after "
        "a run without failures (a reader may meanwhile see a row's older value again)",
    ),
    "write_ahead_log": (
        "at_least_once",
        "sink '{uid}' writes a completed checkpoint's records from a write-ahead log to a "
        "target without transactions: a failure while it writes them writes them again",
    ),
    "none": (
        "at_least_once",
        "sink '{uid}' writes at once without replay protection: records replayed after a "
        "restore are written again",
    ),
}
DELIVERIES = frozenset(_SINK_DELIVERY)


@dataclass(frozen=True)
class Guarantee:
    """The end-to-end guarantee of a job and, unless it is plain exactly-once, why."""

    level: Level
    reason: str | None = None

    @property
    def label(self) -> str:
        """``EXACTLY-ONCE``, ``AT-LEAST-ONCE`` or ``AT-MOST-ONCE``."""
        return self.level.upper().replace("_", "-")

    def describe(self) -> str:
        """One line: the level, and the reason when there is one."""
        return f"{self.label} ({self.reason})" if self.reason else self.label


def sink_delivery(uid: str, sink: TwoPhaseCommitSink) -> str:
    """The ``delivery`` a sink declares.

    Raises:
        ConfigurationError: the sink declares a delivery outside :data:`DELIVERIES`.
    """
    delivery = getattr(sink, "delivery", None)
    if delivery not in _SINK_DELIVERY:
        raise ConfigurationError(
            f"sink '{uid}' ({type(sink).__name__}) declares delivery {delivery!r}; "
            f"expected one of {', '.join(sorted(_SINK_DELIVERY))}"
        )
    return str(delivery)


def end_to_end(
    sources: Mapping[str, Source],
    sinks: Mapping[str, TwoPhaseCommitSink],
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE,
) -> Guarantee:
    """The guarantee of a job reading ``sources`` and writing ``sinks`` (uid -> connector).

    Every part states the strongest level it allows with a reason when it allows less than
    exactly-once (or only with a caveat); the job gets the weakest level, and the reasons of
    the parts at that level, joined in uid order.

    Raises:
        ConfigurationError: a sink declares an unknown delivery.
    """
    parts: list[tuple[Level, str | None]] = []
    for uid in sorted(sources):
        if not sources[uid].resettable:
            parts.append(
                (
                    "at_most_once",
                    f"source '{uid}' cannot be read again from a checkpointed position: "
                    "the records it gave after the last completed checkpoint are lost on "
                    "a failure",
                )
            )
    for uid in sorted(sinks):
        level, reason = _SINK_DELIVERY[sink_delivery(uid, sinks[uid])]
        parts.append((level, reason.format(uid=uid) if reason else None))
    if mode is CheckpointingMode.AT_LEAST_ONCE:
        parts.append(
            (
                "at_least_once",
                "checkpointing mode at_least_once does not align barriers: state may count "
                "records that a restore replays",
            )
        )
    if not sinks:
        parts.append(("exactly_once", "the job has no sink: the guarantee covers its state"))
    level = max((lv for lv, _ in parts), key=LEVELS.index, default="exactly_once")
    reasons = [r for lv, r in parts if lv == level and r]
    return Guarantee(level, "; ".join(reasons) or None)
