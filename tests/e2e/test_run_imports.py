"""``sparkpoint run`` imports the package, not a folder of its name in the current directory.

Run from the temporary directory, ``<tmp>/sparkpoint`` (an older default ``--local-dir``) or
any folder named ``sparkpoint`` would otherwise shadow the package as a namespace package
under an editable install, and ``from sparkpoint import ...`` in the job would fail. The
job's own modules in the current directory still import.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SPARKPOINT = str(Path(sys.executable).with_name("sparkpoint"))

JOB = """
import sys
import sparkpoint
from sparkpoint import FileSink, StreamExecutionEnvironment
import mylib

print("package:", sparkpoint.__file__, FileSink.__module__, mylib.GREETING)
sys.exit(0)
"""


def test_a_sparkpoint_folder_in_the_current_directory_does_not_shadow_the_package(
    tmp_path: Path,
) -> None:
    (tmp_path / "sparkpoint").mkdir()  # no __init__.py: a namespace package candidate
    (tmp_path / "mylib.py").write_text('GREETING = "hello from the current directory"\n')
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "job.py").write_text(JOB)
    done = subprocess.run(
        [SPARKPOINT, "run", "jobs/job.py", "--standalone"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sparkpoint.connectors.sinks" in done.stdout
    assert "hello from the current directory" in done.stdout
    assert str(tmp_path / "sparkpoint") not in done.stdout
