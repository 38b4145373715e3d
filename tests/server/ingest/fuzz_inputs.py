"""What the protocol fuzzer (``test_protocol_fuzz.py``) feeds the ingest: hostile entries and
the genuine job's checkpoint events, as hypothesis strategies, with what each must come to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from sparkpoint import protocol as p
from sparkpoint.transport import FIELD

DEAD = "dead"  # must be dead-lettered
ANY = "any"  # may be applied (without effect on the genuine job) or dead-lettered

EVENT_TYPES = sorted(cls.model_fields["type"].default for cls in p.EventPayload.__args__)
COMMAND_TYPES = sorted(cls.model_fields["type"].default for cls in p.CommandPayload.__args__)
# Valid payloads of every type, the starting points of the mutations.
ACK = {
    "checkpoint_id": 1,
    "operator_id": "source",
    "subtask": 0,
    "epoch": 1,
    "ack_timestamp": 1,
    "start_delay_ms": 1.0,
    "alignment_duration_ms": 0.0,
    "alignment_buffered_bytes": 0,
    "sync_duration_ms": 1.0,
    "async_duration_ms": 1.0,
    "state_size": 5,
    "checkpointed_size": 5,
    "handles": [{"path": "/tmp/x", "size": 5, "checksum": "sha256:00"}],
    "source_positions": {"s0": 1},
    "sink_transactions": [{"transaction_id": "t", "parts": ["a"]}],
}
TEMPLATES: dict[str, dict[str, Any]] = {
    "job_registered": {
        "job_name": "pv",
        "vertices": [{"id": "pv", "name": "pv", "parallelism": 1, "operators": ["pv"]}],
        "edges": [],
        "config": {"interval_ms": 1000},
        "incarnation": "x",
    },
    "job_status": {"status": "RUNNING", "cause": "c"},
    "checkpoint_triggered": {"checkpoint_id": 1, "trigger_timestamp": 1, "epoch": 1},
    "barrier_injected": {
        "checkpoint_id": 1,
        "operator_id": "source",
        "subtask": 0,
        "epoch": 1,
        "split_id": "s",
        "offset": 1,
        "timestamp": 1,
    },
    "barrier_received": {
        "checkpoint_id": 1,
        "operator_id": "pv",
        "subtask": 0,
        "channel": 0,
        "timestamp": 1,
    },
    "alignment_completed": {
        "checkpoint_id": 1,
        "operator_id": "pv",
        "subtask": 0,
        "duration_ms": 1.0,
        "buffered_bytes": 1,
        "buffered_records": 1,
    },
    "snapshot_completed": ACK,
    "checkpoint_declined": {
        "checkpoint_id": 1,
        "operator_id": "pv",
        "subtask": 0,
        "reason": "r",
    },
    "checkpoint_completed": {
        "checkpoint_id": 1,
        "external_path": None,
        "trigger_timestamp": 1,
        "completion_timestamp": 2,
        "end_to_end_duration_ms": 1.0,
        "state_size": 1,
    },
    "checkpoint_aborted": {"checkpoint_id": 1, "reason": "r"},
    "sink_pre_committed": {
        "checkpoint_id": 1,
        "operator_id": "pv",
        "subtask": 0,
        "transaction": {"transaction_id": "t", "parts": []},
    },
    "sink_committed": {
        "checkpoint_id": 1,
        "operator_id": "pv",
        "subtask": 0,
        "transaction_id": "t",
        "parts": 1,
    },
    "task_failed": {"epoch": 1, "cause": "boom"},
    "job_restored": {"checkpoint_id": None},
    "end_of_input": {"epoch": 1},
    "heartbeat": {
        "epoch": 1,
        "records": 1,
        "duration_ms": 1.0,
        "records_per_second": 1.0,
        "source_lag": 0,
        "host_time": 1,
    },
    "driver_heartbeat": {"incarnation": "x", "host_time": 1},
    "trigger_checkpoint": {"checkpoint_id": 1, "trigger_timestamp": 1},
    "checkpoint_complete": {"checkpoint_id": 1},
    "checkpoint_abort": {"checkpoint_id": 1, "reason": "r"},
    "restore": {"new_attempt": 2},
    "cancel": {},
    "stop_with_savepoint": {"checkpoint_id": 1, "trigger_timestamp": 1},
    "configuration_changed": {"changes": {"interval_ms": 5}},
}
assert set(TEMPLATES) == set(EVENT_TYPES) | set(COMMAND_TYPES)

# Events of the genuine job that a valid copy could change legitimately (a restart, a status,
# a final checkpoint): the mutated envelopes that decode send them to an unknown job instead.
GENUINE_UNSAFE = {"job_registered", "job_status", "task_failed", "job_restored", "end_of_input"}

# ----------------------------------------------------------------------------- strategies

NUMBERS = st.one_of(
    st.integers(),
    st.sampled_from([-1, 0, 2**31, 2**63, -(2**63) - 1, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
)
TEXTS = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", "\x00", "é\u202e\U0001f600", "a" * 300, "../../etc", "source"]),
)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, TEXTS),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXTS, inner, max_size=3)),
    max_leaves=8,
)
JOB_IDS = st.one_of(
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z"),
    st.sampled_from(["unknown-job", "x" * 64, "x" * 65, "", "bad id", "é", "-lead", "a/b"]),
    TEXTS,
    JSON_VALUES,
)
CONFIG_KEYS = [
    "mode",
    "interval_ms",
    "timeout_ms",
    "min_pause_ms",
    "max_concurrent",
    "tolerable_failures",
    "retained",
    "checkpoint_storage",
    "checkpoint_dir",
    "from_checkpoint",
    "max_parallelism",
    "state_backend",
    "restart_strategy",
]
CONFIGS = st.dictionaries(
    st.sampled_from(CONFIG_KEYS),
    st.one_of(
        JSON_VALUES,
        st.dictionaries(
            st.sampled_from(
                ["restart-strategy.type", "restart-strategy.fixed-delay.attempts", "x"]
            ),
            st.one_of(JSON_VALUES, st.sampled_from(["none", "fixed-delay", "exponential-delay"])),
        ),
    ),
    max_size=5,
)


def dumps(value: Any) -> bytes:
    """JSON as a careless writer makes it: NaN and infinities as bare tokens, any unicode."""
    return json.dumps(value, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Hostile:
    """One entry of the fuzzer; ``genuine_target``: mutated from the genuine job's id."""

    fields: dict[bytes, bytes]
    label: str
    genuine_target: bool = False


@st.composite
def mutated_envelope(draw: st.DrawFn) -> Hostile:
    kind = draw(st.sampled_from(sorted(TEMPLATES)))
    payload: dict[str, Any] = dict(TEMPLATES[kind])
    if kind == "job_registered" and draw(st.booleans()):
        payload["config"] = draw(CONFIGS)  # a new job's configuration, fuzzed
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        op = draw(st.sampled_from(["drop", "extra", "extra", "replace", "replace"]))
        if op == "drop" and payload:
            payload.pop(draw(st.sampled_from(sorted(payload))))
        elif op == "extra":
            payload[draw(TEXTS)] = draw(JSON_VALUES)
        elif payload:
            payload[draw(st.sampled_from(sorted(payload)))] = draw(JSON_VALUES)
    genuine = draw(st.booleans())
    message: dict[str, Any] = {
        "v": 1,
        "type": kind,
        "job_id": "GENUINE" if genuine else draw(JOB_IDS),
        "attempt": 1,
        "timestamp": 1,
        "payload": payload,
    }
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        key = draw(st.sampled_from(["v", "type", "job_id", "attempt", "timestamp", "payload"]))
        if draw(st.booleans()):
            message.pop(key, None)
        else:
            message[key] = draw(JSON_VALUES)
    return Hostile({FIELD: dumps(message)}, f"mutated {kind}", genuine_target=genuine)


@st.composite
def new_job(draw: st.DrawFn) -> Hostile:
    """A well-formed registration of another job with a fuzzed configuration and graph."""
    vertices = [
        {
            "id": draw(st.sampled_from(["a", "b", "source", "pv"])),
            "name": draw(TEXTS),
            "parallelism": draw(st.sampled_from([1, 2, 32768])),
            "operators": [],
        }
        for _ in range(draw(st.integers(0, 3)))
    ]
    edges = draw(st.lists(st.tuples(*[st.sampled_from(["a", "b", "zz"])] * 2), max_size=2))
    message = {
        "type": "job_registered",
        "job_id": f"new-{draw(st.integers(0, 10**6))}",
        "attempt": draw(st.sampled_from([0, 1, 5])),
        "timestamp": 1,
        "payload": {
            "job_name": draw(TEXTS),
            "vertices": vertices,
            "edges": edges,
            "config": draw(CONFIGS),
            "incarnation": draw(st.sampled_from([None, "x", "y"])),
            "heartbeat_interval_ms": draw(st.sampled_from([None, 1, 10**6])),
        },
    }
    return Hostile({FIELD: dumps(message)}, "new job")


@st.composite
def raw_entry(draw: st.DrawFn) -> Hostile:
    choice = draw(st.sampled_from(["bytes", "no field", "json", "deep", "oversize"]))
    if choice == "bytes":
        return Hostile({FIELD: draw(st.binary(max_size=64))}, "random bytes")
    if choice == "no field":
        return Hostile({b"x": draw(st.binary(max_size=8))}, "no message field")
    if choice == "json":
        return Hostile({FIELD: dumps(draw(JSON_VALUES))}, "JSON of a wrong shape")
    depth = draw(st.sampled_from([64, 1000, 100_000]))
    if choice == "deep":
        nested = "[" * depth + "]" * depth
        raw = (
            '{"v":1,"type":"heartbeat","job_id":"GENUINE","attempt":1,"timestamp":1,'
            f'"payload":{{"epoch":1,"deep":{nested}}}}}'
        )
        return Hostile({FIELD: raw.encode()}, f"nested {depth} deep", genuine_target=True)
    cause = "x" * (p.DEFAULT_MAX_MESSAGE_BYTES + draw(st.integers(0, 10)))
    raw = json.dumps(
        {"type": "task_failed", "job_id": "GENUINE", "attempt": 1, "timestamp": 1}
        | {"payload": {"epoch": 1, "cause": cause}}
    )
    return Hostile({FIELD: raw.encode()}, "oversize", genuine_target=True)


@st.composite
def checkpoint_event(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed checkpoint event of the genuine job naming something that is not its
    pending checkpoint's subtask (resolved per round by :func:`checkpoint_message`)."""
    return {
        "kind": draw(
            st.sampled_from(
                [
                    "snapshot_completed",
                    "checkpoint_declined",
                    "barrier_injected",
                    "barrier_received",
                    "alignment_completed",
                    "sink_committed",
                ]
            )
        ),
        "operator": draw(st.sampled_from(["source", "pv", "ghost", "source -> map"])),
        "subtask": draw(st.sampled_from([0, 1, 2, 7, 32767])),
        "checkpoint": draw(st.sampled_from(["pending", "previous", "next", "never"])),
        "attempt": draw(st.sampled_from([0, 1, 2, 1000])),
        "size": draw(st.sampled_from([0, 7, 2**62])),
    }


ROUND = st.fixed_dictionaries(
    {
        "hostile": st.lists(
            st.one_of(mutated_envelope(), raw_entry(), checkpoint_event(), new_job()),
            max_size=12,
        ),
        "seed": st.randoms(use_true_random=False),
        "duplicates": st.integers(0, 4),
    }
)
