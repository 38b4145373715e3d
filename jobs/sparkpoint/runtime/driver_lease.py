"""One driver at a time for a connected job: a lease in Redis.

A second ``sparkpoint run --job-id J`` while J's driver runs (a user who thought it dead, a
copy of a command line) used to register as a restarted driver: the control plane failed the
running job over to it, the two processes shared the job's command stream (its one consumer
group handed each command to one of them), and the job made no checkpoint until the
heartbeat timeout gave it up. Flink refuses a job id that is running.

A connected driver holds ``<prefix>:driver:<job-id>`` before it opens the command stream or
registers. The value names who holds it (the ``sparkpoint run`` invocation, the host, the
process, since when); it expires after :func:`lease_ttl_ms` unless renewed (with every
heartbeat), and the driver deletes it when it ends.

- The same ``sparkpoint run`` (``SPARKPOINT_RUN_ID``, set by its supervisor for every
  driver it starts) takes it over at once: its previous driver process ended before it
  started this one.
- Another waits for it to be released or to expire, saying so: the job's
  ``--control-plane-timeout``, and at least until the lease it found would expire, so that a
  driver restarted by a cluster manager (no supervisor) after its predecessor died takes it
  over. Still held then, it is refused, naming the holder; it never touched the job's
  streams. A cancel (SIGTERM, SIGINT) ends the wait.

A driver whose lease another driver took while it ran (it was paused, or cut off from Redis,
for longer than the time to live) is fenced off: it reads no command more (the job's one
consumer group would hand it commands meant for the new driver), sends no heartbeat, and ends
with :class:`DriverSupersededError` without telling the control plane anything (exit 1; its
supervisor starts no other driver). Each read of the command stream checks the lease first
(:meth:`DriverLease.check`): at no cost while renewals come in time, with one Redis call once
the last renewal is older than two thirds of the time to live. Flink's JobMaster that loses its
leadership stops the same way.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from sparkpoint.clock import Clock, SystemClock
from sparkpoint.errors import SparkpointError
from sparkpoint.redis_retry import retry_window_s
from sparkpoint.transport import retrying

log = logging.getLogger(__name__)

#: Set by ``sparkpoint run`` for every driver it starts: the drivers of one invocation.
RUN_ID_ENV = "SPARKPOINT_RUN_ID"
#: Renewals a lease survives missing (it is renewed with every driver heartbeat).
MISSED_RENEWALS = 3
MIN_TTL_MS = 3_000
SAY_EVERY_S = 5.0

# Take the lease if it is free or held by the same run (ARGV[2]); else answer its holder and
# the milliseconds it has left.
_TAKE = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, string.len(ARGV[2]) + 1) ~= ARGV[2] .. ' ' then
  return {held, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return false
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class AnotherDriverError(SparkpointError):
    """The job runs with another driver process: a job runs one driver at a time."""


class DriverSupersededError(AnotherDriverError):
    """Another driver took this running driver's lease: this one stops, touching nothing."""


def lease_ttl_ms(heartbeat_interval_ms: int) -> int:
    return max(MISSED_RENEWALS * heartbeat_interval_ms, MIN_TTL_MS)


def lease_key(prefix: str, job_id: str) -> str:
    return f"{prefix}:driver:{job_id}"


def describe_process(pid: object, host: str, since_ms: int) -> str:
    """``pid 4242 on host-a, since 2026-12-06 11:01:51 UTC``: who holds a driver's lock."""
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since_ms / 1000))
    return f"pid {pid} on {host}, since {started}"


@dataclass(frozen=True)
class Holder:
    """Who holds a job's lease, from its value ``<run> <host> <pid> <since ms>``."""

    run: str
    host: str
    pid: str
    since_ms: int
    left_ms: int

    @classmethod
    def parse(cls, raw: Any, left_ms: Any) -> Holder:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        run, host, pid, since = [*text.split(" ", 3), "", "", "", "0"][:4]
        return cls(run, host, pid, int(since) if since.isdigit() else 0, int(left_ms))

    def describe(self) -> str:
        return describe_process(self.pid, self.host, self.since_ms)


class DriverLease:
    """The lease of one driver process (the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        run_id: str,
        ttl_ms: int,
        *,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client, self.key, self.run_id, self.ttl_ms = client, key, run_id, ttl_ms
        self.clock, self.sleep = clock or SystemClock(), sleep
        since = self.clock.now_ms()
        self.value = f"{run_id} {socket.gethostname()} {os.getpid()} {since}"
        self._take = client.register_script(_TAKE)
        self._release = client.register_script(_RELEASE)
        self._lock = threading.Lock()  # renewals (heartbeat thread) against the release
        self._released = False
        # When the last take or renewal that held was sent: monotonic, and wall-clock time
        # (the monotonic clock stands still while a host or VM is suspended).
        self._held_at: tuple[float, int] | None = None
        self._lost: Holder | None = None  # the driver that took the lease over from this one

    def try_take(self, *, retry_for_s: float = 0) -> Holder | None:
        """Take or renew the lease; the other holder (and nothing changed) when it has one.

        Raises:
            TransportError: Redis stayed unreachable for ``retry_for_s`` or refused the script.
        """
        sent_at = (self.clock.monotonic_ms(), self.clock.now_ms())
        answer = retrying(
            lambda: self._take(keys=[self.key], args=[self.value, self.run_id, self.ttl_ms]),
            f"take the lease {self.key}",
            self.client,
            retry_for_s=retry_for_s,
        )
        if not answer:
            self._held_at = sent_at  # it expires ttl_ms after Redis ran it: not sooner
            return None
        return Holder.parse(answer[0], answer[1])

    def acquire(
        self,
        job_id: str,
        timeout_ms: int,
        say: Callable[[str], None],
        stop: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Take the lease, waiting for another holder to release it or let it expire: up to
        ``timeout_ms``, and at least until the holder's lease as first seen and this one's
        time to live ran out (a holder that died without releasing it is always outlived);
        ``say`` is told why, at once and every :data:`SAY_EVERY_S`. False: ``stop()`` (a
        cancel) ended the wait, or came once it was taken (then it is released again).

        Raises:
            AnotherDriverError: still held by another driver after that wait.
            TransportError: Redis stayed unreachable (as for any command of the job's).
        """
        started = self.clock.monotonic_ms()
        deadline_ms = max(timeout_ms, self.ttl_ms + 1000)
        said_at: float | None = None
        while not stop():
            holder = self.try_take(retry_for_s=retry_window_s())
            if holder is None:
                if stop():
                    self.release()
                    return False
                return True
            waited = (self.clock.monotonic_ms() - started) / 1000
            if said_at is None:
                deadline_ms = max(deadline_ms, holder.left_ms + 1000)
            if waited * 1000 >= deadline_ms:
                raise AnotherDriverError(
                    f"job {job_id} is running with another driver ({holder.describe()}): a "
                    "job runs one driver at a time. Stop that one first (sparkpoint cancel "
                    f"{job_id}, or end its process), or run this one with another --job-id"
                )
            if said_at is None or waited - said_at >= SAY_EVERY_S:
                said_at = waited
                wait_s = round(deadline_ms / 1000, 1)
                say(
                    f"job {job_id} runs with another driver ({holder.describe()}): waiting "
                    f"for it to end ({waited:.0f} s of {wait_s:g} s; its lease ends in "
                    f"{max(holder.left_ms, 0) / 1000:.0f} s unless it renews it)"
                )
            self.sleep(min(0.5, deadline_ms / 1000 - waited))
        return False

    def renew(self) -> None:
        """Keep the lease (with each heartbeat); a failure is logged, and the next heartbeat
        renews it again. Found held by another driver: this one is fenced off (:attr:`lost`)."""
        with self._lock:
            if self._released or self._lost is not None:
                return
            try:
                holder = self.try_take()
            except SparkpointError as err:
                log.warning("%s: lease not renewed: %s", self.key, err)
                return
            if holder is not None:
                self._superseded(holder)

    @property
    def lost(self) -> bool:
        """Another driver took the lease over from this one (it stops: the module docstring)."""
        return self._lost is not None

    def check(self, job_id: str) -> None:
        """Before this driver reads a command: make sure it still holds the lease. Free while
        renewals come in time; once the last one is older than two thirds of the time to live
        (the heartbeat thread was held up, the process paused), renewed here and now.

        Raises:
            DriverSupersededError: another driver took the lease over; this one must stop
                without touching the job (its commands, its events, its sinks).
        """
        held_at, late_ms = self._held_at, self.ttl_ms * 2 / 3
        if self._lost is None and held_at is not None:
            mono, wall = held_at
            now_mono, now_wall = self.clock.monotonic_ms(), self.clock.now_ms()
            if now_mono - mono >= late_ms or now_wall - wall >= late_ms:
                self.renew()
        if self._lost is not None:
            raise DriverSupersededError(
                f"job {job_id} was taken over by another driver ({self._lost.describe()}): "
                f"this driver held its lease for no more than {self.ttl_ms / 1000:g} s (it was "
                "paused, or cut off from Redis), so that driver took the job; this one stops "
                "without touching the job. See the job's state with `sparkpoint list`"
            )

    def _superseded(self, holder: Holder) -> None:
        self._lost = holder
        log.warning(
            "%s: another driver (%s) took this job's lease: this driver's renewals stopped for "
            "longer than %d ms; it reads no command and sends no heartbeat more, and stops",
            self.key,
            holder.describe(),
            self.ttl_ms,
        )

    def release(self) -> None:
        """Give the lease up for good (if still this driver's): the next driver starts at
        once, and no renewal takes it again."""
        with self._lock:
            if self._released:
                return
            self._released = True
            try:
                retrying(
                    lambda: self._release(keys=[self.key], args=[self.value]),
                    f"release the lease {self.key}",
                    self.client,
                    retry_for_s=0,
                )
            except SparkpointError as err:
                log.warning("%s: lease not released (it expires): %s", self.key, err)
