"""A keyed count whose map loads a model the first time it runs: one subtask spends
``--load`` seconds in the job's first epoch (a marker file, created once, picks which), as a
function that loads a model, or Spark starting executors on a cluster, makes a first epoch
long. Every line it commits is ``{"app_id": ..., "pv": n}``, as the PV job's."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from sparkpoint import FileSink, GeneratorSource, StreamExecutionEnvironment


def main() -> int:
    env = StreamExecutionEnvironment.from_args(None)
    parser = argparse.ArgumentParser(prog="slow_start_job")
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--load", type=float, required=True, help="seconds the load takes")
    parser.add_argument("--marker", required=True, help="created by the one load")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(env.args)
    load_s, marker = args.load, args.marker

    def enrich(event: Any) -> Any:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return event
        time.sleep(load_s)
        return event

    # A backlog: the first epoch has records, so the load runs in it (not in a later one).
    source = GeneratorSource(events=args.events, apps=5, rate=args.rate, backlog=1_000)
    (
        env.from_source(source, uid="events")
        .map(enrich, uid="enrich")
        .key_by("app_id")
        .count(uid="pv", output="pv")
        .sink_to(FileSink(args.output), uid="sink")
    )
    env.execute("slow-start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
