"""The seeds' consistency table: each source x sink combination's end-to-end guarantee."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sparkpoint import protocol as p
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.redis_source import RedisStreamSource
from sparkpoint.connectors.sinks import FileSink, TwoPhaseCommitSink
from sparkpoint.connectors.sources import FileSource, GeneratorSource, Source
from sparkpoint.connectors.sql_sink import SqlSink
from sparkpoint.connectors.unprotected import AppendFileSink
from sparkpoint.connectors.upsert_sink import UpsertSink
from sparkpoint.connectors.wal_sink import JsonLinesWriteAheadSink
from sparkpoint.errors import ConfigurationError
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.guarantees import Guarantee, end_to_end
from sparkpoint.options import JobOptions
from sparkpoint.protocol_types import CheckpointingMode
from sparkpoint.runtime.authority import registration
from sparkpoint.runtime.driver import JobDriver


@dataclass(frozen=True)
class OnceOnlySource(GeneratorSource):
    """Stands for a source that cannot seek back without needing a Redis (the real one,
    ``RedisListSource``, runs in ``test_consistency_table_spark.py``)."""

    resettable = False


class UpsertLikeSink(FileSink):
    delivery = "idempotent"


class WalLikeSink(FileSink):
    delivery = "write_ahead_log"


SINKS: dict[str, type[TwoPhaseCommitSink]] = {
    "two_phase_commit": FileSink,
    "idempotent": UpsertLikeSink,
    "write_ahead_log": WalLikeSink,
    "none": AppendFileSink,
}

# (source resettable, sink delivery) -> (level, what the reason says or None)
TABLE = [
    (True, "two_phase_commit", "exactly_once", None),
    (True, "idempotent", "exactly_once", "sink 'out' makes idempotent writes: replays overwrite"),
    (True, "write_ahead_log", "at_least_once", "sink 'out' writes a completed checkpoint's"),
    (True, "none", "at_least_once", "sink 'out' writes at once without replay protection"),
    (False, "two_phase_commit", "at_most_once", "source 'in' cannot be read again"),
    (False, "idempotent", "at_most_once", "source 'in' cannot be read again"),
    (False, "write_ahead_log", "at_most_once", "source 'in' cannot be read again"),
    (False, "none", "at_most_once", "source 'in' cannot be read again"),
]


def source(resettable: bool) -> Source:
    return GeneratorSource(events=10) if resettable else OnceOnlySource(events=10)


def sink(delivery: str, tmp_path: Path, name: str = "out") -> TwoPhaseCommitSink:
    return SINKS[delivery](str(tmp_path / name))


@pytest.mark.parametrize(("resettable", "delivery", "level", "reason"), TABLE)
def test_the_consistency_table(
    resettable: bool, delivery: str, level: str, reason: str | None, tmp_path: Path
) -> None:
    got = end_to_end({"in": source(resettable)}, {"out": sink(delivery, tmp_path)})

    assert got.level == level
    if reason is None:
        assert got.reason is None
    else:
        assert got.reason is not None and got.reason.startswith(reason)


def test_the_shipped_connectors_are_resettable_and_two_phase(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"a": 1}\n')
    sources = {"gen": GeneratorSource(events=1), "file": FileSource((str(tmp_path / "in.jsonl"),))}
    sql = SqlSink(f"sqlite:///{tmp_path / 'out.db'}", "out", {"a": sa.Integer})
    sinks = {"files": FileSink(str(tmp_path / "out")), "sql": sql}

    assert RedisStreamSource.resettable
    assert end_to_end(sources, sinks) == Guarantee("exactly_once", None)


def test_the_shipped_upsert_and_write_ahead_log_sinks_take_their_rows(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'totals.db'}"
    upsert = UpsertSink(db, "totals", {"app_id": sa.String(32), "pv": sa.Integer}, ["app_id"])
    wal = JsonLinesWriteAheadSink(str(tmp_path / "audit.jsonl"))
    gen = {"gen": GeneratorSource(events=1)}

    idempotent = end_to_end(gen, {"totals": upsert})
    logged = end_to_end(gen, {"totals": upsert, "audit": wal})

    assert idempotent.level == "exactly_once"
    assert idempotent.reason is not None and "'totals' makes idempotent" in idempotent.reason
    assert logged.level == "at_least_once"
    assert logged.reason is not None and logged.reason.startswith("sink 'audit' writes")


def test_the_weakest_sink_wins_and_is_named(tmp_path: Path) -> None:
    sinks = {
        "audit": sink("write_ahead_log", tmp_path, "a"),
        "files": sink("two_phase_commit", tmp_path, "f"),
        "totals": sink("idempotent", tmp_path, "t"),
    }

    got = end_to_end({"in": source(True)}, sinks)

    assert got.level == "at_least_once"
    assert got.reason is not None and got.reason.startswith("sink 'audit' writes")
    assert "totals" not in got.reason and "files" not in got.reason


def test_every_part_at_the_weakest_level_is_named_in_uid_order(tmp_path: Path) -> None:
    sinks = {"z-print": sink("none", tmp_path, "z"), "a-wal": sink("write_ahead_log", tmp_path)}

    got = end_to_end({"in": source(True)}, sinks)

    assert got.level == "at_least_once"
    assert got.reason is not None
    assert got.reason.index("sink 'a-wal'") < got.reason.index("sink 'z-print'")


def test_one_source_that_cannot_replay_makes_the_job_at_most_once(tmp_path: Path) -> None:
    sources = {"clicks": source(True), "socket": source(False)}

    got = end_to_end(sources, {"out": sink("write_ahead_log", tmp_path)})

    assert got.level == "at_most_once"
    assert got.reason is not None and got.reason.startswith("source 'socket' cannot")
    assert "clicks" not in got.reason and "'out'" not in got.reason


@pytest.mark.parametrize(
    ("delivery", "resettable", "level"),
    [
        ("two_phase_commit", True, "at_least_once"),
        ("idempotent", True, "at_least_once"),
        ("none", True, "at_least_once"),
        ("two_phase_commit", False, "at_most_once"),
    ],
)
def test_the_at_least_once_mode_caps_the_guarantee(
    delivery: str, resettable: bool, level: str, tmp_path: Path
) -> None:
    got = end_to_end(
        {"in": source(resettable)},
        {"out": sink(delivery, tmp_path)},
        CheckpointingMode.AT_LEAST_ONCE,
    )

    assert got.level == level
    assert got.reason is not None
    assert ("checkpointing mode at_least_once" in got.reason) is (level == "at_least_once")


def test_a_job_without_sinks_is_exactly_once_for_its_state_only() -> None:
    got = end_to_end({"in": source(True)}, {})

    assert got == Guarantee("exactly_once", "the job has no sink: the guarantee covers its state")


def test_an_unknown_delivery_is_refused_with_the_sink_named(tmp_path: Path) -> None:
    class Hopeful(FileSink):
        delivery = "eventually"

    with pytest.raises(ConfigurationError, match=r"sink 'out' \(Hopeful\).*'eventually'"):
        end_to_end({"in": source(True)}, {"out": Hopeful(str(tmp_path))})


def test_labels_read_as_the_dashboard_shows_them() -> None:
    assert Guarantee("at_most_once", "why").describe() == "AT-MOST-ONCE (why)"
    assert Guarantee("exactly_once").describe() == "EXACTLY-ONCE"


def registered(tmp_path: Path, source: Source, sink: TwoPhaseCommitSink, mode: str) -> Any:
    """The ``job_registered`` a driver of source -> count -> sink sends, through the wire."""
    options = JobOptions(
        job_id="guarantee-1",
        checkpoint=CheckpointConfig(mode=CheckpointingMode(mode)),
        checkpoint_dir=f"file://{tmp_path / 'chk'}",
        local_dir=str(tmp_path / "local"),
    )
    env = StreamExecutionEnvironment(options)
    events = env.from_source(source, uid="socket")
    events.key_by("app_id").count(uid="pv", output="pv").sink_to(sink, uid="files")
    driver = JobDriver(env.graph, options)
    event = registration(driver.job, driver.restart)
    _, decoded = p.decode(p.encode(p.envelope(options.job_id, 0, 0, event)))
    return decoded


def test_a_driver_registers_the_guarantee_of_its_graph(tmp_path: Path) -> None:
    got = registered(tmp_path, OnceOnlySource(events=10), sink("none", tmp_path), "exactly_once")

    assert isinstance(got, p.JobRegistered) and got.guarantee is not None
    assert got.guarantee.level == "at_most_once"
    assert got.guarantee.reason is not None
    assert got.guarantee.reason.startswith("source 'socket' cannot be read again")


def test_a_driver_in_at_least_once_mode_registers_at_least_once(tmp_path: Path) -> None:
    got = registered(
        tmp_path, GeneratorSource(events=10), sink("two_phase_commit", tmp_path), "at_least_once"
    )

    assert got.guarantee == p.GuaranteeModel(
        level="at_least_once",
        reason="checkpointing mode at_least_once does not align barriers: state may count "
        "records that a restore replays",
    )


def test_an_older_drivers_registration_has_no_guarantee() -> None:
    event = p.JobRegistered(job_name="old", vertices=[], edges=[], config={})
    wire = p.encode(p.envelope("old-1", 0, 0, event)).replace(b',"guarantee":null', b"")

    assert b"guarantee" not in wire
    assert p.decode(wire)[1].guarantee is None  # type: ignore[attr-defined]


class NoEpochs:
    """An epoch runner that a job canceled before its first epoch never calls."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the runner was used: {name}")


def test_a_standalone_driver_warns_of_a_weaker_guarantee_when_it_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options = JobOptions(
        job_id="standalone-1",
        checkpoint_dir=f"file://{tmp_path / 'chk'}",
        local_dir=str(tmp_path / "local"),
    )
    env = StreamExecutionEnvironment(options)
    events = env.from_source(OnceOnlySource(events=10), uid="socket")
    events.key_by("app_id").count(uid="pv", output="pv").sink_to(sink("none", tmp_path), uid="o")
    driver = JobDriver(env.graph, options)
    driver.authority.request_cancel()

    with caplog.at_level(logging.INFO, logger="sparkpoint.runtime.authority"):
        driver.authority.run(NoEpochs())

    [line] = [r for r in caplog.records if "end-to-end" in r.getMessage()]
    assert line.getMessage().startswith(
        "job standalone-1: end-to-end AT-MOST-ONCE (source 'socket' cannot be read again"
    )
    assert line.levelno == logging.WARNING  # weaker than exactly-once: on stderr by default
    assert driver.job.status is p.JobStatus.CANCELED
