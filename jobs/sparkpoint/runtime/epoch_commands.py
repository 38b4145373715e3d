"""Commands a connected driver obeys while an epoch runs, so completed checkpoints commit at once.

Between epochs the driver reads its command stream itself
(:class:`~sparkpoint.runtime.connected.ControlPlaneAuthority`). While an epoch's Spark job
runs, its thread only waits for the job; a ``checkpoint_complete`` that arrived then would wait
for the epoch's end, and the output of every checkpoint would become visible up to an epoch
late. :class:`EpochCommandReader` reads the stream on a thread of its own for the length of
each epoch and obeys, in the order sent, the commands that do not depend on that epoch's
result (as Flink's tasks take ``notifyCheckpointComplete`` from their mailbox between
records):

- ``checkpoint_complete``: the sinks commit what the checkpoint's acknowledgements carry; those
  came from epochs the driver accepted before, never from the running one;
- ``trigger_checkpoint``: the barrier is queued for a later epoch.

The authority decides which commands those are. The first command it does not take, and
every command after it, waits for the epoch's end (:meth:`EpochCommandReader.held`), so
commands are obeyed in the order sent. The reader's thread touches the driver's state only
while the driver's own thread waits in the epoch runner's ``run``: :meth:`stop` ends the
thread before ``run`` returns, at once (``CLIENT UNBLOCK`` ends its blocking read; without
it, within :data:`READ_BLOCK_MS`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from sparkpoint.runtime.epochs import EpochRunner
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.spark import SparkApplication
from sparkpoint.transport import CommandChannel, ReceivedMessage, TransportError

log = logging.getLogger(__name__)

#: How long one read of the reader's thread blocks (:meth:`EpochCommandReader.stop` ends it
#: sooner with ``CLIENT UNBLOCK``; where Redis refuses that, a stop waits up to this long).
READ_BLOCK_MS = 100
#: How often :meth:`EpochCommandReader.stop` unblocks the thread again while it waits for it.
UNBLOCK_EVERY_S = 0.005

#: Obeys one command read while an epoch runs; False: it must wait for the epoch's end.
Obey = Callable[[ReceivedMessage], bool]


class EpochCommandReader:
    """Reads and obeys a connected driver's commands while its epochs run (module docstring)."""

    def __init__(self, channel: CommandChannel, obey: Obey) -> None:
        self.channel = channel
        self._obey = obey
        self._connection: redis.Redis | None = None  # a connection of its own, made on start
        self._connection_id: int | None = None  # its CLIENT ID (None: Redis would not say)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._held: list[ReceivedMessage] = []
        self._error: BaseException | None = None
        self.obeyed = 0  # commands obeyed while epochs ran

    @property
    def job_id(self) -> str:
        return self.channel.job_id

    def around(self, runner: EpochRunner) -> EpochRunner:
        """``runner``, reading commands while each of its epochs runs."""
        return _ReadingRunner(runner, self)

    def start(self) -> None:
        """Read and obey commands on a thread of its own until :meth:`stop`."""
        assert self._thread is None, "the reader is running already"
        if self._connection is None:
            try:
                self._connection = redis.Redis(
                    connection_pool=self.channel.client.connection_pool,
                    single_connection_client=True,  # connects now
                )
            except redis.RedisError as err:  # this epoch's commands wait for its end
                log.warning("job %s: commands not read during the epoch: %s", self.job_id, err)
                return
            try:
                self._connection_id = int(self._connection.client_id())
            except redis.RedisError as err:
                log.warning(
                    "job %s: Redis gave no client id (%s); an epoch's end waits up to %d ms "
                    "for the command reader",
                    self.job_id,
                    err,
                    READ_BLOCK_MS,
                )
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._read, name=f"commands-{self.job_id}", daemon=True
        )
        self._thread.start()

    def _read(self) -> None:
        """The thread: obey what may be obeyed now, in order; hold the first command that may
        not and all after it, and stop reading."""
        try:
            while not self._stopping.is_set():
                try:
                    messages = self.channel.read(
                        block_ms=READ_BLOCK_MS, client=self._connection, retry_for_s=0
                    )
                except TransportError as err:  # read again at the epoch's end, where it counts
                    log.warning("job %s: commands not read during the epoch: %s", self.job_id, err)
                    return
                for i, message in enumerate(messages):
                    if self._stopping.is_set() or not self._obey(message):
                        self._held = messages[i:]
                        return
                    self.channel.ack([message.entry_id])
                    self.obeyed += 1
        except BaseException as err:  # obeying failed (a commit, Redis): held() hands it on
            self._error = err

    def stop(self) -> None:
        """End the thread (wait for a command it is obeying). Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stopping.set()
        while thread.is_alive():
            if self._connection_id is not None:
                try:
                    self.channel.client.client_unblock(self._connection_id)
                except redis.RedisError:  # its read ends by itself within READ_BLOCK_MS
                    self._connection_id = None
            thread.join(UNBLOCK_EVERY_S if self._connection_id is not None else None)

    def held(self) -> list[ReceivedMessage]:
        """The commands read during the last epoch that wait for the driver's thread, in order
        (not yet acknowledged); raises what broke the reader's thread, if anything."""
        held, self._held = self._held, []
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return held

    def close(self) -> None:
        self.stop()
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class _ReadingRunner:
    """An :class:`EpochRunner` whose epochs run while an :class:`EpochCommandReader` reads."""

    def __init__(self, runner: EpochRunner, reader: EpochCommandReader) -> None:
        self.runner = runner
        self.reader = reader

    def warm_up(self) -> None:
        self.runner.warm_up()

    def application(self) -> SparkApplication:
        return self.runner.application()

    def run(self, plan: EpochPlan) -> list[TaskReport]:
        self.reader.start()
        try:
            reports = self.runner.run(plan)
        finally:
            self.reader.stop()
        self.reader.channel.check_fence()  # a driver another took over from accepts nothing
        return reports

    @property
    def executors(self) -> Any:
        """The runner's executor listing, where it has one (Spark's)."""
        return getattr(self.runner, "executors", None)
