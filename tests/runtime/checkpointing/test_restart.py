"""Tests of the restart strategies: decisions over failure sequences, and Flink-style options."""

from __future__ import annotations

import random

import pytest

from sparkpoint.checkpointing.restart import (
    INFINITE_ATTEMPTS,
    ConfigValue,
    ExponentialDelayRestartStrategy,
    FailureRateRestartStrategy,
    FixedDelayRestartStrategy,
    NoRestartStrategy,
    RestartDecision,
    RestartStrategy,
    format_duration,
    parse_duration_ms,
    restart_strategy_from_config,
)
from sparkpoint.errors import ConfigurationError


def decisions(strategy: RestartStrategy, times: list[int]) -> list[tuple[bool, int]]:
    return [(d.restart, d.delay_ms) for d in map(strategy.on_failure, times)]


def no_jitter(**kwargs: int | float) -> ExponentialDelayRestartStrategy:
    return ExponentialDelayRestartStrategy(jitter_factor=0.0, **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- decisions


def test_none_never_restarts() -> None:
    strategy = NoRestartStrategy()
    assert strategy.on_failure(0) == RestartDecision(
        False, 0, "restart strategy is none: the job fails"
    )


def test_fixed_delay_restarts_attempts_times_then_fails() -> None:
    strategy = FixedDelayRestartStrategy(attempts=3, delay_ms=10_000)
    assert decisions(strategy, [0, 20_000, 40_000, 60_000]) == [
        (True, 10_000),
        (True, 10_000),
        (True, 10_000),
        (False, 0),
    ]


def test_fixed_delay_messages() -> None:
    strategy = FixedDelayRestartStrategy(attempts=1, delay_ms=500)
    assert strategy.on_failure(0).message == "fixed-delay: restart 1 of 1 in 500 ms"
    assert strategy.on_failure(1).message == "fixed-delay: failure 2 exceeds 1 attempts"


def test_fixed_delay_with_zero_attempts_fails_at_once() -> None:
    assert decisions(FixedDelayRestartStrategy(attempts=0), [0]) == [(False, 0)]


def test_failure_rate_fails_when_one_more_than_allowed_falls_in_the_interval() -> None:
    strategy = FailureRateRestartStrategy(2, 60_000, 1_000)
    assert decisions(strategy, [0, 10_000, 20_000]) == [(True, 1_000), (True, 1_000), (False, 0)]


def test_failure_rate_messages() -> None:
    strategy = FailureRateRestartStrategy(1, 60_000, 2_000)
    assert strategy.on_failure(0).message == "failure-rate: restart in 2 s"
    assert strategy.on_failure(60_000).message == "failure-rate: 2 failures within 1 min exceed 1"


def test_failure_rate_window_slides() -> None:
    strategy = FailureRateRestartStrategy(2, 60_000, 5_000)
    assert decisions(strategy, [0, 30_000, 61_000, 70_000]) == [
        (True, 5_000),
        (True, 5_000),
        (True, 5_000),  # 0 is more than 60 s before 61 s
        (False, 0),  # 30 s, 61 s and 70 s lie within 60 s
    ]


def test_failure_rate_interval_boundary_is_inclusive() -> None:
    assert decisions(FailureRateRestartStrategy(1, 1_000, 0), [0, 1_000]) == [
        (True, 0),
        (False, 0),
    ]
    assert decisions(FailureRateRestartStrategy(1, 1_000, 0), [0, 1_001]) == [
        (True, 0),
        (True, 0),
    ]


def test_exponential_delay_grows_by_the_multiplier_up_to_the_maximum() -> None:
    strategy = no_jitter(initial_backoff_ms=1_000, max_backoff_ms=10_000, backoff_multiplier=2)
    now, delays = 0, []
    for _ in range(6):
        decision = strategy.on_failure(now)
        assert decision.restart
        delays.append(decision.delay_ms)
        now += decision.delay_ms + 1  # fails again right after each restart
    assert delays == [1_000, 2_000, 4_000, 8_000, 10_000, 10_000]


def test_exponential_delay_merges_failures_before_the_scheduled_restart() -> None:
    strategy = no_jitter(backoff_multiplier=2)
    assert strategy.on_failure(0).delay_ms == 1_000
    assert strategy.on_failure(400) == RestartDecision(
        True, 600, "exponential-delay: merged into restart 1 due in 600 ms"
    )
    assert strategy.on_failure(1_000).delay_ms == 0
    assert strategy.on_failure(1_001) == RestartDecision(
        True, 2_000, "exponential-delay: restart 2 in 2 s"
    )


def test_exponential_delay_resets_after_the_threshold_of_running() -> None:
    strategy = no_jitter(backoff_multiplier=2, reset_backoff_threshold_ms=60_000)
    assert decisions(strategy, [0, 1_001]) == [(True, 1_000), (True, 2_000)]
    strategy.on_running(3_001)
    assert decisions(strategy, [63_001]) == [(True, 1_000)]

    short = no_jitter(backoff_multiplier=2, reset_backoff_threshold_ms=60_000)
    assert decisions(short, [0, 1_001]) == [(True, 1_000), (True, 2_000)]
    short.on_running(3_001)
    assert decisions(short, [63_000]) == [(True, 4_000)]


def test_exponential_delay_measures_running_from_on_running_when_reported() -> None:
    strategy = no_jitter(backoff_multiplier=2, reset_backoff_threshold_ms=60_000)
    strategy.on_failure(0)  # restart scheduled at 1 s
    strategy.on_running(30_000)  # the restore took until 30 s
    assert decisions(strategy, [61_000]) == [(True, 2_000)]

    unreported = no_jitter(backoff_multiplier=2, reset_backoff_threshold_ms=60_000)
    unreported.on_failure(0)
    assert decisions(unreported, [61_000]) == [(True, 1_000)]


def test_exponential_delay_fails_past_attempts_before_reset() -> None:
    strategy = no_jitter(attempts_before_reset_backoff=2, backoff_multiplier=2)
    assert decisions(strategy, [0, 1_001]) == [(True, 1_000), (True, 2_000)]
    assert strategy.on_failure(3_002) == RestartDecision(
        False, 0, "exponential-delay: attempt 3 exceeds 2 before reset"
    )


def test_exponential_delay_jitter_is_deterministic_with_a_seeded_random() -> None:
    strategy = ExponentialDelayRestartStrategy(rng=random.Random(42))
    now, delays = 0, []
    for _ in range(5):
        delay = strategy.on_failure(now).delay_ms
        delays.append(delay)
        now += delay + 1
    # 1000, 1500, 2250, 3375, 5062 ms, each moved by at most 10 %
    assert delays == [1_063, 1_407, 2_037, 3_319, 4_806]


def test_exponential_delay_stays_at_the_maximum_after_many_attempts() -> None:
    strategy = no_jitter(max_backoff_ms=60_000, backoff_multiplier=10)
    now = 0
    for _ in range(2_000):
        decision = strategy.on_failure(now)
        now += decision.delay_ms + 1
    assert decision == RestartDecision(True, 60_000, "exponential-delay: restart 2000 in 1 min")


# ----------------------------------------------------------------------------- configuration


def test_defaults_follow_checkpointing() -> None:
    none = restart_strategy_from_config({}, checkpointing_enabled=False)
    assert isinstance(none, NoRestartStrategy)
    strategy = restart_strategy_from_config({}, checkpointing_enabled=True)
    assert strategy.to_config() == {
        "restart-strategy.type": "exponential-delay",
        "restart-strategy.exponential-delay.initial-backoff": "1 s",
        "restart-strategy.exponential-delay.max-backoff": "1 min",
        "restart-strategy.exponential-delay.backoff-multiplier": 1.5,
        "restart-strategy.exponential-delay.reset-backoff-threshold": "1 h",
        "restart-strategy.exponential-delay.jitter-factor": 0.1,
        "restart-strategy.exponential-delay.attempts-before-reset-backoff": INFINITE_ATTEMPTS,
    }


def test_fixed_delay_and_failure_rate_defaults() -> None:
    fixed = restart_strategy_from_config({"restart-strategy.type": "fixed-delay"}, True)
    assert isinstance(fixed, FixedDelayRestartStrategy)
    assert (fixed.attempts, fixed.delay_ms) == (1, 1_000)
    rate = restart_strategy_from_config({"restart-strategy.type": "failure-rate"}, True)
    assert isinstance(rate, FailureRateRestartStrategy)
    assert (rate.max_failures_per_interval, rate.failure_rate_interval_ms, rate.delay_ms) == (
        1,
        60_000,
        1_000,
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("off", NoRestartStrategy),
        ("disable", NoRestartStrategy),
        ("none", NoRestartStrategy),
        ("fixeddelay", FixedDelayRestartStrategy),
        ("Failure-Rate", FailureRateRestartStrategy),
        ("exponentialdelay", ExponentialDelayRestartStrategy),
    ],
)
def test_type_aliases(value: str, expected: type) -> None:
    strategy = restart_strategy_from_config({"restart-strategy.type": value}, True)
    assert isinstance(strategy, expected)


def test_deprecated_type_key_and_unrelated_keys() -> None:
    conf: dict[str, ConfigValue] = {
        "restart-strategy": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "3",
        "restart-strategy.fixed-delay.delay": "10 s",
        "execution.checkpointing.interval": "1 min",
    }
    strategy = restart_strategy_from_config(conf, checkpointing_enabled=False)
    assert isinstance(strategy, FixedDelayRestartStrategy)
    assert (strategy.attempts, strategy.delay_ms) == (3, 10_000)


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("10 s", 10_000),
        ("1 min", 60_000),
        ("500 ms", 500),
        ("1s", 1_000),
        (250, 250),
        ("100", 100),
        ("2h", 7_200_000),
        ("1 d", 86_400_000),
        ("3 MIN", 180_000),
        ("5 minutes", 300_000),
        ("1m", 60_000),
        ("1500 us", 1),
    ],
)
def test_durations(value: ConfigValue, ms: int) -> None:
    assert parse_duration_ms(value) == ms


FIXED, RATE, EXP = "fixed-delay", "failure-rate", "exponential-delay"


@pytest.mark.parametrize(
    ("kind", "key", "value", "message"),
    [
        ("sometimes", None, None, "restart-strategy.type: unknown restart strategy 'sometimes'"),
        (FIXED, "attempt", 3, "unknown restart strategy option 'restart-strategy.fixed-delay.att"),
        (FIXED, "delay", "ten s", "restart-strategy.fixed-delay.delay: invalid duration 'ten s'"),
        (FIXED, "delay", "10 parsecs", "fixed-delay.delay: invalid duration '10 parsecs'"),
        (FIXED, "delay", -5, "restart-strategy.fixed-delay.delay: invalid duration -5: negative"),
        (FIXED, "delay", 1.5, "restart-strategy.fixed-delay.delay: invalid duration 1.5"),
        (FIXED, "attempts", -1, "fixed-delay.attempts: invalid value -1: must be >= 0"),
        (FIXED, "attempts", "three", "fixed-delay.attempts: invalid integer 'three'"),
        (FIXED, "attempts", True, "restart-strategy.fixed-delay.attempts: invalid integer True"),
        (RATE, "max-failures-per-interval", 0, "max-failures-per-interval: invalid value 0"),
        (RATE, "failure-rate-interval", "0 s", "failure-rate-interval: invalid value 0: must be"),
        (EXP, "backoff-multiplier", "abc", "backoff-multiplier: invalid number 'abc'"),
        (EXP, "backoff-multiplier", 1, "backoff-multiplier: invalid value 1.0: must be > 1"),
        (EXP, "jitter-factor", "1.5", "jitter-factor: invalid value 1.5: must be in [0, 1]"),
        (EXP, "initial-backoff", "2 min", "initial-backoff: invalid value 120000: above max-b"),
        (EXP, "attempts-before-reset-backoff", 0, "reset-backoff: invalid value 0: must be >= 1"),
    ],
)
def test_invalid_options_name_the_key_and_the_value(
    kind: str, key: str | None, value: ConfigValue, message: str
) -> None:
    conf: dict[str, ConfigValue] = {"restart-strategy.type": kind}
    if key is not None:
        conf[f"restart-strategy.{kind}.{key}"] = value
    with pytest.raises(ConfigurationError) as err:
        restart_strategy_from_config(conf, checkpointing_enabled=True)
    assert message in str(err.value)
    assert (key or kind) in str(err.value)


@pytest.mark.parametrize(
    "strategy",
    [
        NoRestartStrategy(),
        FixedDelayRestartStrategy(attempts=3, delay_ms=10_000),
        FailureRateRestartStrategy(3, 300_000, 1_500),
        ExponentialDelayRestartStrategy(500, 120_000, 1.4, 600_000, 0.2, 10),
    ],
)
def test_to_config_round_trips(strategy: RestartStrategy) -> None:
    rebuilt = restart_strategy_from_config(strategy.to_config(), checkpointing_enabled=True)
    assert type(rebuilt) is type(strategy)
    assert rebuilt.to_config() == strategy.to_config()
    assert rebuilt.describe() == strategy.describe()


def test_describe() -> None:
    assert NoRestartStrategy().describe() == "none: no restart"
    assert FixedDelayRestartStrategy(3, 10_000).describe() == (
        "fixed-delay: up to 3 restarts, 10 s apart"
    )
    assert FailureRateRestartStrategy(3, 300_000, 10_000).describe() == (
        "failure-rate: at most 3 failures per 5 min, restarts 10 s apart"
    )
    assert ExponentialDelayRestartStrategy().describe() == (
        "exponential-delay: 1 s x 1.5 up to 1 min, jitter 0.1, reset after 1 h running, "
        "no attempt limit"
    )
    assert (
        ExponentialDelayRestartStrategy(attempts_before_reset_backoff=8)
        .describe()
        .endswith("at most 8 attempts")
    )


def test_format_duration_uses_the_largest_exact_unit() -> None:
    assert [format_duration(ms) for ms in (0, 1, 1_500, 60_000, 90_000, 3_600_000, 86_400_000)] == [
        "0 ms",
        "1 ms",
        "1500 ms",
        "1 min",
        "90 s",
        "1 h",
        "1 d",
    ]
