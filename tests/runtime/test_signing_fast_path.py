"""``sparkpoint.signing.verify`` checks a signature on orjson's bytes first: its verdict is
always the one the canonical bytes alone give (``_canonical_verdict``), on every envelope:
authentic, forged, or written differently by orjson and json.dumps."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint import protocol as p
from sparkpoint.signing import Signer, signature, signed_as_written, verify

KEY = b"k" * 32
JOB = "job-1"

# JSON values as a job's payload may hold them: every float (also those orjson writes unlike
# json.dumps, 1e-05, and NaN), ints beyond 64 bits, any text (control characters, surrogates).
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _signed(payload: dict[str, Any], key: bytes = KEY) -> p.Envelope:
    envelope = p.Envelope(type="heartbeat", job_id=JOB, attempt=1, timestamp=5, payload=payload)
    return Signer(lambda _: key, "driver-1").sign([envelope])[0]


def _canonical_verdict(key: bytes, envelope: p.Envelope) -> str | None:
    """The verdict on the canonical bytes alone (what verify gave before its fast path)."""
    if envelope.sig is None or envelope.sender is None or envelope.seq is None:
        return "unsigned (no sig, sender or seq)"
    return None if envelope.sig == signature(key, envelope) else "bad signature"


def _outcome(check: Any, key: bytes, envelope: p.Envelope) -> tuple[str, str | None]:
    try:
        return "verdict", check(key, envelope)
    except Exception as err:  # the canonical encoding fails (a lone surrogate), whatever way
        return "raised", type(err).__name__


@settings(max_examples=400, deadline=None)
@given(payload=st.dictionaries(st.text(), _json, max_size=6))
def test_the_verdict_is_the_canonical_bytes_for_authentic_and_tampered_envelopes(
    payload: dict[str, Any],
) -> None:
    try:
        envelope = _signed(payload)
    except ValueError:  # a lone surrogate: no job can sign it; a copy with another's sig
        envelope = _signed({}).model_copy(update={"payload": payload})
    for key in (KEY, b"x" * 32):
        assert _outcome(verify, key, envelope) == _outcome(_canonical_verdict, key, envelope)
    tampered = envelope.model_copy(update={"payload": {**payload, "extra": 1}})
    assert _outcome(verify, KEY, tampered) == _outcome(_canonical_verdict, KEY, tampered)


def test_the_events_of_a_checkpoint_verify_on_orjsons_bytes() -> None:
    """What jobs send (bounded ints, durations, texts, handles) is written by orjson as the
    canonical encoding writes it: the fast check alone finds it authentic."""
    handle = p.StateHandleModel(path="file:///c/j/chk-3/state", size=4096, checksum="crc32:1")
    payloads: list[Any] = [
        p.BarrierReceived(checkpoint_id=3, operator_id="pv", subtask=1, channel=0, timestamp=9),
        p.AlignmentCompleted(
            checkpoint_id=3,
            operator_id="pv",
            subtask=1,
            duration_ms=3.25,
            buffered_bytes=1024,
            buffered_records=10,
        ),
        p.SnapshotCompleted(
            checkpoint_id=3,
            operator_id="pv",
            subtask=1,
            epoch=3,
            ack_timestamp=1_700_000_000_000,
            start_delay_ms=0.5,
            alignment_duration_ms=3.0,
            alignment_buffered_bytes=0,
            sync_duration_ms=2.0,
            async_duration_ms=41.75,
            state_size=4096,
            checkpointed_size=4096,
            handles=[handle],
            sink_transactions=[p.SinkTransactionModel(transaction_id="3-1", parts=["part-1"])],
        ),
        p.TaskFailed(epoch=3, cause="ValueError: \u00e9t\u00e9\n\ttraceback", operator_id="pv"),
    ]
    signer = Signer(lambda _: KEY, "driver-1")
    for payload in payloads:
        [envelope] = signer.sign([p.envelope(JOB, 1, 1_700_000_000_000, payload)])
        assert signed_as_written(KEY, envelope)
        assert verify(KEY, envelope) is None


def test_numbers_orjson_writes_otherwise_still_verify() -> None:
    envelope = _signed({"small": 1e-05, "tiny": 2.5e-07, "big": 1e16, "huge": 2**64})
    assert not signed_as_written(KEY, envelope)  # the canonical bytes judge it
    assert verify(KEY, envelope) is None
    assert verify(KEY, envelope.model_copy(update={"seq": 2})) == "bad signature"


def test_unsigned_envelopes_get_their_reason() -> None:
    envelope = _signed({"a": 1}).model_copy(update={"sig": None})
    assert verify(KEY, envelope) == "unsigned (no sig, sender or seq)"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_nan_where_the_signer_wrote_null_gets_the_canonical_verdict(literal: str) -> None:
    """pydantic's JSON dump, which the signer signs, writes a NaN as null, as orjson does."""
    genuine = p.encode(_signed({"x": None}))
    tampered = genuine.replace(b'"x":null', f'"x":{literal}'.encode())
    envelope = p.Envelope.model_validate_json(tampered)  # the payload check comes after
    assert verify(KEY, envelope) == _canonical_verdict(KEY, envelope)
