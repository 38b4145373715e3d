"""``--job-id`` is refused at parse time unless it matches the one job id pattern, which the
control plane also enforces (``sparkpoint.limits``); the generated default always matches."""

from __future__ import annotations

import pytest

from sparkpoint.errors import ConfigurationError
from sparkpoint.limits import check_job_id
from sparkpoint.options import JobOptions, parse_job_options

PATTERN = "(pattern ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$)"
CHARACTERS = "it must start with a letter or a digit, then only letters, digits, . _ -"


@pytest.mark.parametrize(
    ("job_id", "problem"),
    [
        ("../etc", f"'../etc': {CHARACTERS}"),
        ("a/b", f"'a/b': {CHARACTERS}"),
        ("a\0b", f"'a\\x00b': {CHARACTERS}"),
        ("-x", f"'-x': {CHARACTERS}"),
        ("job 1", f"'job 1': {CHARACTERS}"),
        ("j" * 65, f"'{'j' * 65}': it has 65 characters, more than 64"),
        ("", "'': it is empty"),
    ],
)
def test_an_invalid_job_id_is_refused_naming_it(job_id: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_job_options(["--standalone", f"--job-id={job_id}"])

    assert str(err.value) == f"--job-id: invalid job id {problem} {PATTERN}"


def test_an_id_that_names_a_rest_resource_is_refused() -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_job_options(["--standalone", "--job-id=overview"])

    assert str(err.value) == (
        "--job-id: invalid job id 'overview': /jobs/overview is a resource of the REST API, "
        "not a job; choose another id"
    )


@pytest.mark.parametrize("job_id", ["pv-shared-a", "pv", "a.b_c-D9", "j" * 64])
def test_a_valid_job_id_is_kept(job_id: str) -> None:
    options, rest = parse_job_options(["--standalone", "--job-id", job_id, "--events", "5"])

    assert (options.job_id, rest) == (job_id, ["--events", "5"])


def test_the_generated_job_id_matches_the_pattern() -> None:
    generated = [parse_job_options(["--standalone"])[0].job_id, JobOptions().job_id]

    assert [check_job_id(job_id) for job_id in generated] == generated
