"""Restart strategies: whether and when a failed job restarts (Flink's keys, defaults and rules).

Keys, accepted values and defaults are Flink 1.20's, unchanged in 2.x (``RestartStrategyOptions``
and the "Task Failure Recovery" page of the Flink 1.20 docs); see :data:`DEFAULTS`. With no
``restart-strategy.type`` the strategy is ``exponential-delay`` when checkpointing is enabled and
``none`` otherwise. A strategy is fed failure times (any millisecond clock the caller keeps
consistent) and returns a :class:`RestartDecision`; nothing here sleeps. Parsed durations are
at most ``sparkpoint.limits.MAX_DURATION_MS`` (one year) and counts at most ``MAX_INT`` (Flink's
``int`` options), so that every strategy built here can be stored and run.
"""

from __future__ import annotations

import abc
import math
import random
import re
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from sparkpoint.errors import ConfigurationError
from sparkpoint.limits import MAX_DURATION_MS, MAX_INT

ConfigValue = str | int | float

TYPE_KEY = "restart-strategy.type"
DEPRECATED_TYPE_KEY = "restart-strategy"
FIXED = "restart-strategy.fixed-delay."
RATE = "restart-strategy.failure-rate."
EXP = "restart-strategy.exponential-delay."
INFINITE_ATTEMPTS = MAX_INT  # Flink's Integer.MAX_VALUE, documented as "infinite"

#: Flink 1.20 (and 2.x) defaults of every strategy option.
DEFAULTS: dict[str, ConfigValue] = {
    FIXED + "attempts": 1,
    FIXED + "delay": "1 s",
    RATE + "max-failures-per-interval": 1,
    RATE + "failure-rate-interval": "1 min",
    RATE + "delay": "1 s",
    EXP + "initial-backoff": "1 s",
    EXP + "max-backoff": "1 min",
    EXP + "backoff-multiplier": 1.5,
    EXP + "reset-backoff-threshold": "1 h",
    EXP + "jitter-factor": 0.1,
    EXP + "attempts-before-reset-backoff": INFINITE_ATTEMPTS,
}
_TYPES = {
    **dict.fromkeys(("none", "off", "disable"), "none"),
    **dict.fromkeys(("fixed-delay", "fixeddelay"), "fixed-delay"),
    **dict.fromkeys(("failure-rate", "failurerate"), "failure-rate"),
    **dict.fromkeys(("exponential-delay", "exponentialdelay"), "exponential-delay"),
}


@dataclass(frozen=True)
class RestartDecision:
    """Whether to restart after a failure, after how long, and a sentence saying why."""

    restart: bool
    delay_ms: int
    message: str


#: The decision for a failure that a restart would replay unchanged (a task's configuration
#: error, such as a checkpoint that does not fit the job): the job fails at once, without
#: asking (or counting in) its restart strategy, as Flink's ``SuppressRestartsException``.
SUPPRESSED = RestartDecision(
    False, 0, "a configuration error, which every restart would meet again: the job fails"
)


class RestartStrategy(abc.ABC):
    """Decides, failure by failure, whether and when the job restarts."""

    type_name: ClassVar[str]

    @abc.abstractmethod
    def on_failure(self, now_ms: int) -> RestartDecision:
        """Account for a failure at ``now_ms`` (milliseconds of the caller's clock) and decide."""

    def on_running(self, now_ms: int) -> None:  # noqa: B027 - a hook, empty on purpose
        """Tell the strategy that the job runs again (after a restart) since ``now_ms``."""

    @abc.abstractmethod
    def to_config(self) -> dict[str, ConfigValue]:
        """The Flink options that build this strategy again (without its history)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for people: the strategy and its settings."""


class NoRestartStrategy(RestartStrategy):
    """Never restart: the first failure fails the job."""

    type_name = "none"

    def on_failure(self, now_ms: int) -> RestartDecision:
        return RestartDecision(False, 0, "restart strategy is none: the job fails")

    def to_config(self) -> dict[str, ConfigValue]:
        return {TYPE_KEY: self.type_name}

    def describe(self) -> str:
        return "none: no restart"


class FixedDelayRestartStrategy(RestartStrategy):
    """Restart up to ``attempts`` times, waiting ``delay_ms`` before each restart."""

    type_name = "fixed-delay"

    def __init__(self, attempts: int = 1, delay_ms: int = 1_000) -> None:
        _require(attempts >= 0, FIXED + "attempts", attempts, "must be >= 0")
        _require(delay_ms >= 0, FIXED + "delay", delay_ms, "must be >= 0 ms")
        self.attempts, self.delay_ms = attempts, delay_ms
        self._failures = 0

    def on_failure(self, now_ms: int) -> RestartDecision:
        self._failures += 1
        n, most, delay = self._failures, self.attempts, self.delay_ms
        if n > most:
            return RestartDecision(False, 0, f"fixed-delay: failure {n} exceeds {most} attempts")
        return RestartDecision(
            True, delay, f"fixed-delay: restart {n} of {most} in {format_duration(delay)}"
        )

    def to_config(self) -> dict[str, ConfigValue]:
        return {
            TYPE_KEY: self.type_name,
            FIXED + "attempts": self.attempts,
            FIXED + "delay": format_duration(self.delay_ms),
        }

    def describe(self) -> str:
        delay = format_duration(self.delay_ms)
        return f"fixed-delay: up to {self.attempts} restarts, {delay} apart"


class FailureRateRestartStrategy(RestartStrategy):
    """Restart unless more than ``max_failures_per_interval`` failures fall in one interval.

    As Flink: the job fails when this failure and the ``max_failures_per_interval`` before it
    all lie within ``failure_rate_interval_ms`` (boundary included).
    """

    type_name = "failure-rate"

    def __init__(
        self,
        max_failures_per_interval: int = 1,
        failure_rate_interval_ms: int = 60_000,
        delay_ms: int = 1_000,
    ) -> None:
        max_failures, interval = max_failures_per_interval, failure_rate_interval_ms
        _require(max_failures > 0, RATE + "max-failures-per-interval", max_failures, "must be > 0")
        _require(interval > 0, RATE + "failure-rate-interval", interval, "must be > 0 ms")
        _require(delay_ms >= 0, RATE + "delay", delay_ms, "must be >= 0 ms")
        self.max_failures_per_interval, self.failure_rate_interval_ms = max_failures, interval
        self.delay_ms = delay_ms
        self._failures: deque[int] = deque(maxlen=max_failures + 1)

    def on_failure(self, now_ms: int) -> RestartDecision:
        self._failures.append(now_ms)
        n, interval = len(self._failures), self.failure_rate_interval_ms
        most = self.max_failures_per_interval
        if n > most and now_ms - self._failures[0] <= interval:
            rate = f"{n} failures within {format_duration(interval)} exceed {most}"
            return RestartDecision(False, 0, f"failure-rate: {rate}")
        return RestartDecision(
            True, self.delay_ms, f"failure-rate: restart in {format_duration(self.delay_ms)}"
        )

    def to_config(self) -> dict[str, ConfigValue]:
        return {
            TYPE_KEY: self.type_name,
            RATE + "max-failures-per-interval": self.max_failures_per_interval,
            RATE + "failure-rate-interval": format_duration(self.failure_rate_interval_ms),
            RATE + "delay": format_duration(self.delay_ms),
        }

    def describe(self) -> str:
        window = format_duration(self.failure_rate_interval_ms)
        delay = format_duration(self.delay_ms)
        return (
            f"failure-rate: at most {self.max_failures_per_interval} failures per {window}, "
            f"restarts {delay} apart"
        )


class ExponentialDelayRestartStrategy(RestartStrategy):
    """Restart with a backoff that grows by a multiplier up to a maximum, with jitter.

    As Flink: failures before the scheduled restart merge into it; after
    ``reset_backoff_threshold_ms`` of running without failure the backoff and the attempt count
    start over; more than ``attempts_before_reset_backoff`` attempts fail the job. Running time
    counts from :meth:`on_running` when the host reports it, else from the scheduled restart.
    """

    type_name = "exponential-delay"

    def __init__(
        self,
        initial_backoff_ms: int = 1_000,
        max_backoff_ms: int = 60_000,
        backoff_multiplier: float = 1.5,
        reset_backoff_threshold_ms: int = 3_600_000,
        jitter_factor: float = 0.1,
        attempts_before_reset_backoff: int = INFINITE_ATTEMPTS,
        rng: random.Random | None = None,
    ) -> None:
        initial, most = initial_backoff_ms, max_backoff_ms
        _require(initial >= 1, EXP + "initial-backoff", initial, "must be at least 1 ms")
        _require(most >= 1, EXP + "max-backoff", most, "must be at least 1 ms")
        _require(initial <= most, EXP + "initial-backoff", initial, f"above max-backoff {most}")
        multiplier = backoff_multiplier
        _require(multiplier > 1, EXP + "backoff-multiplier", multiplier, "must be > 1")
        reset = reset_backoff_threshold_ms
        _require(reset >= 1, EXP + "reset-backoff-threshold", reset, "must be at least 1 ms")
        _require(0 <= jitter_factor <= 1, EXP + "jitter-factor", jitter_factor, "must be in [0, 1]")
        attempts = attempts_before_reset_backoff
        _require(attempts >= 1, EXP + "attempts-before-reset-backoff", attempts, "must be >= 1")
        self.initial_backoff_ms, self.max_backoff_ms = initial, most
        self.backoff_multiplier, self.jitter_factor = float(multiplier), float(jitter_factor)
        self.reset_backoff_threshold_ms, self.attempts_before_reset_backoff = reset, attempts
        self._rng = rng if rng is not None else random.Random()
        self._attempt = 0
        self._next_restart_ms: int | None = None
        self._running_since_ms: int | None = None

    def on_running(self, now_ms: int) -> None:
        self._running_since_ms = now_ms

    def on_failure(self, now_ms: int) -> RestartDecision:
        limit, scheduled = self.attempts_before_reset_backoff, self._next_restart_ms
        if scheduled is not None and now_ms <= scheduled:
            delay, attempt = scheduled - now_ms, self._attempt
            message = f"exponential-delay: merged into restart {attempt} due in {delay} ms"
            return RestartDecision(attempt <= limit, delay, message)
        running_since = self._running_since_ms if self._running_since_ms is not None else scheduled
        if running_since is None or now_ms - running_since >= self.reset_backoff_threshold_ms:
            self._attempt = 0
        delay = self._backoff_ms()
        self._next_restart_ms, self._running_since_ms = now_ms + delay, None
        self._attempt += 1
        if self._attempt > limit:
            message = f"exponential-delay: attempt {self._attempt} exceeds {limit} before reset"
            return RestartDecision(False, 0, message)
        message = f"exponential-delay: restart {self._attempt} in {format_duration(delay)}"
        return RestartDecision(True, delay, message)

    def _backoff_ms(self) -> int:
        # Flink's formula; jitter is drawn from [-offset, offset] of the uncapped backoff.
        exponent = self._attempt * math.log(self.backoff_multiplier)
        if exponent + math.log(self.initial_backoff_ms) > math.log(2**62):
            return self.max_backoff_ms  # far beyond the maximum; avoids a float overflow
        current = int(self.initial_backoff_ms * self.backoff_multiplier**self._attempt)
        offset = int(current * self.jitter_factor)
        jitter = self._rng.randint(-offset, offset) if self.jitter_factor > 0 else 0
        return max(self.initial_backoff_ms, min(current + jitter, self.max_backoff_ms))

    def to_config(self) -> dict[str, ConfigValue]:
        return {
            TYPE_KEY: self.type_name,
            EXP + "initial-backoff": format_duration(self.initial_backoff_ms),
            EXP + "max-backoff": format_duration(self.max_backoff_ms),
            EXP + "backoff-multiplier": self.backoff_multiplier,
            EXP + "reset-backoff-threshold": format_duration(self.reset_backoff_threshold_ms),
            EXP + "jitter-factor": self.jitter_factor,
            EXP + "attempts-before-reset-backoff": self.attempts_before_reset_backoff,
        }

    def describe(self) -> str:
        limit = self.attempts_before_reset_backoff
        attempts = f"at most {limit} attempts" if limit < INFINITE_ATTEMPTS else "no attempt limit"
        return (
            f"exponential-delay: {format_duration(self.initial_backoff_ms)} x "
            f"{self.backoff_multiplier:g} up to {format_duration(self.max_backoff_ms)}, "
            f"jitter {self.jitter_factor:g}, reset after "
            f"{format_duration(self.reset_backoff_threshold_ms)} running, {attempts}"
        )


# ----------------------------------------------------------------------------- configuration


def restart_strategy_from_config(
    conf: dict[str, ConfigValue], checkpointing_enabled: bool, *, rng: random.Random | None = None
) -> RestartStrategy:
    """Build the restart strategy that Flink would build from these options.

    Args:
        conf: options by Flink key; keys outside ``restart-strategy`` are ignored.
        checkpointing_enabled: decides the default when no type is set.
        rng: the random source of exponential-delay's jitter (seed it in tests).

    Raises:
        ConfigurationError: for an unknown ``restart-strategy.*`` key, an unknown type, or a
            value that is malformed or out of range; the message names the key and the value.
    """
    known = {TYPE_KEY, *DEFAULTS}
    unknown = sorted(k for k in conf if k.startswith(DEPRECATED_TYPE_KEY + ".") and k not in known)
    if unknown:
        raise ConfigurationError(
            f"unknown restart strategy option {unknown[0]!r}; known: {', '.join(sorted(known))}"
        )
    raw = conf.get(TYPE_KEY, conf.get(DEPRECATED_TYPE_KEY))
    kind = _TYPES.get(str(raw).strip().lower()) if raw is not None else None
    if raw is None:
        kind = "exponential-delay" if checkpointing_enabled else "none"
    elif kind is None:
        raise ConfigurationError(
            f"{TYPE_KEY}: unknown restart strategy {raw!r}; expected one of {', '.join(_TYPES)}"
        )
    if kind == "none":
        return NoRestartStrategy()
    if kind == "fixed-delay":
        return FixedDelayRestartStrategy(_int(conf, FIXED + "attempts"), _ms(conf, FIXED + "delay"))
    if kind == "failure-rate":
        return FailureRateRestartStrategy(
            _int(conf, RATE + "max-failures-per-interval"),
            _ms(conf, RATE + "failure-rate-interval"),
            _ms(conf, RATE + "delay"),
        )
    return ExponentialDelayRestartStrategy(
        _ms(conf, EXP + "initial-backoff"),
        _ms(conf, EXP + "max-backoff"),
        _float(conf, EXP + "backoff-multiplier"),
        _ms(conf, EXP + "reset-backoff-threshold"),
        _float(conf, EXP + "jitter-factor"),
        _int(conf, EXP + "attempts-before-reset-backoff"),
        rng=rng,
    )


# Flink's TimeUtils units, by name; a number without a unit is milliseconds.
_UNITS_MS: dict[str, float] = {
    name: ms
    for names, ms in (
        ("d day days", 86_400_000.0),
        ("h hour hours", 3_600_000.0),
        ("min m minute minutes", 60_000.0),
        ("s sec secs second seconds", 1_000.0),
        ("ms milli millis millisecond milliseconds", 1.0),
        ("us µs micro micros microsecond microseconds", 1e-3),
        ("ns nano nanos nanosecond nanoseconds", 1e-6),
    )
    for name in names.split()
}
_DURATION = re.compile(r"^\s*(\d+)\s*([a-zµ]*)\s*$")
_INTEGER = re.compile(r"^\s*(-?\d+)\s*$")
_MAX_DIGITS = 30  # a longer number is out of range anyway (and slow to convert)


def parse_duration_ms(value: ConfigValue, key: str = "duration") -> int:
    """Milliseconds of a Flink duration (``"10 s"``, ``"1 min"``, ``"500 ms"``, ``"1s"``) or int.

    Raises:
        ConfigurationError: naming ``key`` and the value when it is not a valid duration, or
            is longer than ``MAX_DURATION_MS`` (one year).
    """
    if isinstance(value, (bool, float)):
        raise ConfigurationError(f"{key}: invalid duration {value!r} (use an int of ms or '10 s')")
    if isinstance(value, int):
        if value < 0:
            raise ConfigurationError(f"{key}: invalid duration {value!r}: negative")
        return _at_most_a_year(value, value, key)
    match = _DURATION.match(str(value).lower())
    unit_ms = _UNITS_MS.get(match.group(2) or "ms") if match else None
    if match is None or unit_ms is None:
        raise ConfigurationError(
            f"{key}: invalid duration {_shown(value)}; expected a number and a unit "
            "(ms, s, min, h, d), for example '10 s'"
        )
    digits = match.group(1).lstrip("0")
    ms = int(int(digits or "0") * unit_ms) if len(digits) <= _MAX_DIGITS else MAX_DURATION_MS + 1
    return _at_most_a_year(ms, value, key)


def _at_most_a_year(ms: int, value: ConfigValue, key: str) -> int:
    if ms > MAX_DURATION_MS:
        raise ConfigurationError(
            f"{key}: invalid duration {_shown(value)}: longer than the maximum of "
            f"{format_duration(MAX_DURATION_MS)} ({MAX_DURATION_MS} ms)"
        )
    return ms


def _shown(value: ConfigValue) -> str:
    """``repr(value)``, cut short: an error message never echoes a huge value whole."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def format_duration(ms: int) -> str:
    """A duration in its largest exact unit, as Flink writes them: ``"1 min"``, ``"500 ms"``."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _int(conf: dict[str, ConfigValue], key: str) -> int:
    """An integer option, at most ``MAX_INT`` (the constructors check the lower bounds)."""
    value = conf.get(key, DEFAULTS[key])
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and (match := _INTEGER.match(value)) and len(value) <= 40:
        number = int(match.group(1))
    else:
        raise ConfigurationError(f"{key}: invalid integer {_shown(value)}")
    if number > MAX_INT:
        raise ConfigurationError(f"{key}: invalid value {_shown(value)}: must be at most {MAX_INT}")
    return number


def _float(conf: dict[str, ConfigValue], key: str) -> float:
    value = conf.get(key, DEFAULTS[key])
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ConfigurationError(f"{key}: invalid number {value!r}")
    return number


def _ms(conf: dict[str, ConfigValue], key: str) -> int:
    return parse_duration_ms(conf.get(key, DEFAULTS[key]), key)


def _require(ok: bool, key: str, value: object, rule: str) -> None:
    if not ok:
        raise ConfigurationError(f"{key}: invalid value {value!r}: {rule}")
