"""The ``sparkpoint`` command line (mirrors Flink's ``flink run``)."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence

from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.supervisor import SUPERVISED_ENV, supervise


def _run(job: str, job_args: Sequence[str]) -> int:
    if not os.path.isfile(job):
        print(f"sparkpoint run: no such job file: {job}", file=sys.stderr)
        return 2
    if os.environ.get(SUPERVISED_ENV) != "1":
        try:
            return supervise(job, job_args)
        except ConfigurationError as err:
            print(f"sparkpoint run: invalid configuration: {err}", file=sys.stderr)
            return 2
    sys.argv = [job, *job_args]
    job_dir = os.path.dirname(os.path.abspath(job))
    if job_dir not in sys.path:
        sys.path.insert(0, job_dir)
    try:
        runpy.run_path(job, run_name="__main__")
    except ConfigurationError as err:
        print(f"sparkpoint run: invalid configuration: {err}", file=sys.stderr)
        return 2
    except SparkpointError as err:
        print(f"sparkpoint run: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkpoint", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run a job file; product options (--standalone, --checkpoint-dir, ...) "
        "and the job's own arguments go after it",
    )
    run.add_argument("job", help="path of the job's Python file")
    run.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if ns.command == "run":
        return _run(ns.job, ns.args)
    parser.error(f"unknown command {ns.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
