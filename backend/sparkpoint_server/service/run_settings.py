"""What a job's driver runs with when it registers again (a job the control plane knows).

- A restarted driver of a live job (``sparkpoint run`` or a cluster manager started it again
  after its process died) keeps the control plane's checkpoint settings and restart strategy:
  those changed through ``PATCH`` since the job started win over its command line.
- An ended job run again (``sparkpoint run --job-id`` of a finished, cancelled or failed job)
  runs with its new command line's, as a job submitted again does in Flink: a finished job
  cannot be PATCHed, so the stored settings are only those of its earlier run.
- Either way its checkpoints stay where the job keeps them: a driver that names another
  checkpoint storage is refused, since its state files would go to one place and the
  control plane's ``_metadata`` (and retention's deletions) to the other.
"""

from __future__ import annotations

import dataclasses
import logging

from sparkpoint import protocol as p
from sparkpoint.errors import ConfigurationError
from sparkpoint_server.coordination.job import (
    JobRuntime,
    RunSettings,
    checkpoint_config_dict,
    run_settings_from,
    storage_of,
)
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service import storage_io
from sparkpoint_server.service.batch import Batch

log = logging.getLogger(__name__)


def check_storage(rt: JobRuntime, ev: p.JobRegistered, default_dir: str) -> None:
    """Refuse a driver of a known job that would write its checkpoints elsewhere.

    Raises:
        ConfigurationError: the registering driver names another checkpoint storage or
            directory than the job's (the same one written otherwise is the same: a
            ``file://`` URL or a path, a trailing slash, a link).
    """
    kept, named = storage_of(rt.config, default_dir), storage_of(dict(ev.config), default_dir)
    if kept[0] == named[0] and storage_io.same_place(kept[1], named[1]):
        return
    kinds = kept[0] != named[0]
    raise ConfigurationError(
        f"job {rt.job_id} keeps its checkpoints in {_where(kept, kinds)}, and this driver "
        f"would write them to {_where(named, kinds)}: run it with the job's "
        "--checkpoint-dir, or as a new job (another --job-id) with --from-checkpoint to "
        "checkpoint elsewhere"
    )


def _where(storage: tuple[str, str], kind: bool) -> str:
    return f"{storage[1]} ({storage[0]} storage)" if kind else storage[1].rstrip("/")


def rerun_settings(ev: p.JobRegistered) -> RunSettings:
    """The checkpoint settings and restart strategy of an ended job's run again.

    Raises:
        ConfigurationError: naming what of its command line is invalid.
    """
    return run_settings_from(dict(ev.config), dict(ev.config.get("restart_strategy") or {}))


def adopt(batch: Batch, rt: JobRuntime, settings: RunSettings) -> None:
    """An ended job run again: its command line's settings are the job's from now on. Call it
    once its restore is decided: a lower ``retained`` deletes what it no longer keeps, and
    the checkpoint being restored is pinned by then."""
    before = checkpoint_config_dict(rt.coordinator.config)
    new = rt.coordinator.update_config(dataclasses.asdict(settings.checkpoint), running=False)
    rt.restart = settings.restart
    stored = checkpoint_config_dict(new)
    changed = {k: v for k, v in stored.items() if before.get(k) != v}
    if changed:
        log.info("job %s runs again with the checkpoint settings %s", rt.job_id, changed)
    batch.writer.job(
        rt.job_id,
        checkpoint_config=stored,
        restart_strategy=dict(settings.restart.to_config()),
        updated_at=batch.now,
    )
    d.discard_subsumed(batch, rt)


def tell(batch: Batch, rt: JobRuntime, ev: p.JobRegistered) -> None:
    """A restarted driver registers with its command line's checkpoint settings; those the
    control plane has (changed through ``PATCH /jobs/{id}/checkpoints/config`` since) win, and
    the driver hears them as the earlier one did: what it expects of the control plane (how
    often a command comes) follows them."""
    current = checkpoint_config_dict(rt.coordinator.config)
    changes = {
        name: value
        for name, value in current.items()
        if isinstance(value, int) and ev.config.get(name) != value
    }
    if changes:
        batch.command(rt.job_id, rt.attempt, p.ConfigurationChanged(changes=changes))
