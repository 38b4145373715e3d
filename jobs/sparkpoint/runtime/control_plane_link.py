"""The Redis side of a connected driver: where it sends its events and reads its commands."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

import redis

from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.options import JobOptions
from sparkpoint.redis_retry import retry_window_s
from sparkpoint.runtime.driver_lease import RUN_ID_ENV, DriverLease, lease_key, lease_ttl_ms
from sparkpoint.runtime.heartbeats import (
    HEARTBEAT_INTERVAL_MS,
    DriverHeartbeats,
    heartbeat_interval_ms,
    previous_failure,
)
from sparkpoint.signing import CommandVerifier, Signer, driver_job_key
from sparkpoint.transport import (
    CommandChannel,
    ControlPlaneLostError,
    RedisEventSink,
    RedisUnreachableError,
    Streams,
    redis_client,
)


@dataclass(frozen=True)
class ControlPlaneLink:
    """The Redis side of a connected driver: its event sink and its command channel."""

    client: redis.Redis
    streams: Streams
    events: RedisEventSink
    channel: CommandChannel
    incarnation: str  # a nonce of this driver process; names its consumer too
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS
    previous_failure: str | None = None  # why the previous driver process ended
    heartbeats: DriverHeartbeats | None = field(default=None, compare=False)
    lease: DriverLease | None = field(default=None, compare=False)  # one driver at a time

    @classmethod
    def connect(cls, options: JobOptions) -> ControlPlaneLink:
        """The link of a job's options (``--redis-url``, ``--stream-prefix``), signing its
        events and checking its commands with the job's key (:mod:`sparkpoint.signing`): the
        main thread's events and the heartbeats are two senders, each numbered in order.

        Raises:
            ConfigurationError: no Redis URL, or a malformed one; no job key; a malformed
                heartbeat interval or Redis retry window.
        """
        if not options.redis_url:
            raise ConfigurationError(
                f"job {options.job_id} runs connected to a control plane but has no Redis URL: "
                "start `sparkpoint server`, set REDIS_URL or --redis-url, or use --standalone"
            )
        interval_ms = heartbeat_interval_ms(options.job_id, os.environ)
        retry_window_s(os.environ)  # a malformed window fails the start, not the first outage
        key = driver_job_key(options.job_id, os.environ)
        client = redis_client(options.redis_url)
        streams = Streams(options.stream_prefix)
        incarnation = uuid.uuid4().hex
        lease = DriverLease(
            client,
            lease_key(streams.prefix, options.job_id),
            os.environ.get(RUN_ID_ENV) or incarnation,
            lease_ttl_ms(interval_ms),
        )
        return cls(
            client=client,
            streams=streams,
            events=RedisEventSink(client, streams, signer=Signer(lambda _: key, incarnation)),
            channel=CommandChannel(
                client,
                options.job_id,
                incarnation,
                streams,
                verifier=CommandVerifier(key),
                fence=lambda: lease.check(options.job_id),
            ),
            incarnation=incarnation,
            heartbeat_interval_ms=interval_ms,
            previous_failure=previous_failure(os.environ),
            heartbeats=DriverHeartbeats(
                RedisEventSink(
                    client,
                    streams,
                    retry_for_s=0,
                    signer=Signer(lambda _: key, f"hb-{incarnation}"),
                ),
                options.job_id,
                incarnation,
                interval_ms,
                lease=lease,
            ),
            lease=lease,
        )

    def raise_if_lost(self, err: SparkpointError, registered: bool) -> None:
        """Raise :class:`ControlPlaneLostError` for ``err`` when it is Redis that stayed
        unavailable (past its retry window, :func:`~sparkpoint.redis_retry.retry_window_s`:
        down, or refusing for a reason that passes, such as a full disk or a failover) once
        this driver had registered, or in a driver that ``sparkpoint run`` started again: its
        next driver waits for Redis in turn (each driver a window, then the next). Unreachable
        at a run's first start, Redis stays an error (exit 1): a wrong ``--redis-url`` is not
        retried for ever; so does a refusal of the request itself (a wrong password, no permission),
        which no wait mends."""
        if isinstance(err, RedisUnreachableError) and (registered or self.previous_failure):
            raise ControlPlaneLostError(
                f"lost the control plane's Redis: {err}; the next driver registers again "
                "once it is back, and the job fails over to its latest checkpoint"
            ) from err
