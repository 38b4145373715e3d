"""Replayed events: each sender's sequence numbers only go up (``sparkpoint.signing``).

The consumer has checked every event's signature; a valid signature on a copy of an old event
is still not a new event. Each (job, sender) keeps the highest ``seq`` applied and the stream
entry that carried it, in the transaction of the events' effect, so a restart of the control
plane still knows them. An event whose ``seq`` is not above that is either the same entry read
again (the consumer crashed before acknowledging it: already applied, skipped) or a re-sent
copy in a later entry (a replay: dead-lettered).
"""

from __future__ import annotations

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from sparkpoint.transport import ReceivedMessage
from sparkpoint_server.ingest.consumer import RejectedEvent
from sparkpoint_server.storage.models import EventSender


def screen(
    session: Session, messages: list[ReceivedMessage]
) -> tuple[list[ReceivedMessage], list[RejectedEvent]]:
    """The events to apply, in order, and the replays to dead-letter.

    Steps: (1) load the senders of the batch, (2) sort each event into new (its ``seq`` above
    the sender's last: recorded in the session), redelivered (skipped: neither applied nor
    refused, so the consumer acknowledges it) or replayed (refused). Unsigned events (an
    ingest without verification: tests) are applied as they are.
    """
    # Step 1
    keys = {(m.envelope.job_id, m.envelope.sender) for m in messages if m.envelope.sender}
    rows: dict[tuple[str, str], EventSender] = {}
    if keys:
        found = session.scalars(
            select(EventSender).where(tuple_(EventSender.job_id, EventSender.sender).in_(keys))
        )
        rows = {(row.job_id, row.sender): row for row in found}
    # Step 2
    fresh: list[ReceivedMessage] = []
    replays: list[RejectedEvent] = []
    for m in messages:
        env = m.envelope
        if env.sender is None or env.seq is None:
            fresh.append(m)
            continue
        row = rows.get((env.job_id, env.sender))
        if row is None:
            row = EventSender(job_id=env.job_id, sender=env.sender, last_seq=0, last_entry_id="0-0")
            session.add(row)
            rows[(env.job_id, env.sender)] = row
        if env.seq > row.last_seq:
            row.last_seq, row.last_entry_id = env.seq, m.entry_id
            fresh.append(m)
        elif _entry_key(m.entry_id) > _entry_key(row.last_entry_id):
            replays.append(
                RejectedEvent(
                    m.entry_id,
                    f"replayed {env.type} event of job {env.job_id}: seq {env.seq} of sender "
                    f"{env.sender} is not above the last applied, {row.last_seq} "
                    f"(entry {row.last_entry_id})",
                )
            )
    return fresh, replays


def _entry_key(entry_id: str) -> tuple[int, int]:
    millis, _, seq = entry_id.partition("-")
    try:
        return int(millis), int(seq or 0)
    except ValueError:
        return (0, 0)
