"""Page views per app: the seed's example job.

Events carry an ``app_id``; the job keeps a running page-view count per ``app_id`` in keyed
state and writes each update as a JSON line ``{"app_id": "...", "pv": N}`` through the
two-phase-commit file sink.

    sparkpoint run jobs/examples/pv_count.py --standalone --checkpoint-interval 1 \
        --checkpoint-dir file:///tmp/chk --events 100000 --apps 10 --rate 10000 --output out

With ``--source-redis`` the events are the entries of Redis streams instead (each with an
``app_id`` field), read until stopped or, with ``--until-id``, up to that entry id:

    sparkpoint run jobs/examples/pv_count.py --standalone --checkpoint-interval 1 \
        --checkpoint-dir file:///tmp/chk --source-redis redis://127.0.0.1:6379/0 \
        --redis-stream events --until-id 1700000000000-0 --output out
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sparkpoint import FileSink, GeneratorSource, StreamExecutionEnvironment
from sparkpoint.connectors.redis_source import RedisStreamSource
from sparkpoint.connectors.sources import Source


def build(env: StreamExecutionEnvironment, argv: Sequence[str]) -> argparse.Namespace:
    """Add the PV job to ``env`` from the job's own arguments."""
    parser = argparse.ArgumentParser(prog="pv_count")
    parser.add_argument("--events", type=int, default=100_000, help="total events (bounded)")
    parser.add_argument("--apps", type=int, default=10, help="distinct app ids")
    parser.add_argument("--rate", type=float, default=10_000, help="events/s, 0 = unpaced")
    parser.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="events that exist when a paced job starts: it starts this far behind",
    )
    parser.add_argument(
        "--splits", type=int, default=2, help="source splits (with --source-redis: per stream)"
    )
    parser.add_argument("--emit", choices=["every", "epoch"], default="every")
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--source-redis", help="read the events from Redis streams at this URL")
    parser.add_argument("--redis-stream", action="append", help="a stream key (repeatable)")
    parser.add_argument("--redis-group", default="pv-count", help="the consumer group")
    parser.add_argument("--until-id", help="stop after this Redis entry id (default: run on)")
    args = parser.parse_args(list(argv))
    source: Source
    if args.source_redis:
        source = RedisStreamSource(
            args.source_redis,
            args.redis_stream or [],
            group=args.redis_group,
            splits_per_stream=args.splits,
            until_id=args.until_id,
        )
    else:
        source = GeneratorSource(
            events=args.events,
            apps=args.apps,
            rate=args.rate,
            splits=args.splits,
            backlog=args.backlog,
        )
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
    env.execute("pv-count")  # the job's lines (and its summary) are on stderr
    print(f"pv-count: committed output in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
