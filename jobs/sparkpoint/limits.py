"""The bounds of every id and number that crosses a process boundary, in one place.

Events and commands (``protocol.py``), the REST API's inputs, the restart-strategy parser and
the job's command line all take their limits from here, so that a value one side accepts is
never one the other side (or the database) cannot hold. The numbers follow Flink where it has
them: parallelism as ``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM``; counts and ids
as Java's ``Integer.MAX_VALUE`` (Flink's options are ``int``, the database's ids ``INTEGER``);
sizes and timestamps as a ``BIGINT``.
"""

from __future__ import annotations

import re

from sparkpoint.errors import ConfigurationError
from sparkpoint.state.key_groups import UPPER_BOUND_MAX_PARALLELISM

#: Parallelism and max parallelism of an operator: 1 to 32768, as Flink.
MAX_PARALLELISM = UPPER_BOUND_MAX_PARALLELISM
#: Java's ``Integer.MAX_VALUE``, what a SQL ``INTEGER`` holds: counts (attempts, failures per
#: interval, retained and tolerable checkpoints, max concurrent), checkpoint ids, job
#: attempts, epochs.
MAX_INT = 2**31 - 1
MIN_INT = -(2**31)
#: What a SQL ``BIGINT`` holds: sizes, records, offsets, timestamps.
MAX_LONG = 2**63 - 1
MIN_LONG = -(2**63)
#: Every duration setting (checkpoint interval, timeout, pause; restart delays and backoffs;
#: heartbeat interval): at most one year, in milliseconds.
MAX_DURATION_MS = 365 * 86_400_000

#: Upper bounds of the checkpoint settings: ``CheckpointConfig`` checks them, and the control
#: plane refuses a registration beyond them naming the setting and its bound.
CHECKPOINT_SETTING_BOUNDS = {
    **dict.fromkeys(("interval_ms", "timeout_ms", "min_pause_ms"), MAX_DURATION_MS),
    **dict.fromkeys(("max_concurrent", "tolerable_failures", "retained"), MAX_INT),
}

#: A job graph's size: its vertices (tasks), and its subtasks (the sum of their parallelism).
#: Every checkpoint expects an acknowledgement of each subtask, and the control plane keeps
#: them in memory and in one row each: a registration past these is refused.
MAX_VERTICES = 1_000
MAX_SUBTASKS = 100_000

#: Job names, operator uids and Spark application ids: what the database's ``VARCHAR(200)``
#: holds (and the REST API's ``{operator_id}`` path parameter).
MAX_NAME_LENGTH = 200

#: Free text in messages (failure causes, decline and abort reasons): longer text keeps its
#: beginning and end, this many characters in all, around a note of how much was cut.
MAX_TEXT_LENGTH = 8192

#: A job id: a letter or digit, then letters, digits, ``.``, ``_`` or ``-``; 64 at most. The
#: runtime's default (``uuid4().hex``) fits; so does anything safe in a URL path, a file
#: name, a Redis key and a Prometheus label.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_JOB_ID_LENGTH = 64
_JOB_ID = re.compile(JOB_ID_PATTERN)
#: Ids the pattern allows that name a REST resource instead of a job (``GET /jobs/overview``).
RESERVED_JOB_IDS = frozenset({"overview"})


class InvalidJobIdError(ConfigurationError, ValueError):
    """A job id outside :data:`JOB_ID_PATTERN` (a ``ValueError`` too, for pydantic)."""


def check_job_id(job_id: str) -> str:
    """``job_id`` when it matches :data:`JOB_ID_PATTERN`.

    Raises:
        InvalidJobIdError: naming the id (shortened when long) and what is wrong with it.
    """
    if _JOB_ID.fullmatch(job_id) is not None and job_id not in RESERVED_JOB_IDS:
        return job_id
    shown = repr(job_id if len(job_id) <= 80 else job_id[:80] + "...")
    if job_id in RESERVED_JOB_IDS:
        raise InvalidJobIdError(
            f"invalid job id {shown}: /jobs/{job_id} is a resource of the REST API, not a "
            "job; choose another id"
        )
    if not job_id:
        problem = "it is empty"
    elif len(job_id) > MAX_JOB_ID_LENGTH:
        problem = f"it has {len(job_id)} characters, more than {MAX_JOB_ID_LENGTH}"
    else:
        problem = "it must start with a letter or a digit, then only letters, digits, . _ -"
    raise InvalidJobIdError(f"invalid job id {shown}: {problem} (pattern {JOB_ID_PATTERN})")


def cut_text(text: str) -> str:
    """``text``, or its first and last ``MAX_TEXT_LENGTH / 2`` characters around a note of how
    many were cut: a failure cause stays readable without making every answer that shows it
    huge."""
    if len(text) <= MAX_TEXT_LENGTH:
        return text
    half = MAX_TEXT_LENGTH // 2
    return f"{text[:half]}\n... ({len(text) - 2 * half} characters cut) ...\n{text[-half:]}"
