"""A Redis Streams source: resettable splits read by entry id, acknowledged on completion.

A split is one stream, or one of ``splits_per_stream`` consumer splits of a stream (an entry
belongs to split ``crc32(entry id) % splits_per_stream``). A split's offset counts its entries
after ``start_id`` (offset 0: nothing read yet), so the planner, checkpoints and
``--fail-after`` work with it as with any other source, and replay is deterministic: Redis
gives every entry an id that grows with each append, so the entries of a split between two
offsets never change.

Where an offset is in the stream: after a task reads a range it records an *anchor* — the
pair (offset, id of the split's last entry before it) — in a sorted set beside the stream
(``<stream>:sparkpoint:<group>:anchors:<k>of<n>:after:<start_id>``, score = offset). The
next read of the split, by whichever executor, starts with ``XRANGE (<id>`` at the anchor
instead of scanning from ``start_id``, and a checkpoint's offset resolves to the entry id it
stands for. Anchors
keep offsets meaningful when the stream is trimmed below them: once a checkpoint completed,
the entries before it may be trimmed (``XTRIM MINID``) without moving any later offset.

Acknowledgement, as Flink's ``notifyCheckpointComplete``: the source reads with ``XRANGE``,
never ``XREADGROUP``, so nothing is delivered to the consumer group ``group`` while the job
runs; only :meth:`RedisStreamSource.notify_checkpoint_complete`, which the driver calls once
a checkpoint completed and its sinks committed, moves the group's last-delivered id
(``XGROUP SETID``) to the entry id that the checkpoint's position stands for (for a stream
read as several splits: the lowest of them, below which every split is complete). The group
shows what the job has committed; a job that fails never moves it.

Entries the job has not read may not leave the stream: every read checks, in one round trip,
that none did (:mod:`sparkpoint.connectors.redis_losses`: the entry that followed its anchor,
what followed the group's acknowledged id, kept beside it at each commit in
``<stream>:sparkpoint:<group>:acknowledged``, Redis 7's counts of entries added and deleted,
and the anchors earlier reads left within its range), and refuses to go on when one did. A
split resumed past offset 0 with no anchor at or past that offset is refused too: Redis lost
what it held then, and its offsets no longer count the stream's entries.

Bounded on request: with ``until_id`` a split ends at its last entry with id <= ``until_id``;
its total is known once the stream has an entry at or after ``until_id``. Without it the
source is unbounded and the job runs until it is stopped.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, cast

import redis

from sparkpoint.connectors.redis_losses import losses, read_state, record_acknowledged
from sparkpoint.connectors.redis_positions import (
    MAX_SEQ,
    Anchor,
    EntryId,
    as_str,
    format_entry_id,
    ids_after,
    parse_entry_id,
)
from sparkpoint.connectors.sources import Source, SourceUnavailableError
from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.records import Batch
from sparkpoint.redis_connection import shared_client

#: At most this many entries are counted per split in one ``available`` call (a backlog is
#: discovered over a few epochs instead of delaying the first one).
SCAN_LIMIT = 200_000
#: Entry ids fetched per round trip while counting.
SCAN_PAGE = 10_000


class RedisSourceError(SparkpointError):
    """The stream no longer holds entries that a position of the source needs."""


class RedisStreamSource(Source):
    """Entries of Redis streams, one split per stream or ``splits_per_stream`` per stream.

    Records are the entries' fields as a dict of str, with the entry's ``stream`` and
    ``entry_id`` added (``metadata=False`` leaves them out; a field of either name is
    replaced by them).

    Args:
        url: The Redis that holds the streams (``redis://host:port/db``).
        streams: The stream keys, read in this order.
        group: The consumer group whose last-delivered id records what completed
            checkpoints cover; give each job and source its own (e.g. the job id and uid).
        splits_per_stream: Consumer splits of each stream, by a hash of the entry id.
        start_id: Read the entries after this id (``"0-0"``: from the beginning).
        until_id: Stop after this id (None: unbounded).
        metadata: Add ``stream`` and ``entry_id`` to every record.
        retained_anchors: Anchors kept per split (completed positions and read ranges); a
            restore to an older position scans from ``start_id``.

    A read never skips an entry that left the stream (trimmed, deleted) before it was read:
    it raises :class:`RedisSourceError` naming it, and the job fails over to its last
    checkpoint instead of committing output without it (see the module's docstring).
    """

    resettable: ClassVar[bool] = True

    def __init__(
        self,
        url: str,
        streams: Sequence[str],
        *,
        group: str = "sparkpoint",
        splits_per_stream: int = 1,
        start_id: str = "0-0",
        until_id: str | None = None,
        metadata: bool = True,
        retained_anchors: int = 1_000,
    ) -> None:
        if not url:
            raise ConfigurationError("RedisStreamSource needs the URL of its Redis")
        if isinstance(streams, str) or not streams:
            raise ConfigurationError("RedisStreamSource needs a list of one or more stream keys")
        if len(set(streams)) != len(streams):
            raise ConfigurationError(f"RedisStreamSource streams repeat a key: {list(streams)}")
        if not group:
            raise ConfigurationError("RedisStreamSource needs a consumer group name")
        if splits_per_stream < 1:
            raise ConfigurationError(f"splits_per_stream must be >= 1, got {splits_per_stream}")
        if retained_anchors < 1:
            raise ConfigurationError(f"retained_anchors must be >= 1, got {retained_anchors}")
        self.url = url
        self.streams = tuple(streams)
        self.group = group
        self.splits_per_stream = splits_per_stream
        self.start = parse_entry_id(start_id, "start_id")
        self.until = (
            None if until_id is None else parse_entry_id(until_id, "until_id", open_seq=MAX_SEQ)
        )
        if self.until is not None and self.until <= self.start:
            raise ConfigurationError(f"until_id {until_id} must come after start_id {start_id}")
        self.metadata = metadata
        self.retained_anchors = retained_anchors
        self._reset_runtime()

    def _reset_runtime(self) -> None:
        """Caches of one process: never pickled, rebuilt where the source is used."""
        self._scanned: dict[int, tuple[int, EntryId]] = {}  # driver: split -> (count, last id)
        self._totals: dict[int, int] = {}  # driver: totals of bounded splits, once known
        self._committed: dict[int, int] = {}  # driver: split -> offset of the last commit
        self._cursors: dict[int, Anchor] = {}  # task: split -> where its last read ended
        self._groups_ready = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_scanned", "_totals", "_committed", "_cursors", "_groups_ready"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_runtime()

    def __repr__(self) -> str:
        return (
            f"RedisStreamSource(streams={list(self.streams)}, group={self.group!r}, "
            f"splits_per_stream={self.splits_per_stream})"
        )

    # ------------------------------------------------------------------ splits
    def split_ids(self) -> list[str]:
        n = self.splits_per_stream
        return [
            f"redis:{stream}" if n == 1 else f"redis:{stream}#{k}/{n}"
            for stream in self.streams
            for k in range(n)
        ]

    def _stream(self, split: int) -> tuple[str, int]:
        """The stream key of split ``split`` and which of its consumer splits it is."""
        return self.streams[split // self.splits_per_stream], split % self.splits_per_stream

    def anchors_key(self, split: int) -> str:
        """The sorted set of (offset -> entry id) anchors of split ``split``."""
        stream, k = self._stream(split)
        n, start = self.splits_per_stream, format_entry_id(self.start)
        return f"{stream}:sparkpoint:{self.group}:anchors:{k}of{n}:after:{start}"

    def _belongs(self, split: int, entry_id: bytes) -> bool:
        n = self.splits_per_stream
        return n == 1 or zlib.crc32(entry_id) % n == split % n

    # ------------------------------------------------------------------ reading
    def _entries_after(
        self, split: int, after: EntryId, wanted: int
    ) -> tuple[list[tuple[bytes, dict[bytes, bytes]]], EntryId, EntryId | None]:
        """Up to ``wanted`` entries of the split after ``after`` (up to ``until_id``), the id
        of the last entry looked at up to them (of this split or not), and the id of the
        split's entry after them when the last page showed it."""
        stream, _ = self._stream(split)
        client = shared_client(self.url)
        end = "+" if self.until is None else format_entry_id(self.until)
        out: list[tuple[bytes, dict[bytes, bytes]]] = []
        last, following = after, None
        while len(out) < wanted:
            count = (wanted - len(out)) * self.splits_per_stream
            page = cast(
                "list[tuple[bytes, dict[bytes, bytes]]]",
                client.xrange(
                    stream,
                    f"({format_entry_id(last)}",
                    end,
                    count=max(count + self.splits_per_stream, 64),
                ),
            )
            for raw_id, fields in page:
                if not self._belongs(split, raw_id):
                    if len(out) < wanted:
                        last = parse_entry_id(as_str(raw_id), "entry id")
                elif len(out) < wanted:
                    out.append((raw_id, fields))
                    last = parse_entry_id(as_str(raw_id), "entry id")
                else:
                    following = parse_entry_id(as_str(raw_id), "entry id")
                    break
            if len(page) < count or not page:
                break
        return out, last, following

    def _anchor_at_or_before(self, split: int, offset: int) -> Anchor:
        """The best known anchor at or before ``offset``: this task's cursor, an anchor in
        Redis, else the split's start."""
        cursor = self._cursors.get(split)
        if cursor is not None and cursor.offset == offset:
            return cursor
        found = cast(
            "list[bytes]",
            shared_client(self.url).zrevrangebyscore(
                self.anchors_key(split), offset, "-inf", start=0, num=1
            ),
        )
        return Anchor.parse(found[0]) if found else Anchor(0, self.start)

    def _seek(self, split: int, offset: int) -> Anchor:
        """The anchor of ``offset``: the id of the entry just before it (the split's start
        for offset 0), checked to still be followed by what followed it.

        Every read leaves an anchor at its end, and pruning keeps the newest ones and the
        latest commit's; a position past offset 0 with no anchor at or above it was read in
        a past that Redis no longer holds (data lost, a restart without persistence, an
        older snapshot loaded): refused, its offsets would count other entries now.
        """
        anchor = self._anchor_at_or_before(split, offset)
        if anchor.offset < offset:
            key = self.anchors_key(split)
            if not shared_client(self.url).zcount(key, offset, "+inf"):
                raise RedisSourceError(
                    f"split {self.split_ids()[split]} of {self!r} resumes at offset {offset}, "
                    f"but Redis holds no anchor of it at or past that offset ({key}): Redis "
                    "lost data (restarted without persistence, flushed, loaded an older "
                    "snapshot) or the source's group or start_id changed since. Its offsets "
                    "cannot be found in the stream as it is now: start the job without this "
                    "checkpoint"
                )
            skipped, _, following = self._entries_after(
                split, anchor.entry_id, offset - anchor.offset
            )
            self._check_read(split, anchor, skipped)
            if len(skipped) < offset - anchor.offset:
                raise self._missing(split, offset, anchor.offset + len(skipped))
            last = parse_entry_id(as_str(skipped[-1][0]), "entry id")
            anchor = Anchor(offset, last, following)
            self._remember(split, anchor)
        return anchor

    def _remember(self, split: int, anchor: Anchor) -> None:
        """Keep ``anchor`` as this task's cursor and in Redis (one anchor per offset)."""
        self._cursors[split] = anchor
        if anchor.offset > 0:
            key = self.anchors_key(split)
            pipe = shared_client(self.url).pipeline(transaction=True)
            pipe.zremrangebyscore(key, anchor.offset, anchor.offset)
            pipe.zadd(key, {anchor.member(): anchor.offset})
            pipe.execute()

    def _missing(self, split: int, offset: int, found: int) -> RedisSourceError:
        return RedisSourceError(
            f"split {self.split_ids()[split]} of {self!r} needs entries up to offset {offset}, "
            f"but the stream has only {found} after the anchor: entries were trimmed or "
            "deleted before a checkpoint covered them"
        )

    def _check_read(
        self, split: int, anchor: Anchor, entries: list[tuple[bytes, dict[bytes, bytes]]]
    ) -> int | None:
        """Refuse ``entries``, read after ``anchor``, when entries the job had not read left
        the stream before they were read (:func:`~sparkpoint.connectors.redis_losses.losses`).

        Returns:
            How many entries the stream had ever been given (Redis 7+), read after them.
        """
        stream, _ = self._stream(split)
        within = range(anchor.offset + 1, anchor.offset + len(entries) + 1)
        acked, info, known = read_state(
            shared_client(self.url),
            stream,
            self.acknowledged_key(stream),
            self.anchors_key(split),
            within,
        )
        loss = losses(anchor, entries, acked, info, known)
        if loss is not None:
            raise self._lost(split, loss.what, loss.advice)
        return None if info is None else info.added

    def acknowledged_key(self, stream: str) -> str:
        """Where what the group acknowledged in ``stream`` is kept (:class:`Acknowledged`)."""
        return f"{stream}:sparkpoint:{self.group}:acknowledged"

    def _lost(self, split: int, what: str, advice: str | None = None) -> RedisSourceError:
        advice = advice or f"trim only what the consumer group {self.group!r} acknowledged"
        return RedisSourceError(
            f"split {self.split_ids()[split]} of {self!r}: {what}: trimmed (XTRIM, XADD "
            f"MAXLEN) or deleted. The job cannot go on from this position without them; {advice}"
        )

    def read(self, split: int, start: int, end: int) -> Batch:
        """Entries ``[start, end)`` of the split: ``XRANGE`` from the entry id at ``start``."""
        if end <= start:
            return Batch.of_rows([])
        after = self._seek(split, start)
        entries, _, following = self._entries_after(split, after.entry_id, end - start)
        added = self._check_read(split, after, entries)
        if len(entries) < end - start:
            raise self._missing(split, end, start + len(entries))
        stream, _ = self._stream(split)
        last = parse_entry_id(as_str(entries[-1][0]), "entry id")
        # At the stream's end nothing follows yet: the count, read after the entries, tells
        # later reads whether an entry came and left before they ran.
        self._remember(split, Anchor(end, last, following, None if following else added))
        rows = []
        for raw_id, fields in entries:
            row = {as_str(k): as_str(v) for k, v in fields.items()}
            if self.metadata:
                row["stream"] = stream
                row["entry_id"] = as_str(raw_id)
            rows.append(row)
        return Batch.of_rows(rows)

    # ------------------------------------------------------------------ sizes (driver)
    def _count(self, split: int, limit: int | None) -> int:
        """Entries of the split known to exist: counted forward from the furthest anchor,
        looking at most at ``limit`` more entries of the stream in this call (their ids
        only: a script on the server leaves their fields there)."""
        if split not in self._scanned:
            self._ensure_groups()
            found = cast(
                "list[bytes]", shared_client(self.url).zrevrange(self.anchors_key(split), 0, 0)
            )
            if found:
                anchor = Anchor.parse(found[0])
                self._scanned[split] = (anchor.offset, anchor.entry_id)
            else:
                self._scanned[split] = (0, self.start)
        count, last = self._scanned[split]
        stream, _ = self._stream(split)
        end = "+" if self.until is None else format_entry_id(self.until)
        looked = 0
        while limit is None or looked < limit:
            ids = ids_after(self.url, stream, f"({format_entry_id(last)}", end, SCAN_PAGE)
            count += sum(1 for entry_id in ids if self._belongs(split, entry_id))
            if ids:
                last = parse_entry_id(as_str(ids[-1]), "entry id")
            looked += len(ids)
            if len(ids) < SCAN_PAGE:
                break
        self._scanned[split] = (count, last)
        return count

    def available(self, split: int, elapsed_s: float) -> int | None:
        """Entries of the split in the stream now (the clock plays no part)."""
        with self._reachable():
            return self._count(split, SCAN_LIMIT)

    def total(self, split: int) -> int | None:
        """Unbounded: None. Bounded: the entries up to ``until_id``, once the stream has an
        entry at or after it (before that more may come: None)."""
        if self.until is None:
            return None
        with self._reachable():
            return self._total(split)

    @contextlib.contextmanager
    def _reachable(self) -> Iterator[None]:
        """A Redis that does not answer (down, restarting, loading its data) is a
        :class:`SourceUnavailableError`: the driver waits for it instead of failing."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as err:
            raise SourceUnavailableError(
                f"the Redis of streams {', '.join(self.streams)} does not answer: {err}"
            ) from err

    def _total(self, split: int) -> int | None:
        assert self.until is not None
        if split in self._totals:
            return self._totals[split]
        stream, _ = self._stream(split)
        try:
            info = shared_client(self.url).xinfo_stream(stream)
        except redis.ResponseError:  # no such stream yet
            return None
        if parse_entry_id(as_str(info["last-generated-id"]), "last id") < self.until:
            return None
        self._totals[split] = self._count(split, None)
        return self._totals[split]

    # ------------------------------------------------------------------ acknowledgement
    def _ensure_groups(self) -> None:
        """Create the consumer group of every stream at ``start_id`` (the stream too)."""
        if self._groups_ready:
            return
        client = shared_client(self.url)
        for stream in self.streams:
            try:
                client.xgroup_create(stream, self.group, format_entry_id(self.start), mkstream=True)
            except redis.ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise
        self._groups_ready = True

    def entry_id_at(self, split: int, offset: int) -> EntryId:
        """The id of the last entry before ``offset`` (what position ``offset`` stands for)."""
        if offset == 0:
            return self.start
        return self._seek(split, offset).entry_id

    def covered_through(self, split: int, entry_id: EntryId) -> EntryId:
        """The highest id below which every entry of the split is read, when the split was read
        through ``entry_id``: just before the split's next entry (the stream's other splits'
        entries in between are not this split's to wait for). One split per stream:
        ``entry_id`` itself."""
        if self.splits_per_stream == 1:
            return entry_id
        following, last_seen, _ = self._entries_after(split, entry_id, 1)
        if not following:  # none of the split's entries after it in the stream (so far)
            return last_seen
        ms, seq = parse_entry_id(as_str(following[0][0]), "entry id")
        return (ms, seq - 1) if seq > 0 else (ms - 1, MAX_SEQ)

    def notify_checkpoint_complete(self, checkpoint_id: int, positions: dict[str, int]) -> None:
        """Acknowledge what checkpoint ``checkpoint_id`` covers: move each stream's consumer
        group forward to the entry id of its positions (never back), then drop the anchors
        between the previous completed position and this one.

        Steps: (1) the entry id of every split's position (with several splits per stream:
        just before the split's next entry), (2) per stream the lowest of its splits' ids, set
        as the group's last-delivered id if it is ahead, (3) prune anchors.
        """
        with self._reachable():
            self._acknowledge(positions)

    def _acknowledge(self, positions: dict[str, int]) -> None:
        ids = self.split_ids()
        client = shared_client(self.url)
        self._ensure_groups()
        # Step 1
        at = {i: positions[sid] for i, sid in enumerate(ids) if sid in positions}
        entry_ids = {
            i: self.covered_through(i, self.entry_id_at(i, offset)) for i, offset in at.items()
        }
        # Step 2: every entry of the stream up to the lowest of its splits' ids is read
        n = self.splits_per_stream
        for s, stream in enumerate(self.streams):
            splits = range(s * n, (s + 1) * n)
            if not all(i in entry_ids for i in splits):
                continue
            safe = min(entry_ids[i] for i in splits)
            if safe > self.group_last_delivered(stream):
                record_acknowledged(client, stream, self.acknowledged_key(stream), safe)
                client.xgroup_setid(stream, self.group, format_entry_id(safe))
        # Step 3
        for i, offset in at.items():
            key = self.anchors_key(i)
            previous = self._committed.get(i)
            if previous is not None and previous < offset:
                client.zremrangebyscore(key, f"({previous}", f"({offset}")
            committed = self._committed[i] = max(offset, previous or 0)
            # The newest retained_anchors are kept, and the latest commit's whatever came
            # after it: a restore of that checkpoint must find its own anchor.
            cut = cast(
                "list[tuple[bytes, float]]",
                client.zrange(key, -self.retained_anchors, -self.retained_anchors, withscores=True),
            )
            if cut:
                client.zremrangebyscore(key, "-inf", f"({min(int(cut[0][1]), committed)}")

    def group_last_delivered(self, stream: str) -> EntryId:
        """The last-delivered id of the source's consumer group on ``stream``."""
        for info in shared_client(self.url).xinfo_groups(stream):
            if as_str(info["name"]) == self.group:
                return parse_entry_id(as_str(info["last-delivered-id"]), "last-delivered-id")
        raise RedisSourceError(f"stream {stream} has no consumer group {self.group!r}")
