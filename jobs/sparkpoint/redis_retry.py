"""How the jobs' side talks to a Redis that may be away: retry while it is unavailable (down,
or refusing for a reason that passes by itself), fail at once when it refuses the request.

:func:`retrying` runs every Redis call of :mod:`sparkpoint.transport` and of the driver's
lease; :class:`RedisUnreachableError` is what a connected driver ends on (exit 75: the next
one waits for Redis again), :class:`TransportError` any other failure.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import redis

from sparkpoint.clock import Clock, SystemClock
from sparkpoint.env_settings import positive_seconds
from sparkpoint.errors import SparkpointError
from sparkpoint.redis_connection import client_url

log = logging.getLogger(__name__)

RETRY_FOR_S = 30.0  # how long a call keeps retrying while Redis is unavailable, by default
#: Overrides :data:`RETRY_FOR_S` (seconds): how long a Redis outage or failover a driver waits
#: out before it ends as lost (``sparkpoint run`` then starts the next, which waits again).
RETRY_WINDOW_ENV = "SPARKPOINT_REDIS_RETRY_WINDOW"

_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError)
# Refusals that pass without anyone changing the request: Redis cannot write its disk
# (MISCONF: the disk is full, its persistence failed), a replica answers during a failover
# (READONLY, MASTERDOWN, NOREPLICAS), Redis is at its memory limit (OOM), a cluster moves
# slots (TRYAGAIN, CLUSTERDOWN). redis-py raises a class of its own for some (and drops the
# code from the message); the others keep their code first, or after a script's ": -". A
# pipeline's error ends "caused error: <the reply>", after the command and its arguments.
_PASSING_REFUSAL_TYPES = (
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)
_PASSING_REFUSAL = re.compile(
    r"(?:^|: -)(MISCONF|READONLY|MASTERDOWN|NOREPLICAS|OOM|TRYAGAIN|CLUSTERDOWN) "
)
_PIPELINE_REPLY = "caused error: "
_T = TypeVar("_T")


class TransportError(SparkpointError):
    """Redis could not be reached (or refused a write); the message names the URL and stream."""


class RedisUnreachableError(TransportError):
    """Redis stayed unavailable for the retry window: unreachable (no connection, or none that
    answered), or refusing with a refusal that passes (a full disk, a failover; see
    :func:`passing_refusal`)."""


def retry_window_s(environ: Mapping[str, str] = os.environ) -> float:
    """How long a Redis call keeps retrying while Redis is unavailable:
    ``SPARKPOINT_REDIS_RETRY_WINDOW`` seconds, or :data:`RETRY_FOR_S`.

    Raises:
        ConfigurationError: the variable is not a positive number of seconds.
    """
    seconds = positive_seconds(environ, RETRY_WINDOW_ENV)
    return RETRY_FOR_S if seconds is None else seconds


def _unavailable(err: redis.RedisError) -> str | None:
    """How Redis is unavailable (``unreachable``, ``refusing``: a wait may mend it), or None
    when it refused the request itself (a wrong password is a connection error to redis-py)."""
    if isinstance(err, _CONNECTION_ERRORS) and not isinstance(err, redis.AuthenticationError):
        return "unreachable"
    return "refusing" if passing_refusal(err) else None


def passing_refusal(err: redis.RedisError) -> bool:
    """Whether Redis refused for a reason that passes by itself (its disk full, a failover, its
    memory limit), not because of the request (a wrong password, a missing permission)."""
    if isinstance(err, _PASSING_REFUSAL_TYPES):
        return True
    reply = str(err).rpartition(_PIPELINE_REPLY)[2]  # not the command's arguments
    return isinstance(err, redis.ResponseError) and bool(_PASSING_REFUSAL.search(reply))


def retrying(
    action: Callable[[], _T],
    what: str,
    client: redis.Redis,
    *,
    retry_for_s: float | None = None,
    clock: Clock | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> _T:
    """Run ``action``, retrying with capped exponential backoff while Redis is unreachable or
    refuses for a reason that passes (:func:`passing_refusal`).

    Args:
        action: The Redis call(s); run again while Redis is unavailable.
        what: What the action does, for messages ("publish 3 events to sparkpoint:events").
        client: The client the action uses (its URL goes into the error).
        retry_for_s: Give up once this many seconds passed since the first attempt
            (None: :func:`retry_window_s`).
        clock: The monotonic clock of the deadline (the system clock by default).
        sleep: How to wait between attempts.

    Raises:
        RedisUnreachableError: Redis stayed unreachable, or kept refusing for a reason that
            passes, for ``retry_for_s``.
        TransportError: Redis refused the command for any other reason.
    """
    if retry_for_s is None:
        retry_for_s = retry_window_s()
    clock = clock or SystemClock()
    deadline = clock.monotonic_ms() + retry_for_s * 1000
    delay = 0.1
    attempts = 0
    while True:
        attempts += 1
        try:
            return action()
        except redis.RedisError as err:
            state = _unavailable(err)
            if state is None:
                raise TransportError(
                    f"could not {what}: Redis at {client_url(client)} refused: {err}"
                ) from err
            left_s = (deadline - clock.monotonic_ms()) / 1000
            if left_s <= 0:
                raise RedisUnreachableError(
                    f"could not {what}: Redis at {client_url(client)} {state} "
                    f"after {attempts} attempt(s) over {retry_for_s:g} s: {err}"
                ) from err
            log.warning(
                "could not %s (Redis at %s %s): %s; retrying", what, client_url(client), state, err
            )
            sleep(min(delay, left_s))
            delay = min(delay * 2, 2.0)
