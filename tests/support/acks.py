"""Acknowledgements for tests that need one but not its timings or sizes."""

from __future__ import annotations

from typing import Any

from sparkpoint import protocol as p


def bare_ack(
    checkpoint_id: int, operator_id: str = "pv", subtask: int = 0, epoch: int = 0, **fields: Any
) -> p.SnapshotCompleted:
    """``snapshot_completed`` with every timing and size 0, and ``fields`` on top."""
    zero = dict.fromkeys(
        (
            "ack_timestamp",
            "start_delay_ms",
            "alignment_duration_ms",
            "alignment_buffered_bytes",
            "sync_duration_ms",
            "async_duration_ms",
            "state_size",
            "checkpointed_size",
        ),
        0,
    )
    return p.SnapshotCompleted(
        checkpoint_id=checkpoint_id,
        operator_id=operator_id,
        subtask=subtask,
        epoch=epoch,
        **{**zero, **fields},
    )
