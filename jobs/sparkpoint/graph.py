"""The DataStream-style graph builder that job authors use, and the job graph it produces.

    env = StreamExecutionEnvironment.from_args()
    events = env.from_source(GeneratorSource(events=1000), uid="events")
    events.key_by("app_id").count(uid="pv", output="pv").sink_to(FileSink("out"), uid="sink")
    env.execute("pv-count")

``map`` / ``filter`` / ``flat_map`` chain into the task before them (one vertex, one
acknowledgement, named after its chain head); ``key_by`` starts a new vertex behind a Spark
shuffle by key group; the sink chains into the last vertex.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkpoint.connectors.sinks import TwoPhaseCommitSink
from sparkpoint.connectors.sources import Source
from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import (
    CountOperator,
    FilterOperator,
    FlatMapOperator,
    KeyedOperator,
    KeyedProcessFunction,
    KeySelector,
    MapBatchOperator,
    MapOperator,
    ProcessOperator,
    ReduceOperator,
    StatelessOperator,
    TimestampsAndWatermarksOperator,
)
from sparkpoint.protocol import VertexModel
from sparkpoint.records import Batch
from sparkpoint.watermarks import TimestampSelector
from sparkpoint.windows import WindowAssigner, WindowOperator, count_one

if TYPE_CHECKING:
    from sparkpoint.options import JobOptions
    from sparkpoint.runtime.driver import JobResult


@dataclass
class SourceVertex:
    uid: str
    source: Source
    chain: list[StatelessOperator] = field(default_factory=list)

    @property
    def parallelism(self) -> int:
        return len(self.source.split_ids())

    @property
    def watermarks(self) -> TimestampsAndWatermarksOperator | None:
        """Where the chain assigns timestamps and watermarks, if it does."""
        found = [op for op in self.chain if isinstance(op, TimestampsAndWatermarksOperator)]
        return found[0] if found else None


@dataclass
class KeyedVertex:
    operator: KeyedOperator
    parallelism: int
    max_parallelism: int
    chain: list[StatelessOperator] = field(default_factory=list)

    @property
    def uid(self) -> str:
        return self.operator.uid


@dataclass
class JobGraph:
    """A linear job: a source vertex, at most one keyed vertex, a sink on the last vertex."""

    name: str
    source: SourceVertex
    keyed: KeyedVertex | None = None
    sink: TwoPhaseCommitSink | None = None
    sink_uid: str | None = None

    def tasks(self) -> dict[str, int]:
        """Operator id (chain-head uid) -> parallelism of every vertex that acknowledges."""
        out = {self.source.uid: self.source.parallelism}
        if self.keyed is not None:
            out[self.keyed.uid] = self.keyed.parallelism
        return out

    @property
    def sink_vertex_uid(self) -> str:
        return self.keyed.uid if self.keyed is not None else self.source.uid

    def vertices(self) -> list[VertexModel]:
        def names(head: str, chain: Sequence[StatelessOperator], last: bool) -> list[str]:
            ops = [head, *(op.uid for op in chain)]
            if last and self.sink_uid:
                ops.append(self.sink_uid)
            return ops

        src = names(self.source.uid, self.source.chain, self.keyed is None)
        out = [
            VertexModel(
                id=self.source.uid,
                name=" -> ".join(src),
                parallelism=self.source.parallelism,
                operators=src,
            )
        ]
        if self.keyed is not None:
            k = names(self.keyed.uid, self.keyed.chain, True)
            out.append(
                VertexModel(
                    id=self.keyed.uid,
                    name=" -> ".join(k),
                    parallelism=self.keyed.parallelism,
                    operators=k,
                    max_parallelism=self.keyed.max_parallelism,
                )
            )
        return out

    def edges(self) -> list[tuple[str, str]]:
        return [(self.source.uid, self.keyed.uid)] if self.keyed is not None else []


class StreamExecutionEnvironment:
    """Where a job is built and executed (Flink's StreamExecutionEnvironment)."""

    def __init__(self, options: JobOptions, args: Sequence[str] = ()) -> None:
        self.options = options
        self.args = list(args)
        self._graph: JobGraph | None = None
        self._uids: set[str] = set()

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None) -> StreamExecutionEnvironment:
        """Parse the product's options from ``argv`` (default ``sys.argv[1:]``); keep the rest
        in :attr:`args` for the job's own parser."""
        from sparkpoint.options import parse_job_options

        options, rest = parse_job_options(argv)
        return cls(options, rest)

    def _claim(self, uid: str) -> str:
        if not uid or not isinstance(uid, str):
            raise ConfigurationError("every operator needs a non-empty uid")
        if uid in self._uids:
            raise ConfigurationError(f"operator uid {uid!r} is used twice; uids must be unique")
        self._uids.add(uid)
        return uid

    def from_source(self, source: Source, uid: str) -> DataStream:
        if self._graph is not None:
            raise ConfigurationError("a job has one source in this version of Sparkpoint")
        self._graph = JobGraph(name="", source=SourceVertex(self._claim(uid), source))
        return DataStream(self, self._graph.source.chain)

    @property
    def graph(self) -> JobGraph:
        if self._graph is None:
            raise ConfigurationError("the job has no source: call env.from_source(...) first")
        return self._graph

    def execute(self, job_name: str = "sparkpoint-job", spark: Any = None) -> JobResult:
        """Run the job until its bounded input ends (or it fails past its restart strategy)."""
        from sparkpoint.runtime.driver import JobDriver

        graph = self.graph
        graph.name = job_name
        if graph.sink is None:
            raise ConfigurationError(f"job {job_name!r} has no sink: call .sink_to(...)")
        return JobDriver(graph, self.options, spark=spark).run()


class DataStream:
    """A stream of records; stateless operators chain into the current vertex."""

    def __init__(self, env: StreamExecutionEnvironment, chain: list[StatelessOperator]):
        self._env = env
        self._chain = chain

    def _add(self, op: StatelessOperator) -> DataStream:
        self._env._claim(op.uid)
        self._chain.append(op)
        return self

    def map(self, fn: Callable[[Any], Any], uid: str) -> DataStream:
        return self._add(MapOperator(uid, fn))

    def filter(self, fn: Callable[[Any], bool], uid: str) -> DataStream:
        return self._add(FilterOperator(uid, fn))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], uid: str) -> DataStream:
        return self._add(FlatMapOperator(uid, fn))

    def map_batch(self, fn: Callable[[Batch], Batch], uid: str) -> DataStream:
        return self._add(MapBatchOperator(uid, fn))

    def assign_timestamps_and_watermarks(
        self, timestamps: TimestampSelector, max_out_of_orderness_ms: int, uid: str
    ) -> DataStream:
        """Event time: each record's timestamp (ms) is field ``timestamps`` (or the function's
        result); watermarks trail the highest timestamp by ``max_out_of_orderness_ms``
        (Flink's ``WatermarkStrategy.forBoundedOutOfOrderness``). Before ``key_by`` only."""
        graph = self._env.graph
        if self._chain is not graph.source.chain:
            raise ConfigurationError("assign timestamps and watermarks before key_by")
        if graph.source.watermarks is not None:
            raise ConfigurationError("a job assigns timestamps and watermarks once")
        return self._add(TimestampsAndWatermarksOperator(uid, timestamps, max_out_of_orderness_ms))

    def key_by(self, selector: KeySelector) -> KeyedStream:
        graph = self._env.graph
        if graph.keyed is not None:
            raise ConfigurationError("a job has one key_by in this version of Sparkpoint")
        return KeyedStream(self._env, selector)

    def sink_to(self, sink: TwoPhaseCommitSink, uid: str) -> None:
        graph = self._env.graph
        if graph.sink is not None:
            raise ConfigurationError("a job has one sink in this version of Sparkpoint")
        graph.sink = sink
        graph.sink_uid = self._env._claim(uid)


class KeyedStream:
    """A stream partitioned by key; its keyed operator starts a new vertex."""

    def __init__(self, env: StreamExecutionEnvironment, selector: KeySelector) -> None:
        self._env = env
        self._selector = selector

    def _keyed(self, op: KeyedOperator, parallelism: int | None) -> DataStream:
        self._env._claim(op.uid)
        opts = self._env.options
        p = parallelism or opts.parallelism
        if not 1 <= p <= opts.max_parallelism:
            raise ConfigurationError(
                f"parallelism of {op.uid} must be between 1 and max parallelism "
                f"{opts.max_parallelism}, got {p}"
            )
        vertex = KeyedVertex(op, p, opts.max_parallelism)
        self._env.graph.keyed = vertex
        return DataStream(self._env, vertex.chain)

    def count(
        self, uid: str, output: str = "count", emit: str = "every", parallelism: int | None = None
    ) -> DataStream:
        """Running count per key, emitted as ``{<key field>: key, <output>: n}``."""
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
        wm = self._env.graph.source.watermarks
        timestamps = wm.timestamps if wm is not None else None
        return self._keyed(ProcessOperator(uid, self._selector, fn, timestamps), parallelism)

    def window(self, assigner: WindowAssigner) -> WindowedStream:
        """Event-time windows per key: tumbling or sliding."""
        wm = self._env.graph.source.watermarks
        if wm is None:
            raise ConfigurationError(
                "event-time windows need assign_timestamps_and_watermarks(...) before key_by"
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
