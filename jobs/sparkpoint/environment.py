"""Where a job is built and executed: the environment its streams start from (Flink's
``StreamExecutionEnvironment``). It holds the job's options and its own arguments, claims
every operator's uid once, and runs the job graph the streams of :mod:`sparkpoint.graph`
built.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sparkpoint.connectors.sources import Source
from sparkpoint.errors import ConfigurationError
from sparkpoint.job_graph import JobGraph, SourceVertex

if TYPE_CHECKING:
    from sparkpoint.graph import DataStream
    from sparkpoint.options import JobOptions
    from sparkpoint.runtime.driver import JobResult

__all__ = ["StreamExecutionEnvironment"]


class StreamExecutionEnvironment:
    """Where a job is built and executed (Flink's StreamExecutionEnvironment)."""

    def __init__(self, options: JobOptions, args: Sequence[str] = ()) -> None:
        self.options = options
        self.args = list(args)
        self._graph: JobGraph | None = None
        self._uids: set[str] = set()

    @classmethod
    def from_args(
        cls, argv: Sequence[str] | None = None, *, job_options: Iterable[str] = ()
    ) -> StreamExecutionEnvironment:
        """Parse the product's options from ``argv`` (default ``sys.argv[1:]``); keep the rest
        in :attr:`args` for the job's own parser. A ``--`` ends the product's options: what
        follows is the job's, whatever it looks like, and the ``--`` itself is not passed on
        (the job's parser would take every argument after it for a positional one).

        Args:
            argv: the command line.
            job_options: the job's own ``--options``; a leftover option close to a product
                option (``--checkpoint-intervall``) is refused unless the job declares it here.

        Raises:
            ConfigurationError: an invalid or misspelled product option.
        """
        from sparkpoint.options import parse_job_options

        options, rest = parse_job_options(argv, job_options=job_options)
        if "--" in rest:
            at = rest.index("--")
            rest = rest[:at] + rest[at + 1 :]
        return cls(options, rest)

    def _claim(self, uid: str) -> str:
        if not uid or not isinstance(uid, str):
            raise ConfigurationError("every operator needs a non-empty uid")
        if uid in self._uids:
            raise ConfigurationError(f"operator uid {uid!r} is used twice; uids must be unique")
        self._uids.add(uid)
        return uid

    def from_source(self, source: Source, uid: str) -> DataStream:
        """A stream of ``source``'s records; a job may read several sources."""
        from sparkpoint.graph import DataStream  # the streams build on this environment

        if self._graph is None:
            self._graph = JobGraph(name="")
        self._graph.sources.append(SourceVertex(self._claim(uid), source))
        return DataStream(self, self._graph.sources[-1])

    @property
    def graph(self) -> JobGraph:
        if self._graph is None:
            raise ConfigurationError("the job has no source: call env.from_source(...) first")
        return self._graph

    def execute(
        self, job_name: str = "sparkpoint-job", spark: Any = None, *, in_process: bool = False
    ) -> JobResult:
        """Run the job until its bounded input ends (or it fails past its restart strategy).

        ``spark``: the SparkSession (default: one for the options' master). ``in_process``:
        without Spark, every subtask in this process one after the other — for a job's unit
        tests, in milliseconds (:mod:`sparkpoint.runtime.local`)."""
        from sparkpoint.runtime.driver import JobDriver

        graph = self.graph
        graph.name = job_name
        if not graph.sinks:
            raise ConfigurationError(f"job {job_name!r} has no sink: call .sink_to(...)")
        nowhere = [
            v.uid
            for v in graph.all_vertices()
            if graph.downstream(v.uid) is None and not graph.sinks_of(v.uid)
        ]
        if nowhere:
            raise ConfigurationError(
                f"job {job_name!r}: the stream of {', '.join(nowhere)} goes to no sink and no "
                "keyed operator; call .sink_to(...) on it"
            )
        return JobDriver(graph, self.options, spark=spark, in_process=in_process).run()
