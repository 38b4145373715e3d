"""The ``sparkpoint`` command line (mirrors Flink's ``flink run``)."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence
from typing import Any

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


def _server(host: str, port: int) -> int:
    from sparkpoint_server.server import serve  # the control plane, installed with Sparkpoint

    return serve(host, port)


def _dashboard(host: str, port: int, api_url: str | None) -> int:
    from sparkpoint_dashboard.server import serve  # the dashboard, installed with Sparkpoint

    return serve(host, port, api_url)


def _print_operation(kind: str, job: str, status: dict[str, Any]) -> int:
    operation = status.get("operation", {})
    if status.get("failed") or "failure-cause" in operation:
        cause = operation.get("failure-cause", {}).get("stack-trace", "unknown cause")
        print(f"{kind} of job {job} failed: {cause}", file=sys.stderr)
        return 1
    where = operation.get("location") or operation.get("checkpointId")
    print(f"{kind} of job {job} completed" + (f": {where}" if where else ""))
    return 0


def _client_command(ns: argparse.Namespace) -> int:
    from sparkpoint.rest_client import ApiError, ControlPlaneClient, api_token

    client = ControlPlaneClient(ns.api, api_token())
    job: str = getattr(ns, "job_id", "")
    try:
        if ns.command == "list":
            for j in client.request("GET", "/jobs")["jobs"]:
                print(f"{j['id']}  {j['status']:<11} attempt {j['attempt']:<3} {j['name']}")
            return 0
        if ns.command == "cancel":
            client.request("PATCH", f"/jobs/{job}", params={"mode": "cancel"})
            print(f"cancelling job {job}")
            return 0
        if ns.command == "checkpoint":
            rid = client.request("POST", f"/jobs/{job}/checkpoints")["request-id"]
            path = f"/jobs/{job}/checkpoints/{rid}"
        elif ns.command == "savepoint":
            body = {"target-directory": ns.target_directory, "cancel-job": False}
            rid = client.request("POST", f"/jobs/{job}/savepoints", json=body)["request-id"]
            path = f"/jobs/{job}/savepoints/{rid}"
        elif ns.command == "stop":
            body = {"targetDirectory": ns.target_directory}
            rid = client.request("POST", f"/jobs/{job}/stop", json=body)["request-id"]
            path = f"/jobs/{job}/stop/{rid}"
        else:  # restore
            body = (
                {"checkpoint_id": ns.checkpoint}
                if ns.checkpoint is not None
                else {"savepoint_path": ns.savepoint}
            )
            answer = client.request("POST", f"/jobs/{job}/restore", json=body)
            if answer.get("warning"):
                print(f"warning: {answer['warning']}", file=sys.stderr)
            path = f"/jobs/{job}/restore/{answer['request-id']}"
        return _print_operation(ns.command, job, client.wait(path))
    except ApiError as err:
        print(f"sparkpoint {ns.command}: {err}", file=sys.stderr)
        return 1
    finally:
        client.close()


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
    server = sub.add_parser(
        "server",
        help="start the control plane (settings: REDIS_URL, DATABASE_URL, "
        "SPARKPOINT_API_TOKEN, SPARKPOINT_DATA_DIR)",
    )
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8081)
    api_help = "the control plane's REST API (default: $SPARKPOINT_API_URL or :8081)"
    dashboard = sub.add_parser(
        "dashboard",
        help="start the dashboard (settings: SPARKPOINT_API_URL, SPARKPOINT_DASHBOARD_REFRESH_MS)",
    )
    dashboard.add_argument("--host", default="127.0.0.1")
    dashboard.add_argument("--port", type=int, default=8050)
    dashboard.add_argument("--api", help=api_help)
    listing = sub.add_parser("list", help="list the jobs the control plane knows")
    listing.add_argument("--api", help=api_help)
    for name, what in (
        ("checkpoint", "trigger a checkpoint and wait for it"),
        ("savepoint", "trigger a savepoint and wait for its location"),
        ("stop", "stop a job with a savepoint"),
        ("cancel", "cancel a job"),
        ("restore", "restore a job to a checkpoint or a savepoint"),
    ):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("job_id")
        cmd.add_argument("--api", help=api_help)
        if name in ("savepoint", "stop"):
            cmd.add_argument("target_directory", nargs="?")
        if name == "restore":
            which = cmd.add_mutually_exclusive_group(required=True)
            which.add_argument("--checkpoint", type=int, help="a retained checkpoint's id")
            which.add_argument("--savepoint", help="a savepoint's (or checkpoint's) path")
    ns = parser.parse_args(argv)
    if ns.command == "run":
        return _run(ns.job, ns.args)
    if ns.command == "server":
        return _server(ns.host, ns.port)
    if ns.command == "dashboard":
        return _dashboard(ns.host, ns.port, ns.api)
    if ns.command in ("list", "checkpoint", "savepoint", "stop", "cancel", "restore"):
        return _client_command(ns)
    parser.error(f"unknown command {ns.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
