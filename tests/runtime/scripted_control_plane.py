"""A minimal control plane for the connected driver's tests: a thread that plays its role.

It reads the events stream (``XREAD``) and answers with :func:`send_command`, as
``docs/control-plane.md`` describes, around the real pure
:class:`~sparkpoint.checkpointing.coordinator.CheckpointCoordinator`:

- ``job_registered``: ``restore`` attempt 1 (from ``from_checkpoint`` if the job gave one);
- ``heartbeat``: trigger a checkpoint when none is pending (the pacing of the tests);
- ``snapshot_completed``: once every subtask acknowledged, write ``_metadata`` to the job's
  checkpoint storage, then send ``checkpoint_complete``; declines abort;
- ``end_of_input``: trigger the final checkpoint;
- ``task_failed``: fail over (``restore`` of the latest completed checkpoint under a new
  attempt), or ``cancel`` as FAILED past ``max_failovers``.

Messages are authenticated as with the real control plane (``sparkpoint.signing``): while it
runs it gives drivers of this process its key in ``SPARKPOINT_JOB_KEY``, verifies every event
(an unsigned, forged or replayed one stops it with :attr:`error`) and signs its commands.

Tests script the rest through ``on_event`` (called after each event, in the thread), with
:meth:`restore_to`, :meth:`cancel`, :meth:`stop_with_savepoint` and :meth:`send`.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

import redis

from sparkpoint import protocol as p
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.coordinator import CheckpointCoordinator
from sparkpoint.checkpointing.pending import CompletedCheckpoint, FailoverDecision
from sparkpoint.checkpointing.storage import CheckpointStorage, checkpoint_storage_from_options
from sparkpoint.clock import SystemClock
from sparkpoint.errors import StaleAttemptError
from sparkpoint.runtime.recovery import checkpoint_metadata
from sparkpoint.signing import JOB_KEY_ENV, Signer, verify
from sparkpoint.transport import FIELD, Streams, send_command

TERMINAL = {p.JobStatus.FINISHED, p.JobStatus.CANCELED, p.JobStatus.FAILED}
Hook = Callable[["ScriptedControlPlane", p.Envelope, Any], None]


class ScriptedControlPlane:
    """One job's control plane, in a thread; :attr:`error` holds what broke it, if anything."""

    def __init__(
        self,
        client: redis.Redis,
        streams: Streams,
        *,
        on_event: Hook | None = None,
        max_failovers: int = 2,
        withhold_completions: bool = False,
        completions_on_request: bool = False,
        burst: int = 0,
    ) -> None:
        self.client = client
        self.streams = streams
        self.on_event = on_event
        self.max_failovers = max_failovers
        self.burst = burst  # regular checkpoints triggered at once right after the start
        self._withhold = withhold_completions  # complete, but tell the job only on release()
        self.withheld: list[int] = []
        self._release = threading.Event()
        # Regular completions wait for send_withheld() (the final one goes at once).
        self._on_request = completions_on_request
        self._send_withheld = threading.Event()
        self.clock = SystemClock()
        self.job_id = ""
        self.incarnation: str | None = None
        self.coordinator: CheckpointCoordinator | None = None
        self.storage: CheckpointStorage | None = None
        self.received: list[tuple[p.Envelope, Any]] = []
        self.sent: list[p.Envelope] = []
        self.sent_ids: list[str] = []
        self.completed: dict[int, CompletedCheckpoint] = {}
        self.failovers = 0
        self.error: BaseException | None = None
        self._end_of_input = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scripted-control-plane")
        self.key = secrets.token_bytes(32)
        self.signer = Signer(lambda _: self.key, f"scripted-{secrets.token_hex(8)}")
        self._last_seq: dict[str, int] = {}
        self._saved_key: str | None = None

    # ------------------------------------------------------------------ thread
    def __enter__(self) -> ScriptedControlPlane:
        self._saved_key = os.environ.get(JOB_KEY_ENV)
        os.environ[JOB_KEY_ENV] = self.key.hex()
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:  # the job ended: read up to its terminal status, which stops us
            self._thread.join(timeout=30)
        self._stop.set()
        self._thread.join(timeout=10)
        if self._saved_key is None:
            os.environ.pop(JOB_KEY_ENV, None)
        else:
            os.environ[JOB_KEY_ENV] = self._saved_key

    def _authentic(self, env: p.Envelope) -> None:
        """Raise unless ``env`` is signed with the key and new from its sender."""
        reason = verify(self.key, env)
        if reason is None:
            assert env.sender is not None and env.seq is not None
            last = self._last_seq.get(env.sender, 0)
            if env.seq <= last:
                reason = f"replayed (seq {env.seq} of {env.sender}, last {last})"
            self._last_seq[env.sender] = env.seq
        if reason is not None:
            raise AssertionError(f"{env.type} event of job {env.job_id}: {reason}")

    def _loop(self) -> None:
        last = "0-0"
        try:
            while not self._stop.is_set():
                answer = self.client.xread({self.streams.events: last}, count=100, block=100)
                for _stream, entries in answer or []:
                    for entry_id, fields in entries:
                        last = entry_id.decode()
                        env, payload = p.decode(fields[FIELD])
                        self._authentic(env)
                        self.received.append((env, payload))
                        self._handle(env, payload)
                        if self.on_event is not None:
                            self.on_event(self, env, payload)
                if self._send_withheld.is_set():
                    self._send_withheld.clear()
                    withheld, self.withheld = self.withheld, []
                    for checkpoint_id in withheld:
                        self.send(p.NotifyCheckpointComplete(checkpoint_id=checkpoint_id))
                if self._release.is_set() and self._withhold:
                    self._withhold = False
                    for checkpoint_id in self.withheld:
                        self.send(p.NotifyCheckpointComplete(checkpoint_id=checkpoint_id))
        except BaseException as err:  # surfaced by the test through .error
            self.error = err

    # ------------------------------------------------------------------ what it received
    def of_type(self, kind: type[Any]) -> list[tuple[p.Envelope, Any]]:
        return [(e, pl) for e, pl in self.received if isinstance(pl, kind)]

    def sent_payloads(self, kind: type[Any]) -> list[Any]:
        name = kind.model_fields["type"].default
        return [env.decoded() for env in self.sent if env.type == name]

    def release(self) -> None:
        """Send the withheld ``checkpoint_complete`` commands, and every later one at once."""
        self._release.set()

    def send_withheld(self) -> None:
        """With ``completions_on_request``: send the completions withheld so far (from the
        control plane's thread, within 0.1 s)."""
        self._send_withheld.set()

    @property
    def attempt(self) -> int:
        assert self.coordinator is not None
        return self.coordinator.attempt

    # ------------------------------------------------------------------ commands
    def send(self, payload: Any, attempt: int | None = None) -> None:
        env = p.envelope(self.job_id, self.attempt if attempt is None else attempt, 0, payload)
        self.sent.append(env)
        self.sent_ids.append(
            send_command(
                self.client,
                self.streams,
                self.job_id,
                env.attempt,
                self.clock.now_ms(),
                payload,
                signer=self.signer,
            )
        )

    def restore_to(self, checkpoint_id: int) -> None:
        """A user's restore of a retained checkpoint while the job runs."""
        assert self.coordinator is not None
        self._send_restore(self.coordinator.restore_to(checkpoint_id))

    def cancel(self, status: p.JobStatus = p.JobStatus.CANCELED, cause: str | None = None) -> None:
        self.send(p.CancelJob(status=status, cause=cause))

    def stop_with_savepoint(self) -> int:
        assert self.coordinator is not None
        pending = self.coordinator.trigger(p.CheckpointKind.SAVEPOINT)
        self.send(
            p.StopWithSavepoint(
                checkpoint_id=pending.checkpoint_id, trigger_timestamp=pending.trigger_timestamp
            )
        )
        return pending.checkpoint_id

    def _trigger(self, *, is_final: bool = False) -> None:
        assert self.coordinator is not None
        pending = self.coordinator.trigger(is_final=is_final)
        self.send(
            p.TriggerCheckpoint(
                checkpoint_id=pending.checkpoint_id,
                trigger_timestamp=pending.trigger_timestamp,
                is_final=is_final,
            )
        )

    def _send_restore(self, decision: FailoverDecision) -> None:
        self._end_of_input = False
        cp = decision.restore_from
        self.send(
            p.RestoreJob(
                new_attempt=decision.attempt,
                checkpoint_id=cp.checkpoint_id if cp else None,
                external_path=cp.external_path if cp else None,
                acks=list(cp.acks.values()) if cp and cp.external_path is None else None,
                cause=decision.cause,
            ),
            attempt=decision.attempt,
        )

    # ------------------------------------------------------------------ events
    def _handle(self, env: p.Envelope, event: Any) -> None:
        if isinstance(event, p.JobRegistered):
            self._on_registered(env, event)
            return
        coordinator = self.coordinator
        assert coordinator is not None
        if env.attempt < coordinator.attempt:
            return  # an older attempt's event: refused
        if isinstance(event, p.SnapshotCompleted):
            try:
                result = coordinator.acknowledge(env.attempt, event)
            except StaleAttemptError:
                return
            if result.completed is not None:
                self._complete(result.completed)
        elif isinstance(event, p.CheckpointDeclined):
            failed = coordinator.decline(
                env.attempt,
                event.checkpoint_id,
                event.operator_id,
                event.subtask,
                event.reason,
                asynchronous=event.asynchronous,
            )
            if failed is not None:
                self.send(p.NotifyCheckpointAborted(checkpoint_id=failed.checkpoint_id, reason="x"))
        elif isinstance(event, p.Heartbeat):
            if not coordinator.pending and not self._end_of_input:
                self._trigger()
        elif isinstance(event, p.EndOfInput):
            self._end_of_input = True
            self._trigger(is_final=True)
        elif isinstance(event, p.TaskFailed):
            if self.failovers >= self.max_failovers:
                self.cancel(p.JobStatus.FAILED, f"no more restarts after: {event.cause}")
            else:
                self.failovers += 1
                self._send_restore(coordinator.failover(event.cause))
        elif isinstance(event, p.JobStatusChanged) and event.status in TERMINAL:
            self._stop.set()

    def _on_registered(self, env: p.Envelope, event: p.JobRegistered) -> None:
        if self.coordinator is not None:
            if event.incarnation != self.incarnation:  # a restarted driver: fail over
                self.incarnation = event.incarnation
                self._send_restore(self.coordinator.failover("the driver restarted"))
            return
        self.job_id, self.incarnation = env.job_id, event.incarnation
        tasks = {v.id: v.parallelism for v in event.vertices}
        # Keep every checkpoint: the tests restore old ones.
        config = CheckpointConfig(retained=20, max_concurrent=max(1, self.burst))
        self.coordinator = CheckpointCoordinator(self.job_id, tasks, config, self.clock)
        self.storage = checkpoint_storage_from_options(
            event.config["checkpoint_storage"], event.config["checkpoint_dir"], 1 << 20
        )
        self.send(
            p.RestoreJob(new_attempt=1, external_path=event.config.get("from_checkpoint")),
            attempt=1,
        )
        for _ in range(self.burst):
            self._trigger()

    def _complete(self, cp: CompletedCheckpoint) -> None:
        """Steps of DESIGN §1: (1) ``_metadata``, (2) record, (3) notify the job."""
        assert self.coordinator is not None and self.storage is not None
        # Step 1
        cp.external_path = self.storage.write_metadata(
            self.job_id, cp.checkpoint_id, checkpoint_metadata(self.job_id, cp)
        )
        # Step 2
        self.completed[cp.checkpoint_id] = cp
        # Step 3
        if self._withhold or (self._on_request and not cp.is_final):
            self.withheld.append(cp.checkpoint_id)
        else:
            self.send(p.NotifyCheckpointComplete(checkpoint_id=cp.checkpoint_id))
        for failed in self.coordinator.drain_failed():
            self.send(
                p.NotifyCheckpointAborted(checkpoint_id=failed.checkpoint_id, reason="subsumed")
            )
