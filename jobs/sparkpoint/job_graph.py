"""The job graph that the builder (:mod:`sparkpoint.graph`) produces and the runtime runs:
source vertices, keyed vertices behind a key-group exchange, and sinks chained into any vertex.

A vertex is one task per subtask (one acknowledgement, named after its chain head): its head
(a source or a keyed operator) and the stateless operators chained after it. Edges are the
exchanges into keyed vertices (one Spark shuffle each); forward edges are chaining.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkpoint.connectors.sinks import TwoPhaseCommitSink
from sparkpoint.connectors.sources import Source
from sparkpoint.functions import KeyedOperator, StatelessOperator, TimestampsAndWatermarksOperator
from sparkpoint.operator_state import CheckpointedFunction
from sparkpoint.protocol import VertexModel


@dataclass
class SourceVertex:
    """A source and the stateless operators chained into its subtasks."""

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
    """A keyed operator behind a hash exchange by key group from the vertices ``inputs`` (more
    than one: a ``union``, or a ``connect``), and the stateless operators chained after it.
    Inputs in ``broadcast_inputs`` are not keyed: every record goes to every subtask."""

    operator: KeyedOperator
    parallelism: int
    max_parallelism: int
    chain: list[StatelessOperator] = field(default_factory=list)
    inputs: tuple[str, ...] = ()  # uids of the vertices whose output is keyed into this one
    broadcast_inputs: tuple[str, ...] = ()  # those of ``inputs`` broadcast to every subtask

    @property
    def uid(self) -> str:
        return self.operator.uid


Vertex = SourceVertex | KeyedVertex


@dataclass(frozen=True)
class Region:
    """A failover region (Flink's pipelined region): a connected component of the job graph,
    its vertices in topological order. Its name is its sources' uids, stable across runs."""

    name: str
    vertices: tuple[str, ...]


@dataclass
class SinkNode:
    """A sink chained into the end of vertex ``vertex`` (its records after the chain), or
    into its keyed function's side output ``tag``."""

    uid: str
    sink: TwoPhaseCommitSink
    vertex: str
    tag: str | None = None


@dataclass
class JobGraph:
    """A job: source vertices, keyed vertices (each behind one exchange), sinks on any vertex.

    Keyed vertices are in topological order (each after its inputs). A vertex feeds at most
    one keyed vertex: Spark would otherwise compute it once per consumer within an epoch.

    Input channels of a keyed vertex are numbered over its inputs in order: the subtasks of
    the first input, then those of the second (a union), so that one barrier handler aligns
    the channels of different inputs. With several sources, split ids are prefixed by the
    source uid (``<uid>/<split id>``); a job of one source keeps its sources' own ids, so its
    checkpoints stay restorable.
    """

    name: str
    sources: list[SourceVertex] = field(default_factory=list)
    keyed_vertices: list[KeyedVertex] = field(default_factory=list)
    sinks: list[SinkNode] = field(default_factory=list)

    # ------------------------------------------------------------------ lookups
    @property
    def source(self) -> SourceVertex:
        """The first source vertex (the only one of a linear job)."""
        return self.sources[0]

    @property
    def keyed(self) -> KeyedVertex | None:
        """The first keyed vertex, or None when the job has none."""
        return self.keyed_vertices[0] if self.keyed_vertices else None

    @property
    def sink(self) -> TwoPhaseCommitSink | None:
        """The first sink, or None."""
        return self.sinks[0].sink if self.sinks else None

    @property
    def sink_uid(self) -> str | None:
        return self.sinks[0].uid if self.sinks else None

    def all_vertices(self) -> list[Vertex]:
        """Every vertex in topological order: sources first, then keyed vertices."""
        return [*self.sources, *self.keyed_vertices]

    def vertex(self, uid: str) -> Vertex:
        for v in self.all_vertices():
            if v.uid == uid:
                return v
        raise KeyError(uid)

    def downstream(self, uid: str) -> KeyedVertex | None:
        """The keyed vertex that vertex ``uid`` feeds, if any."""
        return next((k for k in self.keyed_vertices if uid in k.inputs), None)

    def channels(self, keyed: KeyedVertex) -> int:
        """How many input channels ``keyed``'s subtasks read: all subtasks of all inputs."""
        return sum(self.vertex(uid).parallelism for uid in keyed.inputs)

    def channel_offset(self, keyed: KeyedVertex, uid: str) -> int:
        """The channel of subtask 0 of input ``uid`` at ``keyed``."""
        offset = 0
        for upstream in keyed.inputs:
            if upstream == uid:
                return offset
            offset += self.vertex(upstream).parallelism
        raise KeyError(uid)

    def split_offset(self, uid: str) -> int:
        """The index of source ``uid``'s first split among all the job's splits."""
        offset = 0
        for src in self.sources:
            if src.uid == uid:
                return offset
            offset += src.parallelism
        raise KeyError(uid)

    def split_ids(self) -> list[str]:
        """The ids of all the job's source splits (prefixed by source uid when several)."""
        if len(self.sources) == 1:
            return self.source.source.split_ids()
        return [f"{s.uid}/{sid}" for s in self.sources for sid in s.source.split_ids()]

    def positions_by_source(
        self, positions: dict[str, int]
    ) -> list[tuple[SourceVertex, dict[str, int]]]:
        """Each source with its own splits' positions among ``positions`` (keyed as
        :meth:`split_ids` names them), under the ids the source itself gives its splits."""
        if len(self.sources) == 1:
            return [(self.source, dict(positions))]
        out = []
        for src in self.sources:
            prefix = f"{src.uid}/"
            own = {k.removeprefix(prefix): v for k, v in positions.items() if k.startswith(prefix)}
            out.append((src, own))
        return out

    def source_connectors(self) -> dict[str, Source]:
        """Source uid -> the source it reads (what the end-to-end guarantee is made of)."""
        return {v.uid: v.source for v in self.sources}

    def sink_connectors(self) -> dict[str, TwoPhaseCommitSink]:
        """Sink uid -> the sink it writes to."""
        return {s.uid: s.sink for s in self.sinks}

    def sinks_of(self, uid: str) -> list[SinkNode]:
        return [s for s in self.sinks if s.vertex == uid]

    def tasks(self) -> dict[str, int]:
        """Operator id (chain-head uid) -> parallelism of every vertex that acknowledges."""
        return {v.uid: v.parallelism for v in self.all_vertices()}

    def stateful(self) -> dict[str, int]:
        """Vertices with working state between epochs (keyed state, a sink's transactions or
        a function's operator state) -> parallelism."""
        with_sinks = {s.vertex for s in self.sinks}
        return {
            v.uid: v.parallelism
            for v in self.all_vertices()
            if isinstance(v, KeyedVertex) or v.uid in with_sinks or checkpointed_functions(v)
        }

    def function_uids(self) -> set[str]:
        """The uids of every operator whose function may hold operator state."""
        return {uid for v in self.all_vertices() for uid in checkpointed_functions(v)}

    # ------------------------------------------------------------------ protocol
    def vertices(self) -> list[VertexModel]:
        out = []
        for v in self.all_vertices():
            ops = [v.uid, *(op.uid for op in v.chain), *(s.uid for s in self.sinks_of(v.uid))]
            out.append(
                VertexModel(
                    id=v.uid,
                    name=" -> ".join(ops),
                    parallelism=v.parallelism,
                    operators=ops,
                    max_parallelism=v.max_parallelism if isinstance(v, KeyedVertex) else None,
                )
            )
        return out

    def edges(self) -> list[tuple[str, str]]:
        return [(i, k.uid) for k in self.keyed_vertices for i in k.inputs]

    def regions(self) -> list[Region]:
        """The failover regions: vertices linked by edges (with the sinks chained into them)
        are one region; a job of independent pipelines has one region per pipeline."""
        root = {v.uid: v.uid for v in self.all_vertices()}

        def find(uid: str) -> str:
            while root[uid] != uid:
                uid = root[uid]
            return uid

        for a, b in self.edges():
            root[find(a)] = find(b)
        groups: dict[str, list[str]] = {}
        for v in self.all_vertices():  # topological order within each region
            groups.setdefault(find(v.uid), []).append(v.uid)
        sources = {s.uid for s in self.sources}
        return [
            Region("+".join(u for u in uids if u in sources), tuple(uids))
            for uids in groups.values()
        ]


def checkpointed_functions(vertex: Vertex) -> dict[str, CheckpointedFunction]:
    """The vertex's functions with operator state, by the uid of the operator that holds them."""
    ops: list[object] = list(vertex.chain)
    if isinstance(vertex, KeyedVertex):
        ops.insert(0, vertex.operator)
    found = {}
    for op in ops:
        # A keyed broadcast operator is the checkpointed function of its broadcast state.
        fn = op if isinstance(op, CheckpointedFunction) else getattr(op, "fn", None)
        if isinstance(fn, CheckpointedFunction):
            found[op.uid] = fn  # type: ignore[attr-defined]
    return found
