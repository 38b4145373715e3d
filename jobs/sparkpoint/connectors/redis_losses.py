"""Whether entries a Redis Streams source has not read left the stream before it read them.

Redis lets entries go by trimming from the head (``XTRIM``, ``XADD MAXLEN``), deleting one
(``XDEL``), deleting the key, or losing its data. What a completed checkpoint covers may go (the
consumer group's id says how far); anything after it may not: a read that went on would skip
it and commit output without it. Each read checks what it can know, in one round trip
(:func:`losses`):

1. the entry that followed its anchor, when the read that wrote the anchor saw one, must
   still come first;
2. what followed the group's acknowledged id when a commit set it (:class:`Acknowledged`):
   that entry must still be there, or, when none had followed, no entry added since may be
   gone once the head passed the group's id;
3. for an anchor at the stream's end (no next entry seen), the same from the anchor's own
   count of entries ever added, when no commit passed the anchor (none could trim past it
   legitimately);
4. no entry after both the anchor and the group's id was deleted (``XDEL``);
5. the stream was not deleted and created again since (its count of entries went down);
6. every anchor an earlier read left within the range names the entry now at its offset.

Counts and deletions need Redis 7 (``entries-added``, ``max-deleted-entry-id``); before it,
checks 1, 2 (its first half) and 6 still hold.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import redis

from sparkpoint.connectors.redis_positions import (
    Acknowledged,
    Anchor,
    EntryId,
    as_str,
    format_entry_id,
    parse_entry_id,
)

Entries = list[tuple[bytes, Any]]


class StreamInfo(NamedTuple):
    """What ``XINFO STREAM`` says of a stream: its first entry (None: empty), its length, how
    many entries it was ever given and the highest id ``XDEL`` removed (Redis 7+, else None)."""

    head: EntryId | None
    length: int
    added: int | None
    max_deleted: EntryId | None

    @classmethod
    def of(cls, info: dict[str, Any]) -> StreamInfo:
        first = info.get("first-entry")
        added = info.get("entries-added")
        deleted = info.get("max-deleted-entry-id")
        return cls(
            None if first is None else parse_entry_id(as_str(first[0]), "entry id"),
            int(info["length"]),
            None if added is None else int(added),
            None if deleted is None else parse_entry_id(as_str(deleted), "entry id"),
        )

    def removed_since(self, added_then: int) -> int:
        """Entries added after the stream had been given ``added_then`` that are gone, once
        its head passed the entry they came after (every entry left came after it)."""
        return (self.added or 0) - added_then - self.length


class Loss(NamedTuple):
    """What left the stream, and what the user can do (None: trim only what the group
    acknowledged)."""

    what: str
    advice: str | None = None


def read_state(
    client: redis.Redis, stream: str, acknowledged_key: str, anchors_key: str, within: range
) -> tuple[Acknowledged | None, StreamInfo | None, list[Anchor]]:
    """In one transaction: what the group acknowledged, the stream's :class:`StreamInfo`
    (None: no such stream) and the anchors at offsets ``within`` (check 6)."""
    pipe = client.pipeline(transaction=True)
    pipe.get(acknowledged_key)
    pipe.xinfo_stream(stream)
    pipe.zrangebyscore(anchors_key, within.start, within.stop - 1)
    raw, info, members = pipe.execute(raise_on_error=False)
    for result in (raw, members):
        if isinstance(result, Exception):
            raise result
    stream_info = None
    if not isinstance(info, Exception):
        stream_info = StreamInfo.of(info)
    elif "no such key" not in str(info).lower():
        raise info
    acked = None if raw is None else Acknowledged.parse(raw)
    return acked, stream_info, [Anchor.parse(m) for m in cast("list[bytes]", members)]


def losses(
    anchor: Anchor,
    entries: Entries,
    acked: Acknowledged | None,
    info: StreamInfo | None,
    within: list[Anchor],
) -> Loss | None:
    """The first of checks 1-6 (see the module's docstring) that finds a loss, for
    ``entries`` read after ``anchor``; None when none does."""
    at = f"entry {format_entry_id(anchor.entry_id)} (offset {anchor.offset})"
    first = parse_entry_id(as_str(entries[0][0]), "entry id") if entries else None
    # Check 1
    if anchor.following is not None and (first is None or first > anchor.following):
        return Loss(
            f"entry {format_entry_id(anchor.following)}, the next after {at}, left the "
            "stream before the job read it"
        )
    if info is not None:
        found = _lost_since(anchor, acked, info, at)
        if found is not None:
            return found
    # Check 6
    for known in within:
        now = parse_entry_id(as_str(entries[known.offset - anchor.offset - 1][0]), "entry id")
        if now != known.entry_id:
            return Loss(
                f"entry {format_entry_id(known.entry_id)} was the last before offset "
                f"{known.offset} when the job read it, and is now {format_entry_id(now)}: "
                f"entries after offset {anchor.offset} left the stream before the job read "
                "them again",
                "a restore needs every entry after its checkpoint's position: restore a "
                "checkpoint the consumer group had not passed when the stream was trimmed",
            )
    return None


def _lost_since(
    anchor: Anchor, acked: Acknowledged | None, info: StreamInfo, at: str
) -> Loss | None:
    """Checks 2-5."""
    # Check 5
    counts = [n for n in (anchor.added, acked.added if acked else None) if n is not None]
    if info.added is not None and counts and info.added < max(counts):
        return Loss(
            f"the stream was deleted and created again since the job read it (it had been "
            f"given {max(counts)} entries, now {info.added}): entries after {at} went with it",
            "the job cannot find its position in the new stream: start it without this checkpoint",
        )
    if acked is not None:
        group = f"the consumer group's acknowledged entry {format_entry_id(acked.entry_id)}"
        # Check 2
        if acked.following is not None:
            if info.head is None or info.head > acked.following:
                return Loss(
                    f"entry {format_entry_id(acked.following)}, the next after {group}, left "
                    "the stream before the job read it"
                )
        elif acked.added is not None and (info.head is None or info.head > acked.entry_id):
            lost = info.removed_since(acked.added)
            if lost > 0:
                return Loss(
                    f"{lost} entries added after {group} left the stream before the job read them"
                )
    # Check 3: no commit passed the anchor, so nothing after it could go legitimately.
    unpassed = acked is None or acked.entry_id <= anchor.entry_id
    gone = info.head is None or info.head > anchor.entry_id
    if anchor.added is not None and unpassed and gone:
        lost = info.removed_since(anchor.added)
        if lost > 0:
            return Loss(f"{lost} entries added after {at} left the stream before the job read them")
    # Check 4
    read = max(anchor.entry_id, acked.entry_id if acked is not None else anchor.entry_id)
    if info.max_deleted is not None and info.max_deleted > read:
        return Loss(
            f"entry {format_entry_id(info.max_deleted)}, after {at}, was deleted (XDEL) "
            "before the job read it"
        )
    return None


def record_acknowledged(client: redis.Redis, stream: str, key: str, acked: EntryId) -> None:
    """Keep at ``key`` what follows a consumer group's id ``acked`` (:class:`Acknowledged`):
    the stream's next entry, else (Redis 7+) how many entries it had been given, both read in
    one transaction. Written before the group moves: a record ahead of the group is safe (it
    allows less trimming), one behind it would refuse a trim the group allows."""
    pipe = client.pipeline(transaction=True)
    pipe.xrange(stream, f"({format_entry_id(acked)}", "+", count=1)
    pipe.xinfo_stream(stream)
    after, info = pipe.execute()
    if after:
        record = Acknowledged(acked, following=parse_entry_id(as_str(after[0][0]), "id"))
    else:
        record = Acknowledged(acked, added=StreamInfo.of(info).added)
    client.set(key, record.text())
