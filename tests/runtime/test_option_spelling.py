"""A misspelled product option is refused with a suggestion; the job's own options never are."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples import pv_count
from sparkpoint.errors import ConfigurationError
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import parse_job_options


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--checkpoint-intervall", "--checkpoint-interval"),
        ("--checkpoint-internal", "--checkpoint-interval"),
        ("--chekpoint-dir", "--checkpoint-dir"),
        ("--paralelism", "--parallelism"),
        ("--max-paralelism", "--max-parallelism"),
        ("--standlone", "--standalone"),
        ("--restart-stratgey", "--restart-strategy"),
        ("--jobid", "--job-id"),
        ("--max-epoch-record", "--max-epoch-records"),
        ("--epoch-target", "--epoch-target-ms"),  # abbreviations: argparse takes none here
        ("--checkpoint-int", "--checkpoint-interval"),
        ("--par", "--parallelism"),
    ],
)
def test_a_near_miss_names_the_product_option(typed: str, meant: str) -> None:
    expected = f"^unknown option {typed}; did you mean {meant}\\?$"
    with pytest.raises(ConfigurationError, match=expected):
        parse_job_options(["--standalone", typed, "1", "--events", "10"], job_options=())
    with pytest.raises(ConfigurationError, match=expected):
        StreamExecutionEnvironment.from_args(["--standalone", f"{typed}=1"])


@pytest.mark.parametrize(
    "job_argument",
    [
        "--events",  # a whole word of --events-log, not an abbreviation of it
        "--apps",
        "--rate",
        "--emit",
        "--output",
        "--splits",
        "--input",
        "--interval",
        "--redis",
        "--master-url",
        "--state",
        "--local",
        "--topic",
        "--threshold",
        "--retries",
    ],
)
def test_job_options_unlike_product_options_pass(job_argument: str) -> None:
    _, rest = parse_job_options(["--standalone", job_argument, "x"], job_options=())
    assert rest == [job_argument, "x"]


def test_the_example_job_runs_with_all_its_options(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment.from_args(
        [
            "--standalone",
            "--events",
            "100",
            "--apps",
            "3",
            "--rate",
            "0",
            "--splits",
            "2",
            "--emit",
            "epoch",
            "--output",
            str(tmp_path / "out"),
        ]
    )
    args = pv_count.build(env, env.args)
    assert (args.events, args.apps, args.rate, args.emit) == (100, 3, 0.0, "epoch")


def test_a_job_declares_its_own_options_so_they_are_never_flagged() -> None:
    argv = ["--standalone", "--parallel", "4", "--mod=fast", "--parallelism", "3"]
    with pytest.raises(ConfigurationError, match="did you mean --parallelism"):
        StreamExecutionEnvironment.from_args(argv)
    env = StreamExecutionEnvironment.from_args(argv, job_options=["--parallel", "mod"])
    assert env.args == ["--parallel", "4", "--mod=fast"]
    assert env.options.parallelism == 3


def test_arguments_after_a_double_dash_are_the_jobs() -> None:
    argv = ["--standalone", "--", "--checkpoint-intervall", "1"]
    _, rest = parse_job_options(argv, job_options=())
    assert rest[-2:] == ["--checkpoint-intervall", "1"]


def test_the_job_gets_its_arguments_without_the_double_dash() -> None:
    """A job's argparse would take every argument after a ``--`` for a positional one: the
    PV job then refused ``--output`` as missing. Only the first ``--`` is the separator."""
    argv = ["--standalone", "--checkpoint-interval", "1", "--", "--events", "5", "--", "x"]
    env = StreamExecutionEnvironment.from_args(argv)
    assert env.args == ["--events", "5", "--", "x"]
    assert env.options.checkpoint.interval_ms == 1000


def test_a_caller_that_cannot_know_the_job_options_skips_the_check() -> None:
    """``sparkpoint run`` parses before the job starts; the job's ``from_args`` checks."""
    _, rest = parse_job_options(["--standalone", "--paralelism", "2"])
    assert rest == ["--paralelism", "2"]
