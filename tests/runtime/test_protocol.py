"""The wire protocol: round trips, and bad messages refused with a reason, never a crash."""

from __future__ import annotations

import json

import pytest

from sparkpoint import protocol as p


def _ack_envelope() -> p.Envelope:
    ack = p.SnapshotCompleted(
        checkpoint_id=4127,
        operator_id="pv",
        subtask=1,
        epoch=9,
        ack_timestamp=5,
        start_delay_ms=1.5,
        alignment_duration_ms=2,
        alignment_buffered_bytes=10,
        sync_duration_ms=0.3,
        async_duration_ms=4,
        state_size=100,
        checkpointed_size=100,
        handles=[
            p.StateHandleModel(
                path="file:///c/chk-4127/pv-1",
                size=100,
                checksum="sha256:ab",
                key_group_start=64,
                key_group_end=127,
            )
        ],
    )
    return p.envelope("job-1", 3, 1_700_000_000_000, ack)


def test_round_trip_keeps_every_field() -> None:
    env = _ack_envelope()
    decoded_env, payload = p.decode(p.encode(env))
    assert decoded_env == env
    assert isinstance(payload, p.SnapshotCompleted)
    assert payload.handles[0].key_group_end == 127
    assert decoded_env.attempt == 3 and decoded_env.type == "snapshot_completed"


def test_unknown_fields_are_ignored() -> None:
    raw = json.loads(p.encode(_ack_envelope()))
    raw["payload"]["added_in_a_later_version"] = 1
    raw["also_new"] = True
    _, payload = p.decode(raw)
    assert isinstance(payload, p.SnapshotCompleted)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "malformed message"),
        (b'{"type": "heartbeat"}', "malformed message: job_id: Field required"),
        (
            b'{"type": "teleport", "job_id": "j", "attempt": 1, "timestamp": 1, "payload": {}}',
            "unknown message type 'teleport' (job j)",
        ),
        (
            b'{"type": "checkpoint_declined", "job_id": "j", "attempt": 1, "timestamp": 1,'
            b' "payload": {"checkpoint_id": 0, "operator_id": "pv", "subtask": 0, "reason": "x"}}',
            "invalid checkpoint_declined payload for job j: checkpoint_id: Input should be",
        ),
        (
            b'{"v": 99, "type": "heartbeat", "job_id": "j", "attempt": 1, "timestamp": 1,'
            b' "payload": {}}',
            "schema version 99 is newer than 1",
        ),
    ],
)
def test_bad_messages_raise_protocol_error_naming_the_problem(raw: bytes, message: str) -> None:
    with pytest.raises(p.ProtocolError) as err:
        p.decode(raw)
    assert message in str(err.value)


def test_messages_above_the_size_limit_are_refused() -> None:
    with pytest.raises(
        p.ProtocolError,
        match=r"snapshot_completed message of job job-1 is \d+ "
        r"bytes, above the 100-byte limit",
    ):
        p.encode(_ack_envelope(), max_bytes=100)


def test_every_payload_type_is_registered_once() -> None:
    names = [cls.model_fields["type"].default for cls in p.PAYLOAD_TYPES.values()]
    assert len(names) == len(set(names)) == 24


def test_driver_heartbeats_and_registrations_of_older_drivers_decode() -> None:
    beat = p.DriverHeartbeat(incarnation="abc", host_time=7)
    assert p.decode(p.encode(p.envelope("job-1", 3, 5, beat)))[1] == beat
    older = {  # a driver from before heartbeats: no interval, no previous failure
        "type": "job_registered",
        "job_id": "job-1",
        "attempt": 0,
        "timestamp": 5,
        "payload": {"job_name": "pv", "vertices": [], "edges": [], "config": {}},
    }
    _, registered = p.decode(older)
    assert isinstance(registered, p.JobRegistered)
    assert (registered.heartbeat_interval_ms, registered.previous_failure) == (None, None)


def test_job_status_names_the_spark_application_and_older_events_stay_valid() -> None:
    running = p.JobStatusChanged(
        status=p.JobStatus.RUNNING,
        previous=p.JobStatus.CREATED,
        spark_ui_url="http://driver-1:4040",
        spark_application_id="app-20231114221320-0007",
    )
    _, decoded = p.decode(p.encode(p.envelope("job-1", 1, 5, running)))
    assert decoded == running
    older = {  # a driver from before the Spark application was reported
        "type": "job_status",
        "job_id": "job-1",
        "attempt": 1,
        "timestamp": 5,
        "payload": {"status": "RUNNING", "previous": "CREATED", "cause": None},
    }
    _, decoded = p.decode(older)
    assert isinstance(decoded, p.JobStatusChanged)
    assert (decoded.status, decoded.spark_ui_url, decoded.spark_application_id) == (
        p.JobStatus.RUNNING,
        None,
        None,
    )


def test_the_spark_job_group_names_the_job_its_attempt_and_the_epoch() -> None:
    assert p.spark_job_group("pv-count", 2, 17) == "sparkpoint-pv-count-a2-e17"


def _registration(vertices: int, parallelism: int) -> bytes:
    graph = p.JobRegistered(
        job_name="big",
        vertices=[
            p.VertexModel(id=f"v{i}", name=f"v{i}", parallelism=1, operators=[f"v{i}"])
            for i in range(2)
        ],
        edges=[],
        config={},
    )
    env = p.envelope("job-1", 0, 1_700_000_000_000, graph)
    raw = json.loads(env.model_dump_json())
    raw["payload"]["vertices"] = [
        {"id": f"v{i}", "name": f"v{i}", "parallelism": parallelism, "operators": [f"v{i}"]}
        for i in range(vertices)
    ]
    return json.dumps(raw).encode()


def test_a_registration_of_a_graph_too_large_to_track_is_refused() -> None:
    """A few hundred bytes must not make the control plane track millions of subtasks."""
    _, graph = p.decode(_registration(4, 25_000))  # 100,000 subtasks: the limit
    assert isinstance(graph, p.JobRegistered) and len(graph.vertices) == 4
    with pytest.raises(p.ProtocolError, match=r"100004 subtasks .* at most 100000"):
        p.decode(_registration(4, 25_001))
    with pytest.raises(p.ProtocolError, match="1001 vertices; at most 1000"):
        p.decode(_registration(1_001, 1))


def test_a_registration_whose_configuration_holds_an_integer_past_64_bits_is_refused() -> None:
    """The control plane stores the configuration as JSON in the database: a number it cannot
    hold must be refused at the door, not fail the ingest's handler (found by the fuzz test)."""
    raw = json.loads(_registration(1, 1))
    raw["payload"]["config"] = {"job_options": {"limits": [1, 2**63 - 1, {"x": 2**64}]}}
    with pytest.raises(p.ProtocolError, match=r"config.job_options.limits\[2\].x is an integer"):
        p.decode(json.dumps(raw).encode())
    raw["payload"]["config"] = {"job_options": {"limits": [-(2**63), 2**63 - 1, True]}}
    _, registered = p.decode(json.dumps(raw).encode())
    assert isinstance(registered, p.JobRegistered)


def test_checkpoint_settings_past_64_bits_are_left_to_the_control_plane_which_says_why() -> None:
    """interval_ms, retained, ...: the control plane refuses them naming the bound (a refusal
    the job hears), so decoding lets them through."""
    raw = json.loads(_registration(1, 1))
    raw["payload"]["config"] = {"interval_ms": 10**29, "retained": 2**70}
    _, registered = p.decode(json.dumps(raw).encode())
    assert isinstance(registered, p.JobRegistered)
    assert registered.config["interval_ms"] == 10**29
