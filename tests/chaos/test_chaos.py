"""Chaos: a connected job under a fault every few seconds, then nothing lost and nothing left.

The PV job runs supervised (``sparkpoint run``) against a real ``sparkpoint server`` with its
embedded Redis and SQLite, checkpoints every second into a tmpfs of its own. Faults come at
random moments (a seeded schedule, every kind in turn; start-up, warm-up and restore included):
a Python worker, the driver's JVM or the driver process killed, the driver paused (SIGSTOP)
for 2-12 s, longer at times than its lease (3 s) and its heartbeat timeout (6 s: heartbeats
every second), the control plane killed and restarted, or paused with its engine for 2-10 s,
its engine alone killed (the server starts it again, or stops when it died too often and is
restarted), the embedded Redis killed, the checkpoint storage full then freed, the control
plane's disk full then freed (its database and its Redis refuse writes), the database locked
for 10 s. It runs with the server as it starts by default (the API and
its engine, two processes) and, with ``make chaos``, also in one process
(``SPARKPOINT_API_PROCESS=false``, where the engine fault finds no engine and is skipped).
When the faults stop the job must finish by itself, and then:

- the committed output equals a failure-free run's (every ``{"app_id", "pv": k}`` once);
- no in-progress part, no state file outside a retained checkpoint, no working state is left;
- the checkpoint history has no gaps and nothing IN_PROGRESS;
- every restart is in ``GET /jobs/{id}/exceptions`` with its cause;
- no process of the run is left behind.

``SPARKPOINT_CHAOS_SECONDS`` sets how long faults come (default 60, the bounded form that
``make test-long`` runs; ``make chaos`` runs 300), ``SPARKPOINT_CHAOS_SEED`` the schedule,
``SPARKPOINT_CHAOS_KINDS`` (comma-separated) which faults come, ``SPARKPOINT_CHAOS_MODES``
(comma-separated, ``two-processes`` and ``one-process``) which server modes run: the default
mode alone in the bounded form (each run is ~150 s of CI); ``make chaos`` runs both. A report
of every fault goes to ``SPARKPOINT_CHAOS_REPORT`` (default ``.sparkpoint/chaos/report.md``),
one per server mode: ``report-two-processes.md`` and ``report-one-process.md``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.testing import line_counts
from tests.e2e.control_plane import ROOT, ServerProcess

from .faults import KINDS, ChaosTargets, FaultResult, FaultSchedule, mount_tmpfs, unmount

SECONDS = float(os.environ.get("SPARKPOINT_CHAOS_SECONDS", "60"))
SEED = int(os.environ.get("SPARKPOINT_CHAOS_SEED", str(random.SystemRandom().randrange(1 << 30))))
KINDS_RUN = tuple(
    k for k in os.environ.get("SPARKPOINT_CHAOS_KINDS", ",".join(KINDS)).split(",") if k
)
MODES = tuple(m for m in os.environ.get("SPARKPOINT_CHAOS_MODES", "two-processes").split(",") if m)
if unknown_modes := sorted(set(MODES) - {"two-processes", "one-process"}):
    raise ValueError(f"unknown chaos modes {unknown_modes}: two-processes, one-process")
REPORT = Path(os.environ.get("SPARKPOINT_CHAOS_REPORT", ROOT / ".sparkpoint/chaos/report.md"))
APPS, RATE = 10, 1_000

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.long,
    pytest.mark.spark,
    pytest.mark.timeout(SECONDS + 900),
]


@dataclass
class EmbeddedServer(ServerProcess):
    """``sparkpoint server`` with its own embedded Redis (no ``REDIS_URL``) and SQLite, in
    two processes (the API and its engine, the default) or in one."""

    api_process: bool = True

    def env(self) -> dict[str, str]:
        env = super().env()
        env.pop("REDIS_URL")
        env["SPARKPOINT_API_PROCESS"] = "true" if self.api_process else "false"
        # A driver paused for longer than this is failed over (to itself, once it wakes).
        env["SPARKPOINT_HEARTBEAT_INTERVAL"] = "1"
        env["SPARKPOINT_HEARTBEAT_TIMEOUT"] = "6"
        return env


@dataclass
class ChaosRun:
    tmp: Path
    server: EmbeddedServer
    job_id: str = field(default_factory=lambda: f"chaos{uuid.uuid4().hex[:12]}")
    storage_mounted: bool = False
    server_disk_mounted: bool = False
    mode: str = "two-processes"  # as SPARKPOINT_CHAOS_MODES names it
    faults: list[tuple[float, FaultResult]] = field(default_factory=list)

    @property
    def checkpoints(self) -> Path:
        return self.tmp / "chk"

    @property
    def output(self) -> Path:
        return self.tmp / "out"

    def start_job(self, events: int) -> subprocess.Popen[str]:
        with open(self.tmp / "job.log", "w") as log:  # the child keeps its own descriptor
            return self._popen(events, log)

    def _popen(self, events: int, log: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sparkpoint.cli",
                "run",
                "jobs/examples/pv_count.py",
                "--job-id",
                self.job_id,
                "--stream-prefix",
                self.server.prefix,
                "--checkpoint-dir",
                f"file://{self.checkpoints}",
                "--checkpoint-interval",
                "1",
                "--retained",
                "2",
                "--restart-strategy",
                "fixed-delay",
                "--restart-attempts",
                "1000",
                "--restart-delay",
                "0.5",
                "--epoch-target-ms",
                "500",
                "--local-dir",
                str(self.tmp / "local"),
                "--events",
                str(events),
                "--apps",
                str(APPS),
                "--rate",
                str(RATE),
                "--output",
                str(self.output),
            ],
            cwd=ROOT,
            env=self.server.env(),  # SPARKPOINT_DATA_DIR: the job finds the embedded Redis
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture(params=MODES)
def chaos(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChaosRun]:
    data = tmp_path / "data"
    data.mkdir()
    server = EmbeddedServer(data, api_process=request.param == "two-processes")
    run = ChaosRun(tmp_path, server, mode=request.param)
    run.storage_mounted = mount_tmpfs(run.checkpoints, size_mb=64)
    # The database and the Redis' append-only file of a 300 s run stay below 60 MB.
    run.server_disk_mounted = mount_tmpfs(data, size_mb=256)
    run.server.start()
    try:
        yield run
    finally:
        run.server.stop()
        for mounted, path in [
            (run.storage_mounted, run.checkpoints),
            (run.server_disk_mounted, data),
        ]:
            if mounted:
                unmount(path)


def _expected_output(events: int) -> Counter[str]:
    src = GeneratorSource(events=events, apps=APPS, rate=0)
    per_app: Counter[str] = Counter()
    for i in range(len(src.split_ids())):
        per_app.update(src.read(i, 0, src.total(i) or 0).column("app_id").tolist())
    return Counter(
        f'{{"app_id": "{app}", "pv": {k}}}' for app, n in per_app.items() for k in range(1, n + 1)
    )


def _left_in_storage(job_dir: Path) -> list[str]:
    """Files under the job's checkpoint directory that no retained checkpoint references."""
    if not job_dir.exists():
        return []
    referenced: set[Path] = set()
    for meta_file in job_dir.glob("chk-*/_metadata"):
        referenced.add(meta_file)
        meta = json.loads(meta_file.read_text())
        for ack in meta["acks"]:
            for handle in ack["handles"]:
                if handle.get("path"):
                    referenced.add(Path(handle["path"].removeprefix("file://")))
    return sorted(
        str(f.relative_to(job_dir))
        for f in job_dir.rglob("*")
        if f.is_file() and f not in referenced
    )


def _write_report(run: ChaosRun, summary: dict[str, Any]) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    report = REPORT.with_name(f"{REPORT.stem}-{run.mode}{REPORT.suffix}")
    ran = Counter(r.kind for _, r in run.faults if r.ran)
    skipped = Counter(r.kind for _, r in run.faults if not r.ran)
    lines = [
        f"# Chaos run, server in {run.mode.replace('-', ' ')} "
        f"(seed {SEED}, faults for {SECONDS:g} s)",
        "",
        "| fault | ran | skipped |",
        "|---|---|---|",
        *(f"| {k} | {ran[k]} | {skipped[k]} |" for k in KINDS),
        "",
        *(f"- {k}: {v}" for k, v in summary.items()),
        "",
        "## Faults in order",
        "",
        *(
            f"- t+{t:.1f} s {r.kind}: {'ran' if r.ran else 'skipped'}, {r.detail}"
            for t, r in run.faults
        ),
    ]
    report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def test_a_connected_job_under_faults_loses_nothing_and_leaves_nothing(chaos: ChaosRun) -> None:
    run = chaos
    # Input for the fault window and some more: the job is still reading when faults stop,
    # also when the first round of every kind runs past the window (up to ~127 s: eleven
    # gaps of at most 7 s, the database locked for 10 s, the storage full for up to 8 s, the
    # control plane's disk for up to 10 s, pauses of up to 12 and 10 s).
    events = int(RATE * (SECONDS + 90))
    rng = random.Random(SEED)
    server = run.server

    def restart_control_plane() -> None:
        server.proc = None
        server.start()

    targets = ChaosTargets(
        supervisor_pid=0,
        server_pid=lambda: server.proc.pid if server.proc and server.proc.poll() is None else None,
        restart_control_plane=restart_control_plane,
        redis_pid_file=server.data_dir / "redis" / "redis.pid",
        database=server.data_dir / "sparkpoint.db",
        storage=run.checkpoints if run.storage_mounted else None,
        server_disk=server.data_dir if run.server_disk_mounted else None,
        rng=rng,
    )
    job = run.start_job(events)
    targets.supervisor_pid = job.pid
    schedule = FaultSchedule(rng, gap_s=(3.0, 7.0), kinds=KINDS_RUN)
    started = time.monotonic()
    kind: str | None = None
    try:
        # 1. Faults until the window closes and every kind was tried once (or the job ended:
        # that is a failure below).
        while job.poll() is None:
            time.sleep(schedule.gap_after(kind))
            window_over = time.monotonic() - started > SECONDS and schedule.every_kind_tried
            if window_over or job.poll() is not None:
                break
            kind = schedule.next_kind()
            run.faults.append((time.monotonic() - started, targets.inject(kind)))
        # 2. The job finishes by itself.
        rc = job.wait(timeout=SECONDS + 600)
        log = (run.tmp / "job.log").read_text()
        assert rc == 0, f"sparkpoint run exited {rc}:\n{log[-5000:]}"
    finally:
        if job.poll() is None:
            for proc in [*psutil.Process(job.pid).children(recursive=True)]:
                proc.kill()
            job.kill()
    with server.api() as api:
        final = api.get(f"/jobs/{run.job_id}").json()
        history = api.get(f"/jobs/{run.job_id}/checkpoints?limit=10000").json()["history"]
        exceptions = api.get(f"/jobs/{run.job_id}/exceptions?limit=10000").json()
    entries = exceptions["exceptionHistory"]["entries"]
    ids = sorted(h["id"] for h in history)
    summary = {
        "job": f"{final['state']}, attempt {final['attempt']}, restarts {final.get('restarts')}",
        "checkpoints": dict(Counter(h["status"] for h in history)),
        "exceptions": len(entries),
        "committed lines": sum(line_counts(str(run.output)).values()),
        "expected lines": events,
        "wall time": f"{time.monotonic() - started:.0f} s",
    }
    _write_report(run, summary)
    # 3. Nothing lost, nothing twice.
    assert final["state"] == "FINISHED"
    assert line_counts(str(run.output)) == _expected_output(events)
    # 4. Nothing left behind: in-progress parts, unreferenced state, working state, processes.
    assert [f.name for f in run.output.iterdir() if f.name.endswith(".inprogress")] == []
    assert _left_in_storage(run.checkpoints / run.job_id) == []
    assert not (run.tmp / "local" / run.job_id).exists()
    assert not psutil.pid_exists(job.pid) or psutil.Process(job.pid).status() == "zombie"
    # 5. The history has no gaps, and nothing is pending.
    assert ids == list(range(1, len(ids) + 1))
    assert [h["id"] for h in history if h["status"] == "IN_PROGRESS"] == []
    # 6. Every restart is listed with its cause.
    assert final["attempt"] - 1 <= len(entries), entries
    assert all(e["stacktrace"] for e in entries), entries
    # 7. Every kind of fault was tried.
    assert {r.kind for _, r in run.faults} == set(KINDS_RUN), run.faults
