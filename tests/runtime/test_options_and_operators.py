"""Job options, the graph builder's checks, and the vectorized count against a plain loop."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sparkpoint.connectors.sinks import FileSink
from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import CountOperator
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import parse_job_options
from sparkpoint.protocol import CheckpointingMode
from sparkpoint.records import Batch
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range
from sparkpoint.testing import ListSource


def test_product_options_and_job_arguments_are_split() -> None:
    opts, rest = parse_job_options(
        [
            "--standalone",
            "--checkpoint-interval",
            "1.5",
            "--events",
            "10",
            "--mode",
            "at_least_once",
            "--checkpoint-dir",
            "file:///tmp/c",
            "--output",
            "o",
        ]
    )
    assert rest == ["--events", "10", "--output", "o"]
    assert opts.checkpoint.interval_ms == 1500
    assert opts.checkpoint.mode is CheckpointingMode.AT_LEAST_ONCE
    assert opts.checkpoint_storage == "filesystem"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint-interval", "-1"], "--checkpoint-interval must be >= 0 seconds"),
        # 0 would expire every checkpoint as it starts: Flink refuses a timeout of 0 too.
        (["--checkpoint-timeout", "0"], "--checkpoint-timeout must be > 0 seconds, got 0"),
        (["--parallelism", "0"], "--parallelism must be between 1 and --max-parallelism (128)"),
        (["--fail-after", "-3"], "--fail-after must be >= 0 records"),
        (["--alignment-buffer", "-1"], "--alignment-buffer must be >= 0 bytes, got -1"),
        (["--checkpoint-storage", "filesystem"], "needs --checkpoint-dir URL"),
        (["--mode", "sometimes"], "argument --mode: invalid choice: 'sometimes'"),
        (["--retained", "0"], "--retained must be >= 1 checkpoints, got 0"),
        (["--tolerable-failures", "-1"], "--tolerable-failures must be >= 0 checkpoints"),
        # An epoch of no record never ends the input: the job ran on, reading nothing.
        (["--max-epoch-records", "0"], "--max-epoch-records must be >= 1 records, got 0"),
        (["--max-epoch-records", "-5"], "--max-epoch-records must be >= 1 records, got -5"),
        (["--min-epoch-records", "0"], "--min-epoch-records must be >= 1 records, got 0"),
        (
            ["--min-epoch-records", "5000", "--max-epoch-records", "100"],
            "--min-epoch-records (5,000) must not exceed --max-epoch-records (100)",
        ),
        (["--epoch-target-ms", "0"], "--epoch-target-ms must be a number > 0 ms, got 0"),
        (["--epoch-target-ms", "-1"], "--epoch-target-ms must be a number > 0 ms, got -1"),
        (["--epoch-target-ms", "inf"], "--epoch-target-ms must be a number > 0 ms, got inf"),
        (["--epoch-target-ms", "nan"], "--epoch-target-ms must be a number > 0 ms, got nan"),
    ],
)
def test_invalid_options_name_the_option(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_job_options(["--standalone", *argv])
    assert message in str(err.value)


def test_the_epoch_minimum_defaults_to_1000_records_but_never_above_the_maximum() -> None:
    assert parse_job_options(["--standalone"])[0].min_epoch_records == 1_000
    opts, _ = parse_job_options(["--standalone", "--max-epoch-records", "200"])
    assert (opts.min_epoch_records, opts.max_epoch_records) == (200, 200)
    opts, _ = parse_job_options(["--standalone", "--min-epoch-records", "50000"])
    assert opts.min_epoch_records == 50_000


def test_graph_checks_uids_and_shape(tmp_path: object) -> None:
    opts, _ = parse_job_options(["--standalone"])
    env = StreamExecutionEnvironment(opts)
    stream = env.from_source(ListSource((1, 2)), uid="src")
    with pytest.raises(ConfigurationError, match="uid 'src' is used twice"):
        stream.map(lambda x: x, uid="src")
    mapped = stream.map(lambda x: {"k": x}, uid="m")
    keyed = mapped.key_by("k").count(uid="c")
    with pytest.raises(ConfigurationError, match="keyed twice"):
        mapped.key_by("k")  # a stream feeds one keyed vertex (a keyed one may feed another)
    with pytest.raises(ConfigurationError, match="has no sink"):
        env.execute("no-sink")
    keyed.sink_to(FileSink(str(tmp_path)), uid="out")
    names = [v.name for v in env.graph.vertices()]
    assert names == ["src -> m", "c -> out"]


@pytest.mark.parametrize("seed", range(5))
def test_vectorized_running_count_equals_a_plain_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    op = CountOperator("c", "k", output="n", emit="every")
    backend = HashMapKeyedStateBackend(128, key_group_range(0, 1, 128))
    op.open(backend)
    seen: Counter[str] = Counter()
    for _ in range(3):
        keys = rng.choice(["x", "y", "z", "w"], size=int(rng.integers(0, 50)))
        out = op.process(Batch.of_columns(k=keys), backend)
        expected = []
        for k in keys.tolist():
            seen[k] += 1
            expected.append({"k": k, "n": seen[k]})
        assert out.rows == expected
    assert backend.table("count") == dict(seen)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {}),  # Flink's default, decided with checkpointing: exponential-delay or none
        (
            ["--restart-delay", "0"],
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "0 ms"},
        ),
        (
            [
                "--restart-strategy",
                "failure-rate",
                "--restart-option",
                "restart-strategy.failure-rate.max-failures-per-interval=3",
            ],
            {
                "restart-strategy.type": "failure-rate",
                "restart-strategy.failure-rate.max-failures-per-interval": "3",
            },
        ),
    ],
)
def test_restart_options_are_flinks_keys(argv: list[str], expected: dict[str, str]) -> None:
    opts, _ = parse_job_options(["--standalone", *argv])
    assert opts.restart_strategy == expected


def test_without_restart_options_flinks_default_strategy_applies() -> None:
    from sparkpoint.checkpointing.restart import restart_strategy_from_config

    for interval, kind in (("1", "exponential-delay"), ("0", "none")):
        opts, _ = parse_job_options(["--standalone", "--checkpoint-interval", interval])
        strategy = restart_strategy_from_config(
            dict(opts.restart_strategy), checkpointing_enabled=opts.checkpoint.interval_ms > 0
        )
        assert strategy.to_config()["restart-strategy.type"] == kind


def test_a_restart_option_outside_restart_strategy_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="--restart-option takes restart-strategy"):
        parse_job_options(["--standalone", "--restart-option", "parallelism.default=4"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--incremental"], "--incremental needs --state-backend rocksdb"),
        (
            ["--state-backend", "rocksdb", "--incremental"],
            "--incremental needs a filesystem checkpoint storage",
        ),
        (["--savepoint-on-finish", "/sp"], "--savepoint-on-finish is for --standalone jobs"),
    ],
)
def test_state_options_that_do_not_go_together_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_job_options(["--redis-url", "redis://127.0.0.1:1", *argv])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--redis-url", "redis://127.0.0.1:6379/0"],
            "--redis-url is for a job connected to the control plane; a --standalone job "
            "runs without one (drop --standalone to connect)",
        ),
        (
            ["--stream-prefix", "other", "--control-plane-timeout", "5"],
            "--stream-prefix, --control-plane-timeout are for a job connected",
        ),
    ],
)
def test_control_plane_options_of_a_standalone_job_are_refused(
    argv: list[str], message: str
) -> None:
    """Ignoring them would run the job without the control plane its user meant it to use."""
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        parse_job_options(["--standalone", *argv])
    # Their defaults are no choice of the user's.
    parse_job_options(["--standalone", "--stream-prefix", "sparkpoint"])


def test_paths_are_made_absolute_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executors and the control plane run elsewhere: they get the driver's place."""
    monkeypatch.chdir(tmp_path)
    given = {"--checkpoint-dir": "rel/chk", "--from-checkpoint": "old/chk-3"}
    given["--savepoint-on-finish"] = "sp"
    opts, _ = parse_job_options(["--standalone", *(a for kv in given.items() for a in kv)])
    assert opts.checkpoint_dir == str(tmp_path / "rel" / "chk")
    assert opts.from_checkpoint == str(tmp_path / "old" / "chk-3")
    assert opts.savepoint_on_finish == str(tmp_path / "sp")
    urls, _ = parse_job_options(["--standalone", "--checkpoint-dir", "s3://bucket/chk"])
    assert urls.checkpoint_dir == "s3://bucket/chk"


def test_incremental_checkpoints_keep_one_checkpoint_in_flight() -> None:
    from dataclasses import replace

    from sparkpoint.checkpointing.config import CheckpointConfig
    from sparkpoint.options import check_state_options

    options, _ = parse_job_options(
        ["--standalone", "--state-backend", "rocksdb", "--incremental", "--checkpoint-dir", "/c"]
    )
    assert (options.state_backend, options.incremental) == ("rocksdb", True)
    concurrent = replace(options, checkpoint=CheckpointConfig(max_concurrent=2))
    with pytest.raises(ConfigurationError, match="keep one checkpoint in flight"):
        check_state_options(concurrent)


@pytest.mark.parametrize(
    ("given", "ms"),
    [("1.5", 1500), ("500ms", 500), ("10 s", 10_000), ("2min", 120_000), ("0", 0)],
)
def test_times_are_seconds_or_a_duration_with_its_unit(given: str, ms: int) -> None:
    """A Flink user's ``execution.checkpointing.interval: 1000`` means milliseconds: here it
    is written ``1000ms``, while a bare number stays seconds."""
    opts, _ = parse_job_options(
        ["--standalone", "--checkpoint-interval", given, "--min-pause", given]
    )
    assert opts.checkpoint.interval_ms == ms and opts.checkpoint.min_pause_ms == ms


@pytest.mark.parametrize("given", ["500mss", "nan", "inf", "1 fortnight"])
def test_a_time_that_is_not_one_is_refused_naming_the_option_and_the_value(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In one line of its own: no usage text from argparse before it, and not the whole
    command line (with options the CLI added) after it."""
    with pytest.raises(ConfigurationError) as refused:
        parse_job_options(["--job-id", "j1", "--standalone", "--checkpoint-timeout", given])
    assert str(refused.value).startswith(f"argument --checkpoint-timeout: {given!r} is not a time")
    assert capsys.readouterr().err == ""
