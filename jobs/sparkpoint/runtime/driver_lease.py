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
- Another waits for it to be released or to expire, at most the job's
  ``--control-plane-timeout``, saying so, and is refused then, naming the holder; it never
  touched the job's streams. A driver restarted by a cluster manager (no supervisor) after
  its predecessor died waits at most the lease's time to live.

A driver that finds its lease taken while it runs (its renewals stopped for longer than the
time to live) says so; the control plane's failover to the new driver decides.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from sparkpoint.errors import SparkpointError

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


def lease_ttl_ms(heartbeat_interval_ms: int) -> int:
    return max(MISSED_RENEWALS * heartbeat_interval_ms, MIN_TTL_MS)


def lease_key(prefix: str, job_id: str) -> str:
    return f"{prefix}:driver:{job_id}"


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
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since_ms / 1000))
        return f"pid {self.pid} on {self.host}, since {started}"


class DriverLease:
    """The lease of one driver process (the module docstring)."""

    def __init__(self, client: redis.Redis, key: str, run_id: str, ttl_ms: int) -> None:
        self.client, self.key, self.run_id, self.ttl_ms = client, key, run_id, ttl_ms
        since = int(time.time() * 1000)
        self.value = f"{run_id} {socket.gethostname()} {os.getpid()} {since}"
        self._take = client.register_script(_TAKE)
        self._release = client.register_script(_RELEASE)
        self.held = False
        self._taken_by: str | None = None

    def try_take(self) -> Holder | None:
        """Take or renew the lease; the other holder (and nothing changed) when it has one."""
        answer = self._take(keys=[self.key], args=[self.value, self.run_id, self.ttl_ms])
        if not answer:
            self.held = True
            return None
        return Holder.parse(answer[0], answer[1])

    def acquire(self, job_id: str, timeout_ms: int, say: Callable[[str], None]) -> None:
        """Take the lease, waiting up to ``timeout_ms`` for another holder to release it or
        let it expire; ``say`` is told why, at once and every :data:`SAY_EVERY_S`.

        Raises:
            AnotherDriverError: still held by another driver after ``timeout_ms``.
        """
        started = time.monotonic()
        said_at: float | None = None
        while True:
            holder = self.try_take()
            if holder is None:
                return
            waited = time.monotonic() - started
            if waited * 1000 >= timeout_ms:
                raise AnotherDriverError(
                    f"job {job_id} is running with another driver ({holder.describe()}): a "
                    "job runs one driver at a time. Stop that one first (sparkpoint cancel "
                    f"{job_id}, or end its process), or run this one with another --job-id"
                )
            if said_at is None or waited - said_at >= SAY_EVERY_S:
                said_at = waited
                say(
                    f"job {job_id} runs with another driver ({holder.describe()}): waiting "
                    f"for it to end ({waited:.0f} s of {timeout_ms / 1000:g} s; its lease "
                    f"ends in {max(holder.left_ms, 0) / 1000:.0f} s unless it renews it)"
                )
            time.sleep(min(0.5, timeout_ms / 1000 - waited))

    def renew(self) -> None:
        """Keep the lease (with each heartbeat); say once when another driver took it."""
        try:
            holder = self.try_take()
        except redis.RedisError as err:
            log.warning("%s: lease not renewed: %s", self.key, err)
            return
        if holder is not None and holder.run != self._taken_by:
            self._taken_by = holder.run
            log.warning(
                "%s: another driver (%s) took this job's lease: this driver's renewals "
                "stopped for longer than %d ms; the control plane decides which one runs it",
                self.key,
                holder.describe(),
                self.ttl_ms,
            )

    def release(self) -> None:
        """Give the lease up (if still this driver's): the next driver starts at once."""
        if not self.held:
            return
        try:
            self._release(keys=[self.key], args=[self.value])
        except redis.RedisError as err:
            log.warning("%s: lease not released (it expires): %s", self.key, err)
        self.held = False
