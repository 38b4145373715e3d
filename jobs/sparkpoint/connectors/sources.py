"""Resettable sources: split-based readers whose position is an offset that a checkpoint stores.

Replay is deterministic: what a split yields for an offset range depends only on the split,
the offsets and the source's parameters, never on the wall clock (the clock only paces how
much is *available*, for ``--rate``).
"""

from __future__ import annotations

import abc
import functools
import json
import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.hash_grouping import mix64
from sparkpoint.records import Batch, DictColumn


class SourceUnavailableError(SparkpointError):
    """A source's system (a Redis, a broker) cannot be reached now: what the driver asks of
    it (how much it holds, an acknowledgement) waits until it answers again."""


def unanswered_text(splits: list[str], shown: int = 3) -> str:
    """The splits whose source does not answer, as a sentence's subject with its verb:
    ``"redis:ev does"``, ``"redis:a and redis:b do"``, ``"redis:a, redis:b, redis:c and 2
    more splits do"``: the console, ``sparkpoint status`` and the dashboard say it alike."""
    if len(splits) == 1:
        return f"{splits[0]} does"
    named = splits[:shown] if len(splits) > shown else splits[:-1]
    rest = len(splits) - len(named)
    last = splits[-1] if rest == 1 else f"{rest} more splits"
    return f"{', '.join(named)} and {last} do"


class Source(abc.ABC):
    """A bounded or unbounded source made of splits read by offset ranges."""

    # Whether the source can be read again from a checkpointed position (a replay after a
    # restore yields the same records); a source that cannot sets it False, and a job that
    # reads it is at-most-once end to end (``sparkpoint.guarantees``).
    resettable: ClassVar[bool] = True

    @abc.abstractmethod
    def split_ids(self) -> list[str]:
        """Stable ids of the splits; one source subtask reads one split."""

    @abc.abstractmethod
    def total(self, split: int) -> int | None:
        """How many records split ``split`` holds, or None when unbounded (or not known yet).

        Raises:
            SourceUnavailableError: the source's system cannot be reached now.
        """

    def available(self, split: int, elapsed_s: float) -> int | None:
        """How many records of the split exist after ``elapsed_s`` seconds (None: all).

        Raises:
            SourceUnavailableError: the source's system cannot be reached now; the driver
                plans nothing new of the split until it answers again (its epochs and
                checkpoints go on), as a Flink source whose system is away reads nothing.
        """
        return None

    @abc.abstractmethod
    def read(self, split: int, start: int, end: int) -> Batch:
        """Records ``[start, end)`` of split ``split``; the same every time it is asked."""

    def notify_checkpoint_complete(  # noqa: B027 - optional hook
        self, checkpoint_id: int, positions: dict[str, int]
    ) -> None:
        """Checkpoint ``checkpoint_id`` completed and its sinks committed; ``positions`` are
        its offsets per split id (Flink's ``notifyCheckpointComplete``). A source that tells
        its system what was consumed (acknowledges, commits offsets) does it here and never
        earlier; the driver calls it, the default does nothing.

        Raises:
            SourceUnavailableError: the source's system cannot be reached now; the next
                completed checkpoint acknowledges what this one covers, and more.
        """


# Up to this many apps, a process names them all once (about 40 bytes each) and a batch takes
# its apps' names from that array; beyond, a batch names its own apps.
_NAMED_APPS = 1 << 21
# Fewer records than apps / this: the apps that occur are found by sorting the records, not by
# counting over every app.
_SORT_BELOW = 16


@functools.lru_cache(maxsize=8)
def _app_names(apps: int) -> np.ndarray:
    """``app-0 .. app-{apps-1}`` as a read-only str array, built once per process."""
    names = _named(np.arange(apps, dtype=np.int64))
    names.flags.writeable = False
    return names


def _named(indices: np.ndarray) -> np.ndarray:
    """``app-{i}`` of every non-negative ``i`` of ``indices`` as a str array, in numpy: the
    digits written a column at a time, the indices of one length together (a million names
    in tens of milliseconds, not a second of formatting one by one)."""
    digits = np.ones(len(indices), dtype=np.int64)
    bound = 10
    top = int(indices.max()) if len(indices) else 0
    while bound <= top:
        digits += indices >= bound
        bound *= 10
    width = 4 + int(digits.max(initial=0))
    chars = np.zeros((len(indices), width), dtype=np.uint32)
    chars[:, :4] = np.frombuffer(b"app-", dtype=np.uint8)
    for length in np.unique(digits).tolist():
        rows = np.flatnonzero(digits == length)
        rest = indices[rows]
        written = np.empty((len(rows), length), dtype=np.uint32)
        for column in range(length - 1, -1, -1):  # the last digit first
            written[:, column] = rest % 10 + ord("0")
            rest = rest // 10
        chars[rows, 4 : 4 + length] = written
    return chars.view(f"U{width}").reshape(-1)


def _app_ids(idx: np.ndarray, apps: int) -> DictColumn:
    """The ``app_id`` column of app indices ``idx``, dictionary-encoded.

    With fewer records than apps, only the apps that occur become values (so a batch never
    carries more names than records); otherwise every app name is a value and ``idx`` are
    the codes as they are.
    """
    if len(idx) >= apps:
        return DictColumn(idx.astype(np.int32), _app_names(apps))
    if len(idx) * _SORT_BELOW < apps:  # a few records of many apps: sort them
        present, codes = np.unique(idx, return_inverse=True)
        codes = codes.reshape(-1)
    else:  # which apps occur, and each one's rank among them, in O(records + apps)
        present = np.flatnonzero(np.bincount(idx, minlength=apps))
        rank = np.empty(apps, dtype=np.int32)
        rank[present] = np.arange(len(present), dtype=np.int32)
        codes = rank[idx]
    names = _app_names(apps)[present] if apps <= _NAMED_APPS else _named(present)
    return DictColumn(codes, names)


@dataclass(frozen=True)
class GeneratorSource(Source):
    """Deterministic page-view events: ``app_id``, ``event_id`` and ``event_time`` (ms).

    Event ``g`` (0-based, over the whole source) lives in split ``g % splits`` at offset
    ``g // splits``; its ``app_id`` is a hash of ``(seed, g)`` over ``apps`` apps and its event
    time is ``start_time_ms + g * 1000 / rate`` (1 ms apart when unpaced), so a replay after
    recovery yields exactly the same records. ``rate`` is events per second over all splits
    (0: as fast as possible). ``app_id`` comes as a :class:`~sparkpoint.records.DictColumn`.

    ``backlog`` events (over all splits) exist when a paced job starts, as if the source had
    started ``backlog / rate`` seconds earlier: the job starts that far behind. Only when
    records become available changes; the records do not, so event ``g``'s time stays
    ``start_time_ms + g * 1000 / rate`` (``start_time_ms`` is when the backlog began, and the
    job starts at event time ``start_time_ms + backlog * 1000 / rate``), and a job with a
    backlog writes what the same job without one writes. Unpaced, everything exists already
    and ``backlog`` changes nothing.
    """

    events: int | None = 10_000
    apps: int = 10
    rate: float = 10_000.0
    splits: int = 2
    seed: int = 0
    start_time_ms: int = 1_700_000_000_000
    backlog: int = 0

    def __post_init__(self) -> None:
        if self.events is not None and self.events < 0:
            raise ConfigurationError(f"--events must be >= 0, got {self.events}")
        if self.apps < 1:
            raise ConfigurationError(f"--apps must be >= 1, got {self.apps}")
        if self.rate < 0:
            raise ConfigurationError(f"--rate must be >= 0 events/s, got {self.rate}")
        if self.splits < 1:
            raise ConfigurationError(f"source splits must be >= 1, got {self.splits}")
        if self.backlog < 0:
            raise ConfigurationError(f"--backlog must be >= 0 events, got {self.backlog}")

    def split_ids(self) -> list[str]:
        return [f"generator-{i}" for i in range(self.splits)]

    def total(self, split: int) -> int | None:
        if self.events is None:
            return None
        return max(0, (self.events - split + self.splits - 1) // self.splits)

    def available(self, split: int, elapsed_s: float) -> int | None:
        if self.rate == 0:
            return None
        return int((self.rate * elapsed_s + self.backlog) / self.splits)

    def read(self, split: int, start: int, end: int) -> Batch:
        g = np.arange(start, end, dtype=np.int64) * self.splits + split
        idx = mix64(g.astype(np.uint64) ^ np.uint64(self.seed)) % np.uint64(self.apps)
        step = 1000.0 / self.rate if self.rate else 1.0
        times = self.start_time_ms + (g * step).astype(np.int64)
        app_ids = _app_ids(idx.astype(np.int64), self.apps)
        return Batch.of_columns(app_id=app_ids, event_id=g, event_time=times)


@dataclass(frozen=True)
class FileSource(Source):
    """Lines of text files, one split per file; the position is the line number.

    ``format="json"`` parses each line as a JSON object; ``"text"`` yields the lines as str.
    Files are read whole by the task that reads a range of them (fine for the file sizes a
    test or demo uses; a production source would seek by byte offset).
    """

    paths: tuple[str, ...]
    format: str = "json"

    def __post_init__(self) -> None:
        if not self.paths:
            raise ConfigurationError("FileSource needs at least one file")
        if self.format not in ("json", "text"):
            raise ConfigurationError(f"FileSource format must be json or text, not {self.format!r}")
        for path in self.paths:
            if not os.path.isfile(path):
                raise ConfigurationError(f"FileSource file does not exist: {path}")

    def split_ids(self) -> list[str]:
        return [f"file-{i}:{os.path.basename(p)}" for i, p in enumerate(self.paths)]

    def _lines(self, split: int) -> list[str]:
        with open(self.paths[split], encoding="utf-8") as fh:
            return fh.read().splitlines()

    def total(self, split: int) -> int | None:
        return len(self._lines(split))

    def read(self, split: int, start: int, end: int) -> Batch:
        lines = self._lines(split)[start:end]
        if self.format == "text":
            return Batch.of_rows(lines)
        records = []
        for number, line in enumerate(lines, start=start):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ConfigurationError(
                    f"{self.paths[split]} line {number + 1} is not valid JSON: {err.msg}"
                ) from err
        return Batch.of_rows(records)
