"""One standalone run of a job at a time: the run's lock file, as the kernel keeps it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.errors import ConfigurationError
from sparkpoint.run_lock import JobRunningError, hold_run_lock, lock_path


def test_a_second_run_is_refused_naming_the_first_and_takes_it_once_released(
    tmp_path: Path,
) -> None:
    local = str(tmp_path / "local")
    first = hold_run_lock(local, "j")
    with pytest.raises(JobRunningError) as err:
        hold_run_lock(local, "j")
    assert str(err.value).startswith(
        f"job j is running standalone in another process (pid {os.getpid()} on "
    )
    assert f"it holds {lock_path(local, 'j')}): a job runs one driver at a time" in str(err.value)
    os.close(hold_run_lock(local, "other"))  # another job id: its own lock
    os.close(first)
    os.close(hold_run_lock(local, "j"))


def test_the_drivers_of_a_run_keep_it_until_the_last_of_them_ends(tmp_path: Path) -> None:
    """The supervisor hands the lock to each driver: a driver still ending after its
    supervisor died (SIGKILL) keeps it, and its end, however it comes, releases it."""
    local = str(tmp_path / "local")
    held = hold_run_lock(local, "j")
    driver = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        pass_fds=(held,),
    )
    os.close(held)  # the supervisor is gone
    with pytest.raises(JobRunningError):
        hold_run_lock(local, "j")
    driver.kill()
    driver.wait(timeout=30)
    os.close(hold_run_lock(local, "j"))


def test_a_local_dir_that_cannot_be_written_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigurationError) as err:
        hold_run_lock(str(blocker / "local"), "j")
    assert str(err.value).startswith(f"cannot write to --local-dir {blocker / 'local'}: ")
