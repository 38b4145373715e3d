"""Keyed state backends without Spark: what a checkpoint every second costs as the state grows.

    make bench-state      # or: .venv/bin/python tests/benchmarks/bench_state.py \
                          #       [--sizes 1MB,100MB,1GB] [--rounds 5] [--configs ...]

One keyed subtask (all 128 key groups), one value state of int keys and ~100-byte values
(``pickle``, the descriptors' default serializer), as many keys as make the canonical snapshot
the target size. Per state size and configuration -- ``hashmap`` checkpoints (its columns
format), ``hashmap`` canonical (as a savepoint writes it), ``rocksdb`` full (canonical
export), ``rocksdb`` native (its files, all of them) and ``rocksdb`` incremental (new SST
files only) -- a fresh process fills the state (round 0, a full round),
then plays "1 % of the keys change per second, a checkpoint every second" for ``--rounds``
rounds, each in the order of the runtime's keyed task (``runtime/tasks.py``):

1. change 1 % of the keys (random ones, new random values) through ``table.put_many``;
2. the barrier: the synchronous part, ``backend.snapshot`` on this (the task) thread, then the
   asynchronous part handed to an upload thread (``runtime/subtask.py``'s ``_materialize``
   into its ``_SnapshotTarget``, into a real ``FileSystemCheckpointStorage``);
3. meanwhile, the end of the epoch: ``save_version`` and ``prune_versions`` through the real
   ``SubtaskVersionStore`` (no durable copies: a single machine, as ``local[*]``);
4. wait for the upload (the runtime's ``finish``); the checkpoint before the previous one is
   discarded (the storage keeps the latest two).

Recorded per round: the synchronous and asynchronous durations, end to end (barrier to
upload done), bytes uploaded (Flink's checkpointed size) and referenced (state size), the
bytes and time of ``save_version``, and the epoch throughput (keys changed per second of
change + save_version). ``hashmap`` stops at ``--hashmap-max`` (100 MB: at 1 GB its cell alone
is projected at 6-7 min and 11 GiB, on top of the ~15 min of the rest on 2 cores), and a
configuration projected (linearly from its run at a smaller size) to take more than
``--cell-budget-s`` or more memory than the machine has is skipped; the report says which and
why. Writes ``tests/benchmarks/results/state.md``
(medians) and ``state.csv`` (every round). Timings are compared within one run only; nothing
is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# The cells import the copy of jobs/ that the run took at its start (CODE_ENV), so that a
# commit landing during the run does not change the code under test halfway.
CODE_ENV = "SPARKPOINT_BENCH_STATE_JOBS"
sys.path.insert(0, os.environ.get(CODE_ENV) or str(ROOT / "jobs"))
sys.path.insert(0, str(HERE))

import state_report  # noqa: E402

from sparkpoint.checkpointing.filesystem_storage import FileSystemCheckpointStorage  # noqa: E402
from sparkpoint.protocol import StateDescriptorModel, StateHandleModel  # noqa: E402
from sparkpoint.runtime.subtask import _materialize, _SnapshotTarget  # noqa: E402
from sparkpoint.runtime.working_state import SubtaskVersionStore  # noqa: E402
from sparkpoint.state import backends, canonical  # noqa: E402
from sparkpoint.state.backend import StateInfo  # noqa: E402
from sparkpoint.state.key_groups import KeyGroupRange, key_groups_of  # noqa: E402
from sparkpoint.state.snapshot_contracts import SnapshotCapture  # noqa: E402

RESULTS = HERE / "results"
WORK_DIR = ROOT / ".sparkpoint" / "bench-state"  # git-ignored; on the big disk
MAX_PARALLELISM = 128
STATE = StateInfo("value", "value", "pickle")
NAME = "bench-0-a0-t0"  # the snapshot's name, as the runtime tags it: uid-subtask-a<n>-t<n>
FILL_CHUNK = 100_000
UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9}


@dataclass(frozen=True)
class Config:
    """One way of checkpointing: a backend and the snapshot it is asked for."""

    key: str
    label: str
    backend: str
    native: bool
    incremental: bool


CONFIGS = {
    c.key: c
    for c in (
        Config("hashmap", "hashmap checkpoint (columns)", "hashmap", True, False),
        Config("hashmap-canonical", "hashmap full (canonical)", "hashmap", False, False),
        Config("rocksdb-full", "rocksdb full (canonical export)", "rocksdb", False, False),
        Config("rocksdb-native", "rocksdb native, all files", "rocksdb", True, False),
        Config("rocksdb-incremental", "rocksdb incremental", "rocksdb", True, True),
    )
}


def parse_size(text: str) -> int:
    """``"100MB"`` -> 100,000,000 (decimal units KB, MB, GB)."""
    text = text.strip().upper()
    for unit, factor in UNITS.items():
        if text.endswith(unit):
            return round(float(text[: -len(unit)]) * factor)
    return int(text)


def values(rng: random.Random, count: int, value_bytes: int) -> list[bytes]:
    """``count`` random values (incompressible, as serialized state mostly is)."""
    buf = rng.randbytes(count * value_bytes)
    return [buf[i : i + value_bytes] for i in range(0, len(buf), value_bytes)]


def keys_for(size_bytes: int, value_bytes: int) -> tuple[int, float]:
    """How many keys make a canonical snapshot of ``size_bytes``, and the bytes per entry
    (measured by encoding 20,000 entries: the canonical format's overhead included)."""
    rng = random.Random(0)
    sample = 20_000
    keys = list(range(1_000_000, 1_000_000 + sample))  # key sizes like those of the run
    groups = key_groups_of(_object_array(keys), MAX_PARALLELISM).tolist()
    blob = canonical.encode_snapshot(
        {STATE.name: STATE},
        zip(groups, [STATE.name] * sample, keys, values(rng, sample, value_bytes), strict=True),
        max_parallelism=MAX_PARALLELISM,
        key_group_range=KeyGroupRange(0, MAX_PARALLELISM - 1),
        watermarks={},
        backend="bench",
    )
    per_entry = len(blob) / sample
    return max(1, round(size_bytes / per_entry)), per_entry


def _object_array(keys: list[int]) -> Any:
    import numpy as np

    return np.fromiter(keys, dtype=object, count=len(keys))


# ----------------------------------------------------------------------------- one cell


def _timed_materialize(
    capture: SnapshotCapture, target: _SnapshotTarget
) -> tuple[list[StateHandleModel], float, float]:
    """The runtime's asynchronous part (``_materialize``), with its start and end times."""
    started = time.perf_counter()
    handles = _materialize(capture, target)
    return handles, started, time.perf_counter()


def run_cell(
    config: Config,
    n_keys: int,
    rounds: int,
    change_fraction: float,
    value_bytes: int,
    work: Path,
    seed: int,
) -> dict[str, Any]:
    """Fill a backend with ``n_keys`` keys (round 0), then ``rounds`` rounds of changes,
    versions and checkpoints (see the module docstring); the rows of every round."""
    rng = random.Random(seed)
    base_rss = psutil.Process().memory_info().rss  # the interpreter and its imports
    storage = FileSystemCheckpointStorage(f"file://{work}/checkpoints")
    job_id = f"bench-{config.key}"
    store = SubtaskVersionStore(
        local_dir=str(work / "local" / "keyed"),
        storage=storage,
        job_id=job_id,
        name="bench-0",
        durable=False,
    )
    kg_range = KeyGroupRange(0, MAX_PARALLELISM - 1)
    backend = backends.create_backend(
        config.backend, MAX_PARALLELISM, kg_range, local_dir=store.local_dir
    )
    table = backend.register(STATE)
    changed = max(1, round(n_keys * change_fraction))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
    cell_started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    previous: str | None = None
    try:
        for r in range(rounds + 1):
            checkpoint_id = r + 1
            tag = f"a0-e{r}-t0"
            # Step 1: the epoch's changes (round 0: every key).
            started = time.perf_counter()
            if r == 0:
                for lo in range(0, n_keys, FILL_CHUNK):
                    chunk = list(range(lo, min(n_keys, lo + FILL_CHUNK)))
                    table.put_many(chunk, values(rng, len(chunk), value_bytes))
                keys_changed = n_keys
            else:
                keys = rng.sample(range(n_keys), changed)
                table.put_many(keys, values(rng, len(keys), value_bytes))
                keys_changed = len(keys)
            change_s = time.perf_counter() - started
            # Step 2: the barrier; the synchronous part here, the asynchronous on a thread.
            sync_started = time.perf_counter()
            capture = backend.snapshot(checkpoint_id, native=config.native)
            sync_s = time.perf_counter() - sync_started
            target = _SnapshotTarget(
                storage,
                job_id,
                checkpoint_id,
                NAME,
                kg_range,
                incremental=config.incremental,
                states=[
                    StateDescriptorModel(name=i.name, kind=i.kind, serializer=i.serializer)
                    for i in backend.state_infos.values()
                ],
                max_parallelism=MAX_PARALLELISM,
            )
            upload = pool.submit(_timed_materialize, capture, target)
            # Step 3: the end of the epoch, while the upload runs.
            started = time.perf_counter()
            saved = backend.save_version(store, tag, previous)
            backend.prune_versions(store, {tag} | ({previous} if previous else set()))
            save_s = time.perf_counter() - started
            # Step 4: the upload done; keep the latest two checkpoints.
            _, async_started, async_done = upload.result()
            if checkpoint_id > 2:
                storage.discard(job_id, checkpoint_id - 2)
            rows.append(
                {
                    "round": r,
                    "keys_changed": keys_changed,
                    "change_s": change_s,
                    "sync_ms": 1000 * sync_s,
                    "async_ms": 1000 * (async_done - async_started),
                    "end_to_end_ms": 1000 * (async_done - sync_started),
                    "uploaded_bytes": target.uploaded,
                    "full_bytes": target.full,
                    "save_version_bytes": saved.bytes_written,
                    "save_version_ms": 1000 * save_s,
                    "epoch_keys_per_s": keys_changed / (change_s + save_s),
                    "local_disk_bytes": _disk_usage(work / "local"),
                }
            )
            previous = tag
    finally:
        pool.shutdown(wait=True)
        backend.close()
    return {
        "rows": rows,
        "cell_s": time.perf_counter() - cell_started,
        "base_rss_bytes": base_rss,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def _disk_usage(path: Path) -> int:
    """Bytes of the distinct files under ``path`` (hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                stat = os.lstat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def cell_main(spec: str) -> int:
    """``--cell`` mode: run one cell described by the JSON ``spec``, print its JSON result."""
    args = json.loads(spec)
    import sparkpoint

    code = os.environ.get(CODE_ENV)
    if code and not os.path.abspath(sparkpoint.__file__).startswith(os.path.abspath(code)):
        raise RuntimeError(f"sparkpoint imported from {sparkpoint.__file__}, not from {code}")
    result = run_cell(
        CONFIGS[args["config"]],
        args["n_keys"],
        args["rounds"],
        args["change_fraction"],
        args["value_bytes"],
        Path(args["work"]),
        args["seed"],
    )
    result["peak_rss_bytes"] *= 1024  # ru_maxrss is in KiB on Linux
    print(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- the run


def mem_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (0 when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


MAX_PROJECTION_FACTOR = 100  # projections from a cell more keys times smaller are not made


def projection(
    done: list[dict[str, Any]], config: Config, n_keys: int
) -> tuple[float, float] | None:
    """(seconds, peak RSS bytes) of ``config`` at ``n_keys``, linear in the keys from its
    largest completed cell (its rounds, without the process start); None when it has none,
    or only one over 100 times smaller (its fixed costs, the memtables and caches, would be
    projected as if they grew with the keys: 1 MB projected 1 GB at 19.5 GiB)."""
    mine = [c for c in done if c["config"] == config.key and c["status"] == "ran"]
    if not mine:
        return None
    last = max(mine, key=lambda c: c["n_keys"])
    factor = n_keys / last["n_keys"]
    if factor > MAX_PROJECTION_FACTOR:
        return None
    base = last["base_rss_bytes"]
    return last["cell_s"] * factor, base + (last["peak_rss_bytes"] - base) * factor


def run_all(args: argparse.Namespace, work: Path, code: Path) -> list[dict[str, Any]]:
    """Every (size, configuration) cell in a process of its own (importing ``code``),
    smallest sizes first."""
    cells: list[dict[str, Any]] = []
    for size_text in args.sizes.split(","):
        size = parse_size(size_text)
        n_keys, per_entry = keys_for(size, args.value_bytes)
        for key in args.configs.split(","):
            config = CONFIGS[key]
            cell: dict[str, Any] = {
                "config": key,
                "label": config.label,
                "size": size_text.strip(),
                "size_bytes": size,
                "n_keys": n_keys,
                "entry_bytes": per_entry,
            }
            cells.append(cell)
            projected = projection(cells[:-1], config, n_keys)
            if projected is not None:
                seconds, rss = projected
                estimate = f"projected {seconds:,.0f} s and {rss / 2**30:.1f} GiB peak RSS"
                if config.backend == "hashmap" and size > parse_size(args.hashmap_max):
                    cell.update(
                        status="skipped",
                        reason=f"above --hashmap-max {args.hashmap_max} ({estimate}, linear "
                        "from its largest run; it would take most of the run's time budget)",
                    )
                elif seconds > args.cell_budget_s:
                    cell.update(
                        status="skipped",
                        reason=f"projected {seconds:,.0f} s (linear from its largest run) "
                        f"> --cell-budget-s {args.cell_budget_s:g}",
                    )
                elif rss > 0.8 * mem_available():
                    cell.update(
                        status="skipped",
                        reason=f"projected peak RSS {rss / 2**30:.1f} GiB > 80 % of the "
                        f"{mem_available() / 2**30:.1f} GiB available",
                    )
                if cell.get("status") == "skipped":
                    print(f"[bench-state] {key} @ {size_text}: skipped, {cell['reason']}")
                    continue
            cell_dir = Path(tempfile.mkdtemp(prefix=f"{key}-{size_text}-", dir=work))
            spec = {
                "config": key,
                "n_keys": n_keys,
                "rounds": args.rounds,
                "change_fraction": args.change_fraction,
                "value_bytes": args.value_bytes,
                "work": str(cell_dir),
                "seed": args.seed,
            }
            print(f"[bench-state] {key} @ {size_text} ({n_keys:,} keys) ...", flush=True)
            cell["load_before"] = os.getloadavg()[0]
            started = time.perf_counter()
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--cell", json.dumps(spec)],
                    capture_output=True,
                    text=True,
                    env={**os.environ, CODE_ENV: str(code)},
                    timeout=args.cell_timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                cell.update(status="failed", reason=f"timed out after {args.cell_timeout_s:g} s")
                continue
            finally:
                shutil.rmtree(cell_dir, ignore_errors=True)
            cell["wall_s"] = time.perf_counter() - started
            cell["load_after"] = os.getloadavg()[0]
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                cell.update(status="failed", reason=f"exit {proc.returncode}: {tail[:300]}")
                print(proc.stderr[-3000:], file=sys.stderr)
                continue
            cell.update(json.loads(proc.stdout.strip().splitlines()[-1]), status="ran")
            print(f"[bench-state]   done in {cell['wall_s']:.1f} s", flush=True)
    return cells


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--cell":
        return cell_main(sys.argv[2])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1MB,100MB,1GB", help="canonical state sizes")
    parser.add_argument("--rounds", type=int, default=5, help="rounds after the full one")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=", ".join(CONFIGS))
    parser.add_argument("--change-fraction", type=float, default=0.01)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument(
        "--hashmap-max", default="100MB", help="largest size the hashmap backend runs at"
    )
    parser.add_argument("--cell-budget-s", type=float, default=900.0)
    parser.add_argument("--cell-timeout-s", type=float, default=1200.0)
    parser.add_argument("--work-dir", default=str(WORK_DIR))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS / "state"), help="results path stem")
    args = parser.parse_args()
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown --configs {sorted(unknown)}; use {', '.join(CONFIGS)}")
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.work_dir))
    started = time.perf_counter()
    version = state_report.code_version()
    started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        code = work / "jobs"
        shutil.copytree(ROOT / "jobs", code, ignore=shutil.ignore_patterns("__pycache__"))
        cells = run_all(args, work, code)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run = {
        "command": state_report.command_line(sys.argv),
        "args": vars(args),
        "configs": {k: asdict(c) for k, c in CONFIGS.items()},
        "wall_s": time.perf_counter() - started,
        "work_dir": args.work_dir,
        "code_version": version,
        "started_at": started_at,
    }
    state_report.write(Path(args.out), run, cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
