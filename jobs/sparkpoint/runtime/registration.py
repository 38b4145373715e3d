"""What a job registers with (``job_registered``): its graph, configuration and guarantee.

The same registration goes to the control plane (connected mode) and to the events of a
standalone job; :mod:`~sparkpoint.runtime.authority` sends it first.
"""

from __future__ import annotations

from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.restart import RestartStrategy
from sparkpoint.guarantees import Guarantee, end_to_end
from sparkpoint.options import JobOptions
from sparkpoint.runtime.execution import JobExecution


def config_summary(options: JobOptions, restart: RestartStrategy) -> dict[str, Any]:
    """The configuration a job registers with (``job_registered``)."""
    c = options.checkpoint
    return {
        "mode": c.mode.value,
        "interval_ms": c.interval_ms,
        "timeout_ms": c.timeout_ms,
        "min_pause_ms": c.min_pause_ms,
        "max_concurrent": c.max_concurrent,
        "tolerable_failures": c.tolerable_failures,
        "retained": c.retained,
        "checkpoint_storage": options.checkpoint_storage,
        "checkpoint_dir": options.checkpoint_dir,
        "state_backend": options.state_backend,
        "incremental": options.incremental,
        "max_parallelism": options.max_parallelism,
        "restart_strategy": restart.to_config(),
        "failover_strategy": options.failover_strategy,
    }


def registration(
    job: JobExecution,
    restart: RestartStrategy,
    *,
    incarnation: str | None = None,
    extra_config: dict[str, Any] | None = None,
) -> p.JobRegistered:
    """The ``job_registered`` event of a job (graph, configuration, restart strategy, and the
    end-to-end guarantee its sources and sinks give)."""
    guarantee = job_guarantee(job)
    return p.JobRegistered(
        job_name=job.graph.name,
        vertices=job.graph.vertices(),
        edges=job.graph.edges(),
        config={
            **config_summary(job.options, restart),
            # Failover regions by name (their sources' uids): what a region failover restarts.
            "failover_regions": {r.name: list(r.vertices) for r in job.graph.regions()},
            **(extra_config or {}),
        },
        incarnation=incarnation,
        guarantee=p.GuaranteeModel(level=guarantee.level, reason=guarantee.reason),
    )


def job_guarantee(job: JobExecution) -> Guarantee:
    """The end-to-end guarantee of ``job``: its graph's sources and sinks in its mode."""
    graph = job.graph
    return end_to_end(
        graph.source_connectors(), graph.sink_connectors(), job.options.checkpoint.mode
    )
