"""Page views per app: the seed's example job.

Events carry an ``app_id``; the job keeps a running page-view count per ``app_id`` in keyed
state and writes each update as a JSON line ``{"app_id": "...", "pv": N}`` through the
two-phase-commit file sink.

    sparkpoint run jobs/examples/pv_count.py --standalone --checkpoint-interval 1 \
        --checkpoint-dir file:///tmp/chk --events 100000 --apps 10 --rate 10000 --output out
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.graph import StreamExecutionEnvironment


def build(env: StreamExecutionEnvironment, argv: Sequence[str]) -> argparse.Namespace:
    """Add the PV job to ``env`` from the job's own arguments."""
    parser = argparse.ArgumentParser(prog="pv_count")
    parser.add_argument("--events", type=int, default=100_000, help="total events (bounded)")
    parser.add_argument("--apps", type=int, default=10, help="distinct app ids")
    parser.add_argument("--rate", type=float, default=10_000, help="events/s, 0 = unpaced")
    parser.add_argument("--splits", type=int, default=2, help="source splits (parallelism)")
    parser.add_argument("--emit", choices=["every", "epoch"], default="every")
    parser.add_argument("--output", required=True, help="output directory")
    args = parser.parse_args(list(argv))
    source = GeneratorSource(events=args.events, apps=args.apps, rate=args.rate, splits=args.splits)
    (
        env.from_source(source, uid="events")
        .key_by("app_id")
        .count(uid="pv", output="pv", emit=args.emit)
        .sink_to(FileSink(args.output), uid="sink")
    )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    env = StreamExecutionEnvironment.from_args(argv)
    args = build(env, env.args)
    result = env.execute("pv-count")
    print(
        f"pv-count {result.job_id}: {result.status.value}, {result.records} events in "
        f"{result.duration_s:.1f} s ({result.records_per_second:,.0f}/s), "
        f"{len(result.completed_checkpoints)} checkpoints, {len(result.restores)} restores; "
        f"committed output in {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
