"""``sparkpoint run --help`` documents every product option, grouped, with its Flink key."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from sparkpoint.option_parser import product_parser

SPARKPOINT = str(Path(sys.executable).with_name("sparkpoint"))
ROOT = Path(__file__).resolve().parents[2]


@functools.cache  # one subprocess for the tests that read the same text
def _run_help() -> str:
    done = subprocess.run(
        [SPARKPOINT, "run", "--help"], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def test_every_product_option_is_listed_with_a_help_text() -> None:
    text = _run_help()
    actions = [a for a in product_parser()._actions if a.option_strings]
    assert len(actions) >= 30
    for action in actions:
        assert action.help, f"{action.option_strings[0]} has no help text"
        assert action.option_strings[0] in text, f"{action.option_strings[0]} is not listed"
    for group in ("checkpointing:", "state backend:", "restart strategy:", "testing"):
        assert group in text


def test_options_name_their_flink_keys() -> None:
    text = " ".join(_run_help().split())  # argparse wraps long lines
    for key in (
        "execution.checkpointing.interval",
        "state.backend.type",
        "execution.checkpointing.incremental",
        "restart-strategy.type",
        "jobmanager.execution.failover-strategy",
        "execution.savepoint.path",
        "state.checkpoints.num-retained",
    ):
        assert f"[Flink: {key}]" in text.replace("- ", "-"), key


def test_help_after_the_job_file_is_the_jobs_own() -> None:
    done = subprocess.run(
        [SPARKPOINT, "run", "jobs/examples/pv_count.py", "--standalone", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: pv_count" in done.stdout and "--checkpoint-interval" not in done.stdout
