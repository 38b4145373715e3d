"""The state benchmark's report: medians per cell, the aims, the Markdown table and the CSV of
every round (``bench_state.py`` measures; this writes it down).
"""

from __future__ import annotations

import csv
import os
import platform
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: Per-round figures, in the CSV's column order.
FIGURES = (
    "keys_changed",
    "change_s",
    "sync_ms",
    "async_ms",
    "end_to_end_ms",
    "uploaded_bytes",
    "full_bytes",
    "save_version_bytes",
    "save_version_ms",
    "epoch_keys_per_s",
    "local_disk_bytes",
)
SYNC_AIM_MS = 50.0
RATIO_AIM = 2.0


# ----------------------------------------------------------------------------- formatting


def fmt_bytes(n: float) -> str:
    """``1234567`` -> ``1.2 MB`` (decimal units, as the sizes of the run)."""
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_ms(ms: float) -> str:
    if ms >= 10_000:
        return f"{ms / 1000:,.1f} s"
    return f"{ms:,.1f} ms" if ms < 100 else f"{ms:,.0f} ms"


def command_line(argv: list[str]) -> str:
    """How the run was started, relative to the repository (``make bench-state`` when make
    started it without extra arguments)."""
    script = os.path.relpath(argv[0], ROOT)
    python = os.path.relpath(sys.executable, ROOT)
    line = " ".join([python, script, *argv[1:]])
    if os.environ.get("MAKELEVEL"):
        return f"make bench-state  (runs `{line}`)"
    return line


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def code_version() -> str:
    """The commit, and the files of the runtime library that differ from it."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = [
        line[3:] for line in _git("status", "--porcelain", "--", "jobs/sparkpoint").splitlines()
    ]
    where = f"commit `{commit}`"
    if dirty:
        where += " with uncommitted changes in " + ", ".join(f"`{d}`" for d in dirty)
    return where


def machine(version: str, started_at: str) -> str:
    """Cores, memory, Python and RocksDB binding versions, when the run started, and
    ``version`` (of the code the cells ran)."""
    mem = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    try:
        rocksdict = metadata.version("rocksdict")
    except metadata.PackageNotFoundError:
        rocksdict = "absent"
    return (
        f"{os.cpu_count()} cores, {mem / 2**30:.1f} GiB memory, Python "
        f"{platform.python_version()}, rocksdict {rocksdict}, "
        f"started {started_at}, {version} "
        "(the run copies `jobs/` at its start and every cell imports that copy)"
    )


# ----------------------------------------------------------------------------- figures


def summarize(cell: dict[str, Any]) -> dict[str, Any]:
    """The first (full) round, and the median, mean and max of the later rounds, of a cell."""
    rows = cell["rows"]
    later = rows[1:] or rows
    out: dict[str, Any] = {"first": rows[0]}
    out["median"] = {f: statistics.median(r[f] for r in later) for f in FIGURES}
    out["mean"] = {f: statistics.fmean(r[f] for r in later) for f in FIGURES}
    out["max"] = {f: max(r[f] for r in later) for f in FIGURES}
    out["rounds"] = len(later)
    return out


def _cell(cells: list[dict[str, Any]], config: str, size: str) -> dict[str, Any] | None:
    for cell in cells:
        if cell["config"] == config and cell["size"] == size and cell["status"] == "ran":
            return cell
    return None


def aims(cells: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, aim, verdict) rows: the incremental checkpoint's growth from the
    smallest to the largest size, the synchronous phase at the largest size, and the bytes
    of ``save_version`` against the state's."""
    out: list[tuple[str, str, str, str]] = []
    sizes = sorted({c["size"]: c["size_bytes"] for c in cells}.items(), key=lambda s: s[1])
    if not sizes:
        return out
    small, large = sizes[0][0], sizes[-1][0]
    lo, hi = _cell(cells, "rocksdb-incremental", small), _cell(cells, "rocksdb-incremental", large)
    if lo is not None and hi is not None and small != large:
        a, b = summarize(lo)["median"], summarize(hi)["median"]
        a_mean, b_mean = summarize(lo)["mean"], summarize(hi)["mean"]
        keys = b["keys_changed"] / a["keys_changed"]
        for figure, unit in (("uploaded_bytes", "bytes uploaded"), ("end_to_end_ms", "duration")):
            ratio = b[figure] / a[figure]
            per_key = ratio / keys
            # The median hides the rounds that upload a compaction's output; the mean shows them.
            per_key_mean = b_mean[figure] / a_mean[figure] / keys
            out.append(
                (
                    f"rocksdb incremental, {large} / {small}: checkpoint {unit}",
                    f"{ratio:,.1f}x (keys changed per round: {keys:,.0f}x; "
                    f"per key changed: {per_key:.2f}x, with means {per_key_mean:.2f}x)",
                    f"<= {RATIO_AIM:g}x",
                    _verdict(ratio <= RATIO_AIM)
                    + ("" if ratio <= RATIO_AIM else f"; per key changed {_verdict(per_key <= 2)}"),
                )
            )
    for cell in cells:
        if cell["size"] != large or cell["status"] != "ran":
            continue
        m = summarize(cell)
        sync = m["median"]["sync_ms"]
        out.append(
            (
                f"{cell['label']}, {large}: synchronous phase, median / max",
                f"{fmt_ms(sync)} / {fmt_ms(m['max']['sync_ms'])}",
                f"< {SYNC_AIM_MS:g} ms",
                _verdict(sync < SYNC_AIM_MS),
            )
        )
    for cell in cells:
        if cell["status"] != "ran":
            continue
        m = summarize(cell)
        share = m["median"]["save_version_bytes"] / max(1, cell["size_bytes"])
        changed = m["median"]["keys_changed"] / cell["n_keys"]
        out.append(
            (
                f"{cell['label']}, {cell['size']}: save_version bytes / state size",
                f"{100 * share:.2f} % ({fmt_bytes(m['median']['save_version_bytes'])}; "
                f"{100 * changed:.2f} % of the keys changed)",
                "~ the share of keys changed",
                _verdict(share <= 3 * changed + 0.001),
            )
        )
    return out


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


# ----------------------------------------------------------------------------- output


def table(cells: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of every cell: the full round, then medians of the later ones."""
    lines = [
        "| size | configuration | keys | round 0: fill / checkpoint / uploaded "
        "| sync | async | end to end (max) | uploaded (max) | state size "
        "| save_version bytes / time | epoch keys/s | peak RSS |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for cell in cells:
        head = f"| {cell['size']} | {cell['label']} | {cell['n_keys']:,} |"
        if cell["status"] != "ran":
            lines.append(head + f" {cell['status']}: {cell['reason']} |" + " |" * 8)
            continue
        m = summarize(cell)
        first, med, top = m["first"], m["median"], m["max"]
        lines.append(
            head
            + f" {first['change_s']:.1f} s / {fmt_ms(first['end_to_end_ms'])} / "
            + f"{fmt_bytes(first['uploaded_bytes'])} "
            + f"| {fmt_ms(med['sync_ms'])} | {fmt_ms(med['async_ms'])} "
            + f"| {fmt_ms(med['end_to_end_ms'])} ({fmt_ms(top['end_to_end_ms'])}) "
            + f"| {fmt_bytes(med['uploaded_bytes'])} ({fmt_bytes(top['uploaded_bytes'])}) "
            + f"| {fmt_bytes(med['full_bytes'])} "
            + f"| {fmt_bytes(med['save_version_bytes'])} / {fmt_ms(med['save_version_ms'])} "
            + f"| {med['epoch_keys_per_s']:,.0f} | {fmt_bytes(cell['peak_rss_bytes'])} |"
        )
    return lines


def markdown(run: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    args = run["args"]
    ran = [c for c in cells if c["status"] == "ran"]
    rounds = summarize(ran[0])["rounds"] if ran else args["rounds"]
    entry = cells[0]["entry_bytes"] if cells else 0.0
    intro = (
        f"Keyed state backends without Spark (`tests/benchmarks/bench_state.py`): one subtask "
        f"(128 key groups), one value state of int keys and {args['value_bytes']}-byte values "
        f"(`pickle`, {entry:.0f} bytes per entry in the canonical format), sized so that the "
        f"canonical snapshot is the target size (decimal units). Round 0 fills every key, "
        f"then {rounds} rounds each change {100 * args['change_fraction']:g} % of the keys "
        "(`put_many`), take a checkpoint (synchronous part on the task thread, asynchronous part "
        "on an upload thread into a real `FileSystemCheckpointStorage` through the runtime's "
        "`_SnapshotTarget`) and meanwhile save the epoch's working state (`save_version` + "
        "`prune_versions` through the real `SubtaskVersionStore`, no durable copies), as the "
        "runtime's keyed task does. Each cell runs in a process of its own.\n\n"
        f"{machine(run['code_version'], run['started_at'])}.\n\n"
        f"Command: `{run['command']}` ({run['wall_s'] / 60:.1f} min in all; work directory "
        f"`{os.path.relpath(run['work_dir'], ROOT)}`)."
    )
    legend = (
        "Columns after *round 0* are medians over the later rounds (max in brackets). *sync*: "
        "`backend.snapshot()` on the task thread; *async*: `materialize` on the upload thread; "
        "*end to end*: barrier to upload done; *uploaded*: bytes written to checkpoint storage "
        "this time (Flink's checkpointed size); *state size*: bytes the snapshot references "
        "(Flink's state size); *save_version*: bytes it reports written and its time with "
        "`prune_versions`, alongside the upload; *epoch keys/s*: keys changed per second of "
        "change + save_version; *peak RSS*: of the cell's process."
    )
    lines = [intro, "", *table(cells), "", legend, "", "| aim | measured | target | |"]
    lines.append("|---|---|---|---|")
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in aims(cells)]
    lines += [
        "",
        f"Every round changes {100 * args['change_fraction']:g} % of the keys, so the largest "
        "size changes as many times more keys per round as it holds: an incremental "
        "checkpoint can at best grow with them, and its ratio *per key changed* is the one "
        f"to hold to {RATIO_AIM:g}x.",
    ]
    loads = [c[k] for c in cells for k in ("load_before", "load_after") if k in c]
    if loads:
        lines += [
            "",
            f"Load average (1 min) around the cells: {min(loads):.1f} to {max(loads):.1f} on "
            f"{os.cpu_count()} cores (the benchmark itself keeps up to 2 threads busy; more "
            "means other work shared the machine).",
        ]
    skipped = [c for c in cells if c["status"] != "ran"]
    lines.append("")
    if skipped:
        lines.append("Not run:")
        lines += [f"- {c['label']} at {c['size']}: {c['status']}, {c['reason']}" for c in skipped]
    else:
        lines.append("Every configuration ran at every size.")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, cells: list[dict[str, Any]]) -> None:
    """One row per round of every cell that ran."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["config", "size", "size_bytes", "n_keys", "round", *FIGURES])
        for cell in cells:
            if cell["status"] != "ran":
                continue
            for row in cell["rows"]:
                writer.writerow(
                    [
                        cell["config"],
                        cell["size"],
                        cell["size_bytes"],
                        cell["n_keys"],
                        row["round"],
                        *(_csv_value(row[f]) for f in FIGURES),
                    ]
                )


def _csv_value(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def summary(cells: list[dict[str, Any]]) -> str:
    """The short summary printed at the end of a run."""
    lines = [
        f"{'size':>6} {'configuration':<34} {'sync':>10} {'async':>10} {'e2e':>10} "
        f"{'uploaded':>10} {'save_ver':>10} {'keys/s':>11}"
    ]
    for cell in cells:
        if cell["status"] != "ran":
            lines.append(
                f"{cell['size']:>6} {cell['label']:<34} {cell['status']}: {cell['reason']}"
            )
            continue
        med = summarize(cell)["median"]
        lines.append(
            f"{cell['size']:>6} {cell['label']:<34} {fmt_ms(med['sync_ms']):>10} "
            f"{fmt_ms(med['async_ms']):>10} {fmt_ms(med['end_to_end_ms']):>10} "
            f"{fmt_bytes(med['uploaded_bytes']):>10} {fmt_bytes(med['save_version_bytes']):>10} "
            f"{med['epoch_keys_per_s']:>11,.0f}"
        )
    lines += [f"{a}: {b} (aim {c}) {d}" for a, b, c, d in aims(cells)]
    return "\n".join(lines)


def write(stem: Path, run: dict[str, Any], cells: list[dict[str, Any]]) -> None:
    """Write ``<stem>.md`` and ``<stem>.csv`` and print the summary."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(markdown(run, cells))
    write_csv(stem.with_suffix(".csv"), cells)
    print(summary(cells))
    print(f"wrote {stem.with_suffix('.md')} and {stem.with_suffix('.csv')}")
