"""Event time: record timestamps, watermarks, and how they travel from sources to keyed tasks.

Flink's ``WatermarkStrategy.forBoundedOutOfOrderness``: a source subtask extracts every
record's timestamp (:func:`extract_timestamps`), and after each chunk it emits sends
``Watermark(max timestamp seen - out_of_orderness - 1)`` on every downstream channel, behind
the records before it, as it does with barriers. A split that reached its end sends
``Watermark(MAX_WATERMARK)``. A keyed subtask keeps the latest watermark of every input
channel (:class:`WatermarkValve`, Flink's ``StatusWatermarkValve``); its own watermark is the
minimum over the channels, and event-time timers up to it fire when it advances.

The per-channel watermarks are operator state: they live in the keyed state backend, go into
its working state and its snapshots, and are restored with it.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkpoint.errors import ConfigurationError
from sparkpoint.records import Batch

MIN_WATERMARK = -(2**63)  # Flink's Long.MIN_VALUE: no watermark yet
MAX_WATERMARK = 2**63 - 1  # Long.MAX_VALUE: the end of event time (a split has ended)

#: A record's event time in ms: a field name or a function of the record.
TimestampSelector = str | Callable[[Any], int]


@dataclass(frozen=True, slots=True)
class Watermark:
    """Flink's ``Watermark``: no record with a timestamp <= ``timestamp`` should follow.

    It crosses the exchange like a barrier and is buffered like data while a channel is
    blocked for alignment; it holds no records, so it counts as 0 records and 0 bytes there.
    """

    timestamp: int

    @property
    def nbytes(self) -> int:
        return 0

    def __len__(self) -> int:
        return 0

    def __reduce__(self) -> tuple[type[Watermark], tuple[int]]:
        return (Watermark, (self.timestamp,))


def extract_timestamps(selector: TimestampSelector, batch: Batch) -> np.ndarray:
    """The event time of every record of ``batch`` as an int64 array (a column lookup for a
    field-name selector)."""
    if not len(batch):
        return np.empty(0, dtype=np.int64)
    if isinstance(selector, str):
        try:
            return np.asarray(batch.column(selector), dtype=np.int64)
        except KeyError as err:
            raise ConfigurationError(
                f"records have no timestamp field {selector!r} at the keyed operator: "
                "keep it until the key_by, or give a function"
            ) from err
    rows = batch.rows
    return np.fromiter((int(selector(r)) for r in rows), dtype=np.int64, count=len(rows))


class BoundedOutOfOrdernessWatermarks:
    """Flink's ``BoundedOutOfOrdernessWatermarks`` for one source subtask and epoch.

    The watermark is the highest timestamp seen so far minus the bound, minus 1 (records up to
    ``out_of_orderness_ms`` older than the newest one are still on time). It starts afresh in
    every source task; the keyed side keeps the maximum per channel, so over an epoch boundary
    a channel's watermark is still the maximum over the whole split.
    """

    def __init__(self, selector: TimestampSelector, out_of_orderness_ms: int) -> None:
        self.selector = selector
        self.out_of_orderness_ms = out_of_orderness_ms
        self._max: int | None = None

    def observe(self, batch: Batch) -> None:
        stamps = extract_timestamps(self.selector, batch)
        if len(stamps):
            top = int(stamps.max())
            self._max = top if self._max is None else max(self._max, top)

    def current(self) -> Watermark | None:
        """The watermark after what was observed, or None before the first record."""
        if self._max is None:
            return None
        return Watermark(self._max - self.out_of_orderness_ms - 1)


class WatermarkValve:
    """The watermarks of a keyed subtask's input channels (Flink's ``StatusWatermarkValve``).

    ``channels`` maps channel -> latest watermark; it is the state backend's dict, so it is
    snapshotted and kept between epochs with the keyed state. A channel that sent nothing yet
    counts as :data:`MIN_WATERMARK`.
    """

    def __init__(self, channels: MutableMapping[int, int], num_channels: int) -> None:
        self._channels = channels
        self._num = num_channels
        self.current = self._minimum()

    def _minimum(self) -> int:
        return min(self._channels.get(c, MIN_WATERMARK) for c in range(self._num))

    def input(self, channel: int, watermark: Watermark) -> int | None:
        """Take ``watermark`` from ``channel``; the new subtask watermark if it advanced."""
        if watermark.timestamp <= self._channels.get(channel, MIN_WATERMARK):
            return None  # watermarks never go back
        self._channels[channel] = watermark.timestamp
        new = self._minimum()
        if new <= self.current:
            return None
        self.current = new
        return new


def merge_channel_watermarks(restored: list[dict[int, int]]) -> dict[int, int]:
    """The channel watermarks of a subtask restored from several old subtasks' snapshots:
    per channel the minimum, and only channels that every snapshot has (a missing one is
    :data:`MIN_WATERMARK`). In exactly-once mode all of them hold the same watermarks, since
    each snapshot was taken after the same records and watermarks of every channel."""
    if not restored:
        return {}
    common = set(restored[0]).intersection(*restored[1:])
    return {c: min(r[c] for r in restored) for c in sorted(common)}
