"""Replayed events: each sender's sequence numbers only go up (``sparkpoint.signing``).

The consumer has checked every event's signature; a valid signature on a copy of an old event
is still not a new event. Each (job, sender) keeps the highest ``seq`` applied and the stream
entry that carried it, in the transaction of the events' effect, so a restart of the control
plane still knows them. An event whose ``seq`` is not above that is either the same entry read
again (the consumer crashed before acknowledging it: already applied, skipped) or a re-sent
copy in a later entry (a replay: dead-lettered).
"""

from __future__ import annotations

from sqlalchemy import select
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
        # Two plain IN lists (a (job, sender) tuple per key would build a statement object per
        # key on every batch); a row of another pair is skipped below.
        found = session.scalars(
            select(EventSender).where(
                EventSender.job_id.in_({job for job, _ in keys}),
                EventSender.sender.in_({sender for _, sender in keys}),
            )
        )
        rows = {key: row for row in found if (key := (row.job_id, row.sender)) in keys}
    # Step 2: the highest seq per sender, and its entry, kept here and written to the rows
    # once per batch (an ORM attribute set per event costs more than the check itself).
    last = {key: (row.last_seq, row.last_entry_id) for key, row in rows.items()}
    fresh: list[ReceivedMessage] = []
    replays: list[RejectedEvent] = []
    for m in messages:
        env = m.envelope
        if env.sender is None or env.seq is None:
            fresh.append(m)
            continue
        key = (env.job_id, env.sender)
        last_seq, last_entry_id = last.get(key, (0, "0-0"))
        if env.seq > last_seq:
            last[key] = (env.seq, m.entry_id)
            fresh.append(m)
        elif _entry_key(m.entry_id) > _entry_key(last_entry_id):
            replays.append(
                RejectedEvent(
                    m.entry_id,
                    f"replayed {env.type} event of job {env.job_id}: seq {env.seq} of sender "
                    f"{env.sender} is not above the last applied, {last_seq} "
                    f"(entry {last_entry_id})",
                )
            )
    for key, (last_seq, last_entry_id) in last.items():
        row = rows.get(key)
        if row is None:
            session.add(
                EventSender(
                    job_id=key[0], sender=key[1], last_seq=last_seq, last_entry_id=last_entry_id
                )
            )
        elif row.last_seq != last_seq:
            row.last_seq, row.last_entry_id = last_seq, last_entry_id
    return fresh, replays


def _entry_key(entry_id: str) -> tuple[int, int]:
    millis, _, seq = entry_id.partition("-")
    try:
        return int(millis), int(seq or 0)
    except ValueError:
        return (0, 0)
