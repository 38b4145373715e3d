"""The canonical keyed-state format at scale: encode, decode and restore of many entries.

    .venv/bin/python tests/benchmarks/bench_canonical.py [--sizes 10000,100000,1000000]
                                                          [--rounds 3] [--jobs DIR]

One ``hashmap`` backend of 128 key groups with one value state of str keys (``"app-N"``) and
int values, for the ``pickle`` serializer (the descriptors' default, the PV job's count) and
for ``int64``. Per size and serializer, the median of ``--rounds`` rounds of:

- encode: :func:`sparkpoint.testing.snapshot_blob` (both phases of a checkpoint);
- decode: ``canonical.decode_snapshot(blob).entries()``, every entry consumed;
- restore: ``HashMapKeyedStateBackend.restore([blob], ...)``.

Prints a table and writes it to ``tests/benchmarks/results/canonical.md``. ``--jobs`` runs
another copy of ``jobs/`` (a checkout of an earlier commit, for a before/after). Timings
compare within one run on one machine only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", default=str(ROOT / "jobs"), help="the jobs/ directory to run")
    parser.add_argument("--out", default=str(HERE / "results" / "canonical.md"))
    return parser.parse_args()


def _median_seconds(run: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    args = _parse()
    sys.path.insert(0, args.jobs)
    from sparkpoint.state import canonical
    from sparkpoint.state.descriptors import ValueStateDescriptor
    from sparkpoint.state.hashmap import HashMapKeyedStateBackend
    from sparkpoint.state.key_groups import KeyGroupRange
    from sparkpoint.testing import snapshot_blob

    kg_range = KeyGroupRange(0, 127)
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        keys = [f"app-{i}" for i in range(size)]
        for serializer in ("pickle", "int64"):
            backend = HashMapKeyedStateBackend(128, kg_range)
            backend.get_state(ValueStateDescriptor("count", 0, serializer=serializer))
            backend.table("count").put_many(keys, list(range(size)))
            blob = snapshot_blob(backend)

            def decode(blob: bytes = blob) -> None:
                for _ in canonical.decode_snapshot(blob, "bench").entries():
                    pass

            def restore(blob: bytes = blob) -> None:
                HashMapKeyedStateBackend.restore([blob], 128, kg_range)

            row = (
                size,
                serializer,
                len(blob),
                _median_seconds(lambda b=backend: snapshot_blob(b), args.rounds),
                _median_seconds(decode, args.rounds),
                _median_seconds(restore, args.rounds),
            )
            rows.append(row)
            print(
                f"{size:>9,} {serializer:<6} {len(blob) / 1e6:7.1f} MB  encode {row[3]:6.3f} s"
                f"  decode {row[4]:6.3f} s  restore {row[5]:6.3f} s",
                flush=True,
            )
            del backend, blob
    _write(args, rows)


def _write(args: argparse.Namespace, rows: list[tuple[int, str, int, float, float, float]]) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# Canonical keyed-state format: encode, decode, restore",
        "",
        f"One hashmap value state, str keys (`app-N`), int values; 128 key groups; median of "
        f"{args.rounds} rounds; {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{date.today()}, commit {commit or '?'} (plus the working tree).",
        "",
        f"`.venv/bin/python tests/benchmarks/bench_canonical.py --sizes {args.sizes} "
        f"--rounds {args.rounds}`",
        "",
        "| entries | serializer | blob | encode (snapshot_blob) | decode (entries()) | restore |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for size, serializer, nbytes, enc, dec, res in rows:
        lines.append(
            f"| {size:,} | {serializer} | {nbytes / 1e6:.1f} MB | {enc:.3f} s | {dec:.3f} s "
            f"| {res:.3f} s |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
