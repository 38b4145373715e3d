"""`sparkpoint run` with a configuration that cannot work: one line, exit 2, no retries."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60  # the job must end by itself long before: it fails before Spark starts


def _run_pv(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``sparkpoint run`` of the PV job with ``options``; returns the process and its seconds."""
    exe = Path(sys.executable).with_name("sparkpoint")
    args = [str(exe), "run", "jobs/examples/pv_count.py", "--standalone", *options]
    args += ["--events", "1000", "--rate", "0", "--output", str(tmp_path / "out")]
    started = time.monotonic()
    proc = subprocess.run(
        args,
        cwd=ROOT,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return proc, time.monotonic() - started


def _blocked_dir(tmp_path: Path) -> Path:
    """A directory nobody can create, not even root: its parent is a regular file."""
    (tmp_path / "file").write_text("not a directory")
    return tmp_path / "file" / "sub"


def _assert_one_line_exit_2(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("sparkpoint run: invalid configuration: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_an_unwritable_checkpoint_dir_fails_at_once_with_one_line(tmp_path: Path) -> None:
    blocked = _blocked_dir(tmp_path)
    proc, seconds = _run_pv(
        tmp_path, "--checkpoint-dir", f"file://{blocked}", "--local-dir", str(tmp_path / "l")
    )
    _assert_one_line_exit_2(
        proc, f"cannot write to --checkpoint-dir file://{blocked}", "Not a directory"
    )
    assert seconds < 30  # before: exponential-delay restarts, stack traces, for ever


def test_an_unwritable_local_dir_fails_at_once_with_one_line(tmp_path: Path) -> None:
    blocked = _blocked_dir(tmp_path)
    proc, seconds = _run_pv(
        tmp_path, "--checkpoint-dir", f"file://{tmp_path / 'chk'}", "--local-dir", str(blocked)
    )
    _assert_one_line_exit_2(proc, f"cannot write to --local-dir {blocked}", "Not a directory")
    assert seconds < 30


def test_a_misspelled_product_option_fails_with_a_suggestion(tmp_path: Path) -> None:
    proc, _ = _run_pv(tmp_path, "--checkpoint-intervall", "1", "--local-dir", str(tmp_path / "l"))
    _assert_one_line_exit_2(
        proc, "unknown option --checkpoint-intervall; did you mean --checkpoint-interval?"
    )


def _run_file(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """``sparkpoint run`` of a job file of ``source`` (standalone)."""
    job = tmp_path / "job.py"
    job.write_text(source)
    exe = Path(sys.executable).with_name("sparkpoint")
    return subprocess.run(
        [str(exe), "run", str(job), "--standalone"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_a_job_file_that_does_not_compile_is_shown_where_without_sparkpoint_frames(
    tmp_path: Path,
) -> None:
    proc = _run_file(tmp_path, "def build(:\n")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == (
        f"sparkpoint run: the job file {tmp_path / 'job.py'} raised SyntaxError:\n"
        f'  File "{tmp_path / "job.py"}", line 1\n'
        "    def build(:\n"
        "              ^\n"
        "SyntaxError: invalid syntax\n"
    )


def test_an_error_of_the_job_file_shows_its_traceback_from_the_job_file_on(
    tmp_path: Path,
) -> None:
    proc = _run_file(tmp_path, "def build():\n    raise ValueError('no such topic')\n\nbuild()\n")
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[:3] == [
        f"sparkpoint run: the job file {tmp_path / 'job.py'} raised ValueError:",
        "Traceback (most recent call last):",
        f'  File "{tmp_path / "job.py"}", line 4, in <module>',
    ], proc.stderr
    assert lines[-1] == "ValueError: no such topic"
    assert "sparkpoint/cli.py" not in proc.stderr and "runpy" not in proc.stderr


def test_a_job_file_that_runs_no_job_says_so(tmp_path: Path) -> None:
    proc = _run_file(tmp_path, "from sparkpoint import StreamExecutionEnvironment\n")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"sparkpoint run: {tmp_path / 'job.py'} ran no job: a job file builds its pipeline on "
        "a StreamExecutionEnvironment and calls env.execute(...)\n"
    )
