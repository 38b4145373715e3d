"""Positions in a Redis stream: entry ids, and the anchors that tie a split's offsets to them.

Entries are counted by id (:func:`ids_after`). An anchor is stored as a member of the
split's sorted set (score: its offset), e.g.
``120:1700000000000-3:next=1700000000000-4`` or ``120:1700000000000-3:added=512``; what a
consumer group acknowledged, as ``1700000000000-3:next=1700000000000-4`` or
``1700000000000-3:added=512``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, cast

from sparkpoint.errors import ConfigurationError
from sparkpoint.redis_connection import shared_client

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


Mark = tuple[EntryId, EntryId | None, int | None]


def encode_mark(entry_id: EntryId, following: EntryId | None, added: int | None) -> str:
    """An entry id and what was seen after it: ``<id>[:next=<id>][:added=<n>]``."""
    parts = [format_entry_id(entry_id)]
    if following is not None:
        parts.append(f"next={format_entry_id(following)}")
    if added is not None:
        parts.append(f"added={added}")
    return ":".join(parts)


def decode_mark(text: str, what: str) -> Mark:
    """:func:`encode_mark`'s text as (entry id, following, added)."""
    entry, *rest = text.split(":")
    extra = dict(part.partition("=")[::2] for part in rest)
    following = extra.get("next")
    return (
        parse_entry_id(entry, what),
        None if following is None else parse_entry_id(following, what),
        None if "added" not in extra else int(extra["added"]),
    )


class Anchor(NamedTuple):
    """Where an offset of a split is in the stream: ``entry_id``, the split's last entry
    before ``offset``; and what the read that ended there saw after it, for later reads to
    check that no unread entry left (:mod:`sparkpoint.connectors.redis_losses`):
    ``following``, the split's next entry, or, when there was none yet, ``added``, how many
    entries the stream had ever been given (Redis 7+)."""

    offset: int
    entry_id: EntryId
    following: EntryId | None = None
    added: int | None = None

    def member(self) -> str:
        """The anchor as a member of the split's sorted set (its score is the offset)."""
        return f"{self.offset}:{encode_mark(self.entry_id, self.following, self.added)}"

    @classmethod
    def parse(cls, member: bytes | str) -> Anchor:
        offset, _, mark = as_str(member).partition(":")
        return cls(int(offset), *decode_mark(mark, "anchor"))


class Acknowledged(NamedTuple):
    """What a consumer group acknowledged in a stream: up to ``entry_id``, and what came after
    it when it was set: the stream's next entry (``following``), or, when there was none yet,
    how many entries the stream had ever been given (``added``, Redis 7+). Every entry after
    ``entry_id`` must stay until the group moves past it: trimmed, it is lost to the job."""

    entry_id: EntryId
    following: EntryId | None = None
    added: int | None = None

    def text(self) -> str:
        return encode_mark(self.entry_id, self.following, self.added)

    @classmethod
    def parse(cls, raw: bytes | str) -> Acknowledged:
        return cls(*decode_mark(as_str(raw), "acknowledged id"))


_SCRIPTS: dict[str, Any] = {}
# XRANGE on the server, returning only the ids: counting moves no field over the network.
_IDS_AFTER = """
local page = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])
local ids = {}
for i, entry in ipairs(page) do ids[i] = entry[1] end
return ids
"""


def ids_after(url: str, stream: str, start: str, end: str, count: int) -> list[bytes]:
    """``XRANGE stream start end COUNT count``, ids only."""
    script = _SCRIPTS.get(url)
    if script is None:
        script = _SCRIPTS[url] = shared_client(url).register_script(_IDS_AFTER)
    return cast("list[bytes]", script(keys=[stream], args=[start, end, count]))
