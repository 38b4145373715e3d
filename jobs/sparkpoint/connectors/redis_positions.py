"""Positions in a Redis stream: entry ids, and the anchors that tie a split's offsets to them.

An anchor is stored as a member of the split's sorted set (score: its offset), e.g.
``120:1700000000000-3:next=1700000000000-4``; what a consumer group acknowledged, as
``1700000000000-3:next=1700000000000-4`` or ``1700000000000-3:added=512``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, cast

import redis

from sparkpoint.errors import ConfigurationError

ENTRY_ID_PATTERN = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_SEQ = 2**64 - 1


def as_str(value: bytes | str) -> str:
    """A Redis reply as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


EntryId = tuple[int, int]


def parse_entry_id(text: str, what: str, *, open_seq: int = 0) -> EntryId:
    """``"<ms>-<seq>"`` (or ``"<ms>"``, whose sequence is ``open_seq``) as a comparable pair.

    Raises:
        ConfigurationError: ``text`` is not an entry id (``what`` names the option).
    """
    match = ENTRY_ID_PATTERN.match(text.strip())
    if match is None:
        raise ConfigurationError(
            f"{what} must be a Redis entry id like 1700000000000-0, not {text!r}"
        )
    ms, seq = match.groups()
    return int(ms), int(seq) if seq is not None else open_seq


def format_entry_id(entry_id: EntryId) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


class Anchor(NamedTuple):
    """Where an offset of a split is in the stream: ``entry_id``, the split's last entry
    before ``offset``, and ``following``, the split's next entry when the read that ended
    there saw one (a later read from the anchor checks that it is still there)."""

    offset: int
    entry_id: EntryId
    following: EntryId | None = None

    def member(self) -> str:
        """The anchor as a member of the split's sorted set (its score is the offset)."""
        text = f"{self.offset}:{format_entry_id(self.entry_id)}"
        if self.following is not None:
            text += f":next={format_entry_id(self.following)}"
        return text

    @classmethod
    def parse(cls, member: bytes | str) -> Anchor:
        offset, entry, *rest = as_str(member).split(":")
        following = dict(part.partition("=")[::2] for part in rest).get("next")
        return cls(
            int(offset),
            parse_entry_id(entry, "anchor"),
            None if following is None else parse_entry_id(following, "anchor"),
        )


class Acknowledged(NamedTuple):
    """What a consumer group acknowledged in a stream: up to ``entry_id``, and what came after
    it when it was set: the stream's next entry (``following``), or, when there was none yet,
    how many entries the stream had ever been given (``added``, Redis 7+). Every entry after
    ``entry_id`` must stay until the group moves past it: trimmed, it is lost to the job."""

    entry_id: EntryId
    following: EntryId | None = None
    added: int | None = None

    def text(self) -> str:
        parts = [format_entry_id(self.entry_id)]
        if self.following is not None:
            parts.append(f"next={format_entry_id(self.following)}")
        if self.added is not None:
            parts.append(f"added={self.added}")
        return ":".join(parts)

    @classmethod
    def parse(cls, raw: bytes | str) -> Acknowledged:
        entry, *rest = as_str(raw).split(":")
        extra = dict(part.partition("=")[::2] for part in rest)
        following = extra.get("next")
        return cls(
            parse_entry_id(entry, "acknowledged id"),
            None if following is None else parse_entry_id(following, "acknowledged id"),
            None if "added" not in extra else int(extra["added"]),
        )


def record_acknowledged(client: redis.Redis, stream: str, key: str, acked: EntryId) -> None:
    """Keep at ``key`` what follows a consumer group's new id ``acked`` (:class:`Acknowledged`):
    the stream's next entry, else (Redis 7+) how many entries it had been given, counted after
    looking for the next entry, so that an entry added in between only makes the count larger.
    """
    after = cast(
        "list[tuple[bytes, Any]]",
        client.xrange(stream, f"({format_entry_id(acked)}", "+", count=1),
    )
    if after:
        record = Acknowledged(acked, following=parse_entry_id(as_str(after[0][0]), "id"))
    else:
        added = client.xinfo_stream(stream).get("entries-added")
        record = Acknowledged(acked, added=None if added is None else int(added))
    client.set(key, record.text())


def loss_past_acknowledged(client: redis.Redis, stream: str, key: str) -> str | None:
    """What left ``stream`` after the group's acknowledged id (kept at ``key`` by
    :func:`record_acknowledged`), or None: the entry that followed that id must still be
    there; when none followed, no entry added since may be gone once the group's own entry
    is (Redis 7's count of entries ever added tells). None too before a first commit."""
    pipe = client.pipeline(transaction=True)
    pipe.get(key)
    pipe.xinfo_stream(stream)
    try:
        raw, info = pipe.execute()
    except redis.ResponseError:  # no such stream: nothing to read either
        return None
    if raw is None:
        return None
    acked = Acknowledged.parse(raw)
    head = info.get("first-entry")
    head_id = None if head is None else parse_entry_id(as_str(head[0]), "entry id")
    after = f"the consumer group's acknowledged entry {format_entry_id(acked.entry_id)}"
    if acked.following is not None:
        if head_id is None or head_id > acked.following:
            return (
                f"entry {format_entry_id(acked.following)}, the next after {after}, left the "
                "stream before the job read it"
            )
    elif acked.added is not None and (head_id is None or head_id > acked.entry_id):
        lost = int(info["entries-added"]) - acked.added - int(info["length"])
        if lost > 0:
            return f"{lost} entries added after {after} left the stream before the job read them"
    return None


def loss_after_anchor(anchor: Anchor, entries: list[tuple[bytes, Any]]) -> str | None:
    """What left the stream when ``entries``, read after ``anchor``, do not begin with the
    entry that followed it (a read that saw it); None when they do, or nothing is known."""
    if anchor.following is None:
        return None
    first = parse_entry_id(as_str(entries[0][0]), "entry id") if entries else None
    if first is not None and first <= anchor.following:
        return None
    return (
        f"entry {format_entry_id(anchor.following)}, the next after entry "
        f"{format_entry_id(anchor.entry_id)} (offset {anchor.offset}), left the stream "
        "before the job read it"
    )


def loss_within(anchors: list[Anchor], start: int, entries: list[tuple[bytes, Any]]) -> str | None:
    """What left the stream when an anchor that an earlier read left among ``entries`` (read
    from offset ``start``) names another entry than the one now at its offset: entries before
    it were removed since (a restore to a position older than what was trimmed)."""
    for anchor in anchors:
        now = parse_entry_id(as_str(entries[anchor.offset - start - 1][0]), "entry id")
        if now != anchor.entry_id:
            return (
                f"entry {format_entry_id(anchor.entry_id)} was the last before offset "
                f"{anchor.offset} when the job read it, and is now {format_entry_id(now)}: "
                f"entries after offset {start} left the stream before the job read them again"
            )
    return None
