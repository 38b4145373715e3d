"""Restart strategy options and checkpoint settings have upper bounds (``sparkpoint.limits``):
durations at most a year, counts at most a Java ``int``; a value beyond is refused naming the
key, so that no strategy is built that the control plane cannot store or run."""

from __future__ import annotations

import pytest

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.restart import (
    ConfigValue,
    parse_duration_ms,
    restart_strategy_from_config,
)
from sparkpoint.errors import ConfigurationError

YEAR_MS = 31_536_000_000
TOO_LONG = "longer than the maximum of 365 d (31536000000 ms)"


@pytest.mark.parametrize(
    ("value", "ms"), [("365 d", YEAR_MS), (YEAR_MS, YEAR_MS), ("8760 h", YEAR_MS)]
)
def test_a_year_is_the_longest_duration(value: ConfigValue, ms: int) -> None:
    assert parse_duration_ms(value, "k") == ms


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("366 d", "'366 d'"),
        (YEAR_MS + 1, str(YEAR_MS + 1)),
        ("99999999999999999999 d", "'99999999999999999999 d'"),
        ("9" * 5000 + " s", "'" + "9" * 36 + "..."),
    ],
)
def test_a_longer_duration_is_refused_naming_the_key(value: ConfigValue, shown: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_duration_ms(value, "restart-strategy.fixed-delay.delay")

    assert (
        str(err.value)
        == f"restart-strategy.fixed-delay.delay: invalid duration {shown}: {TOO_LONG}"
    )


FIXED = "restart-strategy.fixed-delay."
RATE = "restart-strategy.failure-rate."
EXP = "restart-strategy.exponential-delay."


AT_MOST = "must be at most 2147483647"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (FIXED + "attempts", 10**23, f"invalid value 100000000000000000000000: {AT_MOST}"),
        (FIXED + "attempts", "2147483648", f"invalid value '2147483648': {AT_MOST}"),
        (
            RATE + "max-failures-per-interval",
            2**63,
            f"invalid value 9223372036854775808: {AT_MOST}",
        ),
        (EXP + "attempts-before-reset-backoff", 2**31, f"invalid value 2147483648: {AT_MOST}"),
        (FIXED + "attempts", "9" * 5000, "invalid integer '" + "9" * 36 + "..."),
        (FIXED + "delay", "9" * 20 + " d", f"invalid duration '{'9' * 20} d': {TOO_LONG}"),
        (RATE + "failure-rate-interval", "400 d", f"invalid duration '400 d': {TOO_LONG}"),
        (EXP + "max-backoff", YEAR_MS + 1, f"invalid duration {YEAR_MS + 1}: {TOO_LONG}"),
    ],
)
def test_an_option_beyond_its_bound_is_refused_naming_the_key(
    key: str, value: ConfigValue, message: str
) -> None:
    kind = key.split(".")[1]

    with pytest.raises(ConfigurationError) as err:
        restart_strategy_from_config({"restart-strategy.type": kind, key: value}, True)

    assert str(err.value) == f"{key}: {message}"


def test_the_largest_values_build_a_strategy() -> None:
    conf: dict[str, ConfigValue] = {
        "restart-strategy.type": "failure-rate",
        RATE + "max-failures-per-interval": 2**31 - 1,
        RATE + "failure-rate-interval": "365 d",
        RATE + "delay": "365 d",
    }

    strategy = restart_strategy_from_config(conf, True)

    assert strategy.to_config() == conf


@pytest.mark.parametrize(
    ("field", "value", "most"),
    [
        ("interval_ms", 10**29, YEAR_MS),
        ("timeout_ms", YEAR_MS + 1, YEAR_MS),
        ("min_pause_ms", 10**29, YEAR_MS),
        ("max_concurrent", 2**70, 2**31 - 1),
        ("tolerable_failures", 2**31, 2**31 - 1),
        ("retained", 2**63, 2**31 - 1),
    ],
)
def test_checkpoint_settings_beyond_their_bound_are_refused_naming_them(
    field: str, value: int, most: int
) -> None:
    with pytest.raises(ConfigurationError) as err:
        CheckpointConfig(**{field: value})  # type: ignore[arg-type]

    assert str(err.value) == f"{field} must be at most {most}, got {value}"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("interval_ms", float("nan")),
        ("timeout_ms", 1e400),
        ("retained", "3"),
        ("max_concurrent", True),
    ],
)
def test_checkpoint_settings_must_be_integers(field: str, value: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        CheckpointConfig(**{field: value})  # type: ignore[arg-type]

    assert str(err.value) == f"{field} must be an integer, got {value!r}"
