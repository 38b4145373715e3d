"""The DataStream-style graph builder that job authors use, and the job graph it produces.

    env = StreamExecutionEnvironment.from_args()
    events = env.from_source(GeneratorSource(events=1000), uid="events")
    events.key_by("app_id").count(uid="pv", output="pv").sink_to(FileSink("out"), uid="sink")
    env.execute("pv-count")

``map`` / ``filter`` / ``flat_map`` chain into the task before them (one vertex, one
acknowledgement, named after its chain head); ``key_by`` starts a new vertex behind a Spark
shuffle by key group, also after another keyed vertex (chained keyed stages: count per user,
re-key by region, count per region); a sink chains into the end of the vertex it follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sparkpoint.broadcast import BroadcastProcessOperator, KeyedBroadcastProcessFunction
from sparkpoint.broadcast_state import broadcast_descriptors
from sparkpoint.connectors.sinks import TwoPhaseCommitSink
from sparkpoint.environment import StreamExecutionEnvironment  # where streams start
from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import (
    CoProcessOperator,
    CountOperator,
    FilterOperator,
    FlatMapOperator,
    KeyedCoProcessFunction,
    KeyedOperator,
    KeyedProcessFunction,
    KeySelector,
    MapBatchOperator,
    MapOperator,
    OutputTag,
    ProcessOperator,
    ReduceOperator,
    StatelessOperator,
    TimestampsAndWatermarksOperator,
)
from sparkpoint.job_graph import JobGraph, KeyedVertex, SinkNode, SourceVertex, Vertex
from sparkpoint.records import Batch
from sparkpoint.state.descriptors import MapStateDescriptor
from sparkpoint.watermarks import TimestampSelector
from sparkpoint.windows import WindowAssigner, WindowOperator, count_one

__all__ = [
    "BroadcastConnectedStream",
    "BroadcastStream",
    "ConnectedKeyedStreams",
    "ConnectedStreams",
    "DataStream",
    "JobGraph",
    "KeyedStream",
    "KeyedVertex",
    "SideOutputStream",
    "SinkNode",
    "SourceVertex",
    "StreamExecutionEnvironment",
    "UnionStream",
    "Vertex",
    "WindowedStream",
]


class DataStream:
    """A stream of records; stateless operators chain into the current vertex."""

    def __init__(self, env: StreamExecutionEnvironment, vertex: Vertex):
        self._env = env
        self._vertex = vertex

    def _add(self, op: StatelessOperator) -> DataStream:
        graph = self._env.graph
        uid = self._vertex.uid
        if graph.downstream(uid) is not None or any(n.tag is None for n in graph.sinks_of(uid)):
            raise ConfigurationError(
                f"operator {op.uid!r} would follow {uid!r} after its stream was keyed or sunk; "
                "add stateless operators before key_by and sink_to"
            )
        self._env._claim(op.uid)
        self._vertex.chain.append(op)
        return self

    def map(self, fn: Callable[[Any], Any], uid: str) -> DataStream:
        return self._add(MapOperator(uid, fn))

    def filter(self, fn: Callable[[Any], bool], uid: str) -> DataStream:
        return self._add(FilterOperator(uid, fn))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], uid: str) -> DataStream:
        return self._add(FlatMapOperator(uid, fn))

    def map_batch(self, fn: Callable[[Batch], Any], uid: str) -> DataStream:
        """A vectorized function of each batch of records: it returns a :class:`Batch` or a
        ``pyarrow.Table``/``RecordBatch`` (``fn(batch)`` may compute on ``batch.to_arrow()``).
        A batch never holds records from both sides of a checkpoint barrier; ``fn`` must be
        deterministic (a restore replays its input) and may return more or fewer records."""
        return self._add(MapBatchOperator(uid, fn))

    def assign_timestamps_and_watermarks(
        self, timestamps: TimestampSelector, max_out_of_orderness_ms: int, uid: str
    ) -> DataStream:
        """Event time: each record's timestamp (ms) is field ``timestamps`` (or the function's
        result); watermarks trail the highest timestamp by ``max_out_of_orderness_ms``
        (Flink's ``WatermarkStrategy.forBoundedOutOfOrderness``). Before ``key_by`` only."""
        if not isinstance(self._vertex, SourceVertex):
            raise ConfigurationError("assign timestamps and watermarks before key_by")
        if self._vertex.watermarks is not None:
            raise ConfigurationError("a job assigns timestamps and watermarks once")
        return self._add(TimestampsAndWatermarksOperator(uid, timestamps, max_out_of_orderness_ms))

    def key_by(self, selector: KeySelector) -> KeyedStream:
        """Partition the stream by key: the keyed operator that follows starts a new vertex
        behind a Spark shuffle by key group (also after another keyed operator)."""
        _check_free(self._env.graph, [self._vertex])
        return KeyedStream(self._env, selector, [self._vertex])

    def union(self, *others: DataStream) -> UnionStream:
        """This stream's records and those of ``others``, merged (Flink's ``union``); key it
        next. Its keyed vertex aligns barriers across the channels of every input."""
        vertices = [self._vertex, *(o._vertex for o in others)]
        if len({v.uid for v in vertices}) != len(vertices):
            raise ConfigurationError("union needs distinct streams; a stream is united once")
        if any(o._env is not self._env for o in others):
            raise ConfigurationError("union needs streams of the same environment")
        _check_free(self._env.graph, vertices)
        return UnionStream(self._env, vertices)

    def broadcast(self, *descriptors: MapStateDescriptor) -> BroadcastStream:
        """This stream to every subtask of the keyed operator it is connected with (Flink's
        ``broadcast``): ``keyed.connect(stream.broadcast(...))``. ``descriptors`` name the
        broadcast state its elements fill (:mod:`sparkpoint.broadcast`)."""
        where = f"the broadcast of {self._vertex.uid!r}"
        _check_free(self._env.graph, [self._vertex])
        return BroadcastStream(self._env, self._vertex, broadcast_descriptors(descriptors, where))

    def connect(self, other: DataStream) -> ConnectedStreams:
        """This stream and ``other`` as the two inputs of one co-process function (Flink's
        ``connect``); key both next, alike."""
        if isinstance(other, BroadcastStream):
            raise ConfigurationError(
                f"{self._vertex.uid!r} connects the broadcast stream of {other._vertex.uid!r} "
                "without a key: a non-keyed broadcast function is not supported in this "
                "version; key the stream first: stream.key_by(...).connect(broadcast_stream)"
            )
        if other._vertex is self._vertex:
            raise ConfigurationError("connect needs two distinct streams")
        _check_free(self._env.graph, [self._vertex, other._vertex])
        return ConnectedStreams(self._env, [self._vertex, other._vertex])

    def get_side_output(self, tag: OutputTag) -> SideOutputStream:
        """The records this stream's keyed function emitted with ``ctx.output(tag, ...)``."""
        if not isinstance(self._vertex, KeyedVertex):
            raise ConfigurationError(
                f"side output {tag.name!r}: only a keyed function emits side outputs, and "
                f"{self._vertex.uid!r} is a source"
            )
        return SideOutputStream(self._env, self._vertex, tag)

    def sink_to(self, sink: TwoPhaseCommitSink, uid: str) -> None:
        """Write the stream to ``sink`` (two-phase commit on checkpoints). A stream may go to
        several sinks, and sinks may follow any vertex: each commits its own transactions."""
        self._env.graph.sinks.append(SinkNode(self._env._claim(uid), sink, self._vertex.uid))


class SideOutputStream:
    """A keyed function's side output; it goes to sinks (each its own transactions)."""

    def __init__(self, env: StreamExecutionEnvironment, vertex: KeyedVertex, tag: OutputTag):
        self._env = env
        self._vertex = vertex
        self._tag = tag

    def sink_to(self, sink: TwoPhaseCommitSink, uid: str) -> None:
        node = SinkNode(self._env._claim(uid), sink, self._vertex.uid, tag=self._tag.name)
        self._env.graph.sinks.append(node)


def _check_free(graph: JobGraph, vertices: Sequence[Vertex]) -> None:
    """Refuse to key a stream that already feeds a keyed vertex."""
    for v in vertices:
        if graph.downstream(v.uid) is not None:
            raise ConfigurationError(
                f"the stream of {v.uid!r} is keyed twice; a stream feeds one keyed operator "
                "in this version of Sparkpoint"
            )


class UnionStream:
    """Several streams merged by ``union``; ``key_by`` makes them one keyed vertex's inputs."""

    def __init__(self, env: StreamExecutionEnvironment, vertices: list[Vertex]) -> None:
        self._env = env
        self._vertices = vertices

    def key_by(self, selector: KeySelector) -> KeyedStream:
        _check_free(self._env.graph, self._vertices)
        return KeyedStream(self._env, selector, self._vertices)


class ConnectedStreams:
    """Two connected streams; ``key_by(key1, key2)`` keys each by its own selector."""

    def __init__(self, env: StreamExecutionEnvironment, vertices: list[Vertex]) -> None:
        self._env = env
        self._vertices = vertices

    def key_by(self, key1: KeySelector, key2: KeySelector) -> ConnectedKeyedStreams:
        _check_free(self._env.graph, self._vertices)
        return ConnectedKeyedStreams(self._env, (key1, key2), self._vertices)


class ConnectedKeyedStreams:
    """Two streams keyed alike: a :class:`KeyedCoProcessFunction` sees both with one keyed
    state per key (Flink's ``KeyedCoProcessFunction``). Barriers are aligned across the
    channels of both inputs."""

    def __init__(
        self,
        env: StreamExecutionEnvironment,
        selectors: tuple[KeySelector, KeySelector],
        vertices: list[Vertex],
    ) -> None:
        self._keyed = KeyedStream(env, selectors[0], vertices)
        self._selectors = selectors

    def process(
        self, fn: KeyedCoProcessFunction, uid: str, parallelism: int | None = None
    ) -> DataStream:
        return self._keyed._keyed(CoProcessOperator(uid, self._selectors, fn), parallelism)


class BroadcastStream:
    """A stream with the descriptors of its broadcast state; connect it with a keyed stream."""

    def __init__(
        self,
        env: StreamExecutionEnvironment,
        vertex: Vertex,
        descriptors: tuple[MapStateDescriptor, ...],
    ) -> None:
        self._env = env
        self._vertex = vertex
        self.descriptors = descriptors


class BroadcastConnectedStream:
    """A keyed stream connected with a broadcast stream: a
    :class:`~sparkpoint.broadcast.KeyedBroadcastProcessFunction` processes both."""

    def __init__(self, keyed: KeyedStream, broadcast: BroadcastStream) -> None:
        self._keyed = keyed
        self._broadcast = broadcast

    def process(
        self, fn: KeyedBroadcastProcessFunction, uid: str, parallelism: int | None = None
    ) -> DataStream:
        """Run ``fn``: ``process_element`` per keyed record, ``process_broadcast_element``
        per broadcast record in every subtask."""
        k = self._keyed
        wm = k._watermarks()
        op = BroadcastProcessOperator(
            uid,
            k._selector,
            fn,
            self._broadcast.descriptors,
            keyed_inputs=len(k._upstream),
            timestamps=wm.timestamps if wm is not None else None,
        )
        return k._keyed(op, parallelism, broadcast=self._broadcast._vertex)


class KeyedStream:
    """A stream partitioned by key; its keyed operator starts a new vertex."""

    def __init__(
        self, env: StreamExecutionEnvironment, selector: KeySelector, upstream: list[Vertex]
    ) -> None:
        self._env = env
        self._selector = selector
        self._upstream = upstream

    def _watermarks(self) -> TimestampsAndWatermarksOperator | None:
        """The upstream source's timestamps and watermarks (None behind a keyed vertex or a
        union: event time crosses one exchange from one source in this version)."""
        up = self._upstream
        return up[0].watermarks if len(up) == 1 and isinstance(up[0], SourceVertex) else None

    def _keyed(
        self, op: KeyedOperator, parallelism: int | None, broadcast: Vertex | None = None
    ) -> DataStream:
        self._env._claim(op.uid)
        opts = self._env.options
        p = parallelism or opts.parallelism
        if not 1 <= p <= opts.max_parallelism:
            raise ConfigurationError(
                f"parallelism of {op.uid} must be between 1 and max parallelism "
                f"{opts.max_parallelism}, got {p}"
            )
        graph = self._env.graph
        bcast = [broadcast] if broadcast is not None else []
        _check_free(graph, [*self._upstream, *bcast])
        vertex = KeyedVertex(
            op,
            p,
            opts.max_parallelism,
            inputs=tuple(v.uid for v in [*self._upstream, *bcast]),
            broadcast_inputs=tuple(v.uid for v in bcast),
        )
        graph.keyed_vertices.append(vertex)
        return DataStream(self._env, vertex)

    def connect(self, broadcast: BroadcastStream) -> BroadcastConnectedStream:
        """This keyed stream with ``broadcast`` (``stream.broadcast(descriptors)``) as the
        inputs of one :class:`~sparkpoint.broadcast.KeyedBroadcastProcessFunction`."""
        if not isinstance(broadcast, BroadcastStream):
            raise ConfigurationError(
                "a keyed stream connects a broadcast stream (other.broadcast(descriptor)); to "
                "connect two keyed streams, use a.connect(b).key_by(key1, key2)"
            )
        if broadcast._env is not self._env:
            raise ConfigurationError("connect needs streams of the same environment")
        if any(v is broadcast._vertex for v in self._upstream):
            raise ConfigurationError(
                f"the stream of {broadcast._vertex.uid!r} is both keyed and broadcast into one "
                "operator; connect two distinct streams"
            )
        return BroadcastConnectedStream(self, broadcast)

    def count(
        self, uid: str, output: str = "count", emit: str = "every", parallelism: int | None = None
    ) -> DataStream:
        """Running count per key, emitted as ``{<key field>: key, <output>: n}``: for every
        record (``emit="every"``), or once per changed key at each checkpoint barrier and at
        the end of each epoch (``emit="epoch"``; the keys of one such flush come sorted, or in
        hash order when there are thousands of str keys)."""
        return self._keyed(CountOperator(uid, self._selector, output, emit), parallelism)

    def reduce(
        self,
        fn: Callable[[Any, Any], Any],
        uid: str,
        emit: str = "every",
        parallelism: int | None = None,
    ) -> DataStream:
        return self._keyed(ReduceOperator(uid, self._selector, fn, emit), parallelism)

    def process(
        self, fn: KeyedProcessFunction, uid: str, parallelism: int | None = None
    ) -> DataStream:
        """Run ``fn`` per record with keyed state and event-time timers (timers fire only in
        a job that assigns timestamps and watermarks)."""
        wm = self._watermarks()
        timestamps = wm.timestamps if wm is not None else None
        return self._keyed(ProcessOperator(uid, self._selector, fn, timestamps), parallelism)

    def window(self, assigner: WindowAssigner) -> WindowedStream:
        """Event-time windows per key: tumbling or sliding."""
        wm = self._watermarks()
        if wm is None:
            raise ConfigurationError(
                "event-time windows need assign_timestamps_and_watermarks(...) on the source "
                "before its key_by (not behind another keyed operator)"
            )
        return WindowedStream(self, assigner, wm.timestamps)


class WindowedStream:
    """A keyed stream cut into event-time windows; each window emits one record when the
    watermark passes its end: ``{<key field>: key, "window_start": s, "window_end": e,
    <output>: value}``."""

    def __init__(
        self, keyed: KeyedStream, assigner: WindowAssigner, timestamps: TimestampSelector
    ) -> None:
        self._keyed = keyed
        self._assigner = assigner
        self._timestamps = timestamps

    def _window(
        self,
        uid: str,
        add: Callable[[Any, Any], Any],
        output: str,
        parallelism: int | None,
        **kw: Any,
    ) -> DataStream:
        k = self._keyed
        op = WindowOperator(uid, k._selector, self._assigner, self._timestamps, add, output, **kw)
        return k._keyed(op, parallelism)

    def count(self, uid: str, output: str = "count", parallelism: int | None = None) -> DataStream:
        """How many records of the key fall in each window."""
        return self._window(uid, count_one, output, parallelism, initial=0, needs_values=False)

    def reduce(
        self,
        fn: Callable[[Any, Any], Any],
        uid: str,
        output: str = "value",
        parallelism: int | None = None,
    ) -> DataStream:
        """The window's records folded with ``fn`` (the first record starts the fold)."""
        return self._window(uid, fn, output, parallelism)

    def aggregate(
        self,
        add: Callable[[Any, Any], Any],
        initial: Any,
        uid: str,
        output: str = "value",
        parallelism: int | None = None,
    ) -> DataStream:
        """``add(accumulator, record)`` over the window's records, from a copy of ``initial``."""
        return self._window(uid, add, output, parallelism, initial=initial)
