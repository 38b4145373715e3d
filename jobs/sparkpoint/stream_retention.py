"""What may leave a Redis stream: the entries every consumer group has acknowledged.

Delivery is at-least-once, so an entry that a group has not acknowledged (pending) or not yet
read (after the group's last-delivered id) must stay. :func:`trim_acknowledged` removes what
comes before both; :func:`consumption` tells whether a group has acknowledged everything (a
finished job's command stream may then be deleted). Both read the group's state first and
trim after: reads and acknowledgements in between only move that state forward, so the bound
read stays safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis


@dataclass(frozen=True, order=True)
class StreamId:
    """A stream entry id, ``<milliseconds>-<sequence>``, ordered as Redis orders them."""

    ms: int
    seq: int

    @classmethod
    def parse(cls, raw: bytes | str) -> StreamId:
        text = raw.decode() if isinstance(raw, bytes) else raw
        ms, _, seq = text.partition("-")
        return cls(int(ms), int(seq or 0))

    def next(self) -> StreamId:
        """The smallest id after this one."""
        return StreamId(self.ms, self.seq + 1)

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


@dataclass(frozen=True)
class Consumption:
    """How far the consumer groups of a stream got (:func:`consumption`)."""

    groups: int  # how many consumer groups read the stream
    length: int  # entries in the stream
    last_entry: StreamId  # the newest id ever added (0-0 for a new stream)
    safe_bound: StreamId | None  # every entry below it was acknowledged by every group

    @property
    def all_acknowledged(self) -> bool:
        """At least one group, and every group read and acknowledged every entry."""
        return self.groups > 0 and self.safe_bound is not None and self.safe_bound > self.last_entry


def consumption(client: redis.Redis, stream: str) -> Consumption | None:
    """The stream's consumer groups' progress, or None when the stream does not exist.

    ``safe_bound`` is the smallest of, over the groups, the oldest pending entry and the entry
    after the last delivered one; None when no group reads the stream (nothing is known to be
    read).
    """
    try:
        info = client.xinfo_stream(stream)
        groups = client.xinfo_groups(stream)
    except redis.ResponseError as err:
        if "no such key" in str(err).lower():
            return None
        raise
    bound: StreamId | None = None
    for group in groups:
        group_bound = StreamId.parse(group["last-delivered-id"]).next()
        if int(group["pending"]):
            oldest = client.xpending(stream, group["name"])["min"]
            if oldest is not None:
                group_bound = min(group_bound, StreamId.parse(oldest))
        bound = group_bound if bound is None else min(bound, group_bound)
    return Consumption(
        groups=len(groups),
        length=int(info["length"]),
        last_entry=StreamId.parse(info["last-generated-id"]),
        safe_bound=bound,
    )


def trim_acknowledged(client: redis.Redis, stream: str) -> int:
    """Remove the entries that every consumer group of ``stream`` has acknowledged.

    A stream that no group reads is left as it is.

    Returns:
        How many entries were removed.

    Raises:
        redis.RedisError: Redis failed.
    """
    state = consumption(client, stream)
    if state is None or state.safe_bound is None:
        return 0
    return int(client.xtrim(stream, minid=str(state.safe_bound), approximate=False))
