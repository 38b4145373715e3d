"""The ``sparkpoint`` command line (mirrors Flink's ``flink run``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.run_lock import JobRunningError
from sparkpoint.supervisor import (
    EXIT_DRIVER_LOST,
    EXIT_FAILED,
    EXIT_INVALID_CONFIGURATION,
    SUPERVISED_ENV,
    TERMINATION_LOG_ENV,
    exit_canceled,
    supervise,
)


def _run(job: str, job_args: Sequence[str]) -> int:
    """``sparkpoint run``: supervise the job, or (in the supervised child) be its driver."""
    if not os.path.isfile(job):
        print(f"sparkpoint run: no such job file: {job}", file=sys.stderr)
        return EXIT_INVALID_CONFIGURATION
    if os.environ.get(SUPERVISED_ENV) != "1":
        try:
            return supervise(job, job_args)
        except ConfigurationError as err:
            print(f"sparkpoint run: invalid configuration: {err}", file=sys.stderr)
            return EXIT_INVALID_CONFIGURATION
        except JobRunningError as err:
            print(f"sparkpoint run: {err}", file=sys.stderr)
            return EXIT_FAILED
    return _drive(job, job_args)


def _drive(job: str, job_args: Sequence[str]) -> int:
    """Run the job file as its driver; map how it ended to the exit codes of
    :mod:`sparkpoint.supervisor`."""
    from sparkpoint.runtime.authority import JobCanceledError
    from sparkpoint.runtime.driver import JobDriver
    from sparkpoint.runtime.spark import SparkLostError, spark_lost
    from sparkpoint.transport import ControlPlaneLostError

    sys.argv = [job, *job_args]
    job_dir = os.path.dirname(os.path.abspath(job))
    if job_dir not in sys.path:
        sys.path.insert(0, job_dir)
    if os.getcwd() not in sys.path:  # last: the supervisor started us with PYTHONSAFEPATH
        sys.path.append(os.getcwd())
    try:
        runpy.run_path(job, run_name="__main__")
    except ConfigurationError as err:
        print(f"sparkpoint run: invalid configuration: {err}", file=sys.stderr)
        return EXIT_INVALID_CONFIGURATION
    except JobCanceledError as err:
        print(f"sparkpoint run: {err}", file=sys.stderr)
        return exit_canceled(err.signum)
    except (SparkLostError, ControlPlaneLostError) as err:
        return _driver_lost(str(err))
    except SparkpointError as err:
        print(f"sparkpoint run: {err}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:
        # A Py4J error that escaped the runtime's checks (the job's own Spark calls, ...).
        lost = spark_lost(err) if "pyspark" in sys.modules else None
        if lost is not None:
            return _driver_lost(f"lost the driver's Spark: {lost}")
        print(f"sparkpoint run: the job file {job} raised {type(err).__name__}:", file=sys.stderr)
        _print_from_job(err, job)
        return EXIT_FAILED
    if JobDriver.runs == 0:
        print(
            f"sparkpoint run: {job} ran no job: a job file builds its pipeline on a "
            "StreamExecutionEnvironment and calls env.execute(...)",
            file=sys.stderr,
        )
        return EXIT_INVALID_CONFIGURATION
    return 0


def _print_from_job(err: Exception, job: str) -> None:
    """The traceback of ``err`` from the job file's first frame on (the frames of
    ``sparkpoint run`` before it are noise to the job's author); the error alone when the
    job file has no frame in it (it does not compile)."""
    path = os.path.abspath(job)
    tb = err.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
        tb = tb.tb_next
    if tb is None:
        lines = traceback.format_exception_only(err)
    else:
        lines = traceback.format_exception(type(err), err, tb)
    print("".join(lines), end="", file=sys.stderr)


def _port(value: str) -> int:
    """A TCP port to listen on (argparse's type: a bad one is a usage error naming it)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 1 and 65535, got {port}")
    return port


def _driver_lost(cause: str) -> int:
    """End a driver whose Spark is gone: one line on stderr and in the termination log."""
    print(f"sparkpoint run: {cause}", file=sys.stderr)
    fd = os.environ.get(TERMINATION_LOG_ENV)
    if fd:  # the supervisor's unnamed file, inherited
        with contextlib.suppress(OSError, ValueError):
            data = (cause + "\n").encode("utf-8")
            os.ftruncate(int(fd), 0)
            os.pwrite(int(fd), data, 0)
    return EXIT_DRIVER_LOST


def _server(host: str, port: int) -> int:
    from sparkpoint_server.server import serve  # the control plane, installed with Sparkpoint

    return serve(host, port)


def _dashboard(host: str, port: int, api_url: str | None) -> int:
    from sparkpoint_dashboard.server import serve  # the dashboard, installed with Sparkpoint

    return serve(host, port, api_url)


def _print_operation(kind: str, job: str, status: dict[str, Any], as_json: bool) -> int:
    operation = status.get("operation", {})
    failed = bool(status.get("failed") or "failure-cause" in operation)
    if as_json:
        print(json.dumps({"command": kind, "job": job, "failed": failed, **status}))
        return 1 if failed else 0
    if failed:
        cause = operation.get("failure-cause", {}).get("stack-trace", "unknown cause")
        print(f"{kind} of job {job} failed: {cause}", file=sys.stderr)
        return 1
    where = operation.get("location") or operation.get("checkpointId")
    print(f"{kind} of job {job} completed" + (f": {where}" if where else ""))
    return 0


def _api_error(command: str, err: Exception, as_json: bool) -> int:
    """An API error: one line on stderr (a JSON object with ``--output json``); exit 1."""
    if as_json:
        print(json.dumps({"command": command, "error": str(err)}), file=sys.stderr)
    else:
        print(f"sparkpoint {command}: {err}", file=sys.stderr)
    return EXIT_FAILED


def _client_command(ns: argparse.Namespace) -> int:
    from sparkpoint.rest_client import ApiError, ControlPlaneClient, find_api_token

    found = find_api_token()
    client = ControlPlaneClient(ns.api, found.token, unauthorized_hint=found.hint())
    job: str = getattr(ns, "job_id", "")
    as_json = ns.output == "json"
    try:
        if ns.command == "list":
            from sparkpoint.cli_status import job_list_lines

            answer = client.request("GET", "/jobs")
            if as_json:
                print(json.dumps({"jobs": answer["jobs"]}))
            else:
                print("\n".join(job_list_lines(answer, client.base_url)))
            return 0
        if ns.command in STATUS_COMMANDS:
            from sparkpoint.cli_status import shown_and_text

            shown, text = shown_and_text(client, ns)
            print(json.dumps(shown) if as_json else "\n".join(text))
            return 0
        if ns.command == "checkpoints":
            from sparkpoint import cli_checkpoints

            shown = cli_checkpoints.show(client, job, ns.id, ns.limit)
            print(json.dumps(shown) if as_json else "\n".join(cli_checkpoints.lines(job, shown)))
            return 0
        if ns.command == "cancel":
            client.request("PATCH", f"/jobs/{job}", params={"mode": "cancel"})
            print(
                json.dumps({"command": "cancel", "job": job})
                if as_json
                else f"cancelling job {job}"
            )
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
            if answer.get("warning") and not as_json:
                print(f"warning: {answer['warning']}", file=sys.stderr)
            path = f"/jobs/{job}/restore/{answer['request-id']}"
        return _print_operation(ns.command, job, client.wait(path), as_json)
    except ApiError as err:
        return _api_error(ns.command, err, as_json)
    finally:
        client.close()


#: The commands that show (and, given values, change) where a job stands: ``cli_status``.
STATUS_COMMANDS = ("status", "exceptions", "config", "restart-strategy")


#: ``--expires-in`` units, in seconds.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``12h`` or ``30d`` as seconds (``--expires-in``).

    Raises:
        argparse.ArgumentTypeError: naming the value that is not such a duration.
    """
    number, unit = (text[:-1], text[-1]) if text[-1:] in DURATION_UNITS else (text, "s")
    if not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a positive whole number with s, m, h or d (30d)"
        )
    return int(number) * DURATION_UNITS[unit]


def _token_command(ns: argparse.Namespace) -> int:
    """``sparkpoint token create | list | revoke``: the admin API of ``/tokens``."""
    from sparkpoint.rest_client import ApiError, ControlPlaneClient, find_api_token

    found = find_api_token()
    client = ControlPlaneClient(ns.api, found.token, unauthorized_hint=found.hint())
    as_json = ns.output == "json"
    try:
        if ns.token_command == "create":
            body = {"name": ns.name, "role": ns.role}
            if ns.expires_in is not None:
                body["expires_in"] = ns.expires_in
            token = client.request("POST", "/tokens", json=body)
            if as_json:
                print(json.dumps(token))  # the secret too: shown once
                return 0
            print(f"created {token['role']} token {token['id']} ({token['name']})")
            print("secret (shown once, keep it now; only its hash is stored):", file=sys.stderr)
            print(token["secret"])
        elif ns.token_command == "list":
            tokens = client.request("GET", "/tokens")["tokens"]
            if as_json:
                print(json.dumps({"tokens": tokens}))
            for t in [] if as_json else tokens:
                state = "revoked" if t["revoked"] is not None else "active"
                expires = _when(t["expires"]) if t["expires"] is not None else "never"
                print(f"{t['id']}  {t['role']:<8} {state:<7} expires {expires:<20} {t['name']}")
        else:  # revoke
            token = client.request("DELETE", f"/tokens/{ns.token_id}")
            if as_json:
                print(json.dumps(token))
            else:
                print(f"revoked token {token['id']} ({token['name']})")
        return 0
    except ApiError as err:
        return _api_error(f"token {ns.token_command}", err, as_json)
    finally:
        client.close()


def _when(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


class _RunHelp(argparse.Action):
    """``sparkpoint run --help`` (before the job file): every product option, grouped, with
    its Flink key. After the job file, ``--help`` is the job's own."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from sparkpoint.option_parser import help_text

        print(help_text(), end="")
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["savepoint"] and len(args) > 1:
        from sparkpoint import savepoint_tool

        # A job called "inspect" or "dispose": sparkpoint savepoint -- inspect [DIR].
        if args[1] in savepoint_tool.COMMANDS:
            return savepoint_tool.main(args[1:])
    parser = argparse.ArgumentParser(prog="sparkpoint", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run a job file; product options (--standalone, --checkpoint-dir, ...) "
        "and the job's own arguments go after it (sparkpoint run --help lists them)",
        add_help=False,
    )
    run.add_argument("-h", "--help", action=_RunHelp, help="the product options, grouped")
    run.add_argument("job", help="path of the job's Python file")
    run.add_argument("args", nargs=argparse.REMAINDER)
    server = sub.add_parser(
        "server",
        help="start the control plane (settings: REDIS_URL, DATABASE_URL, "
        "SPARKPOINT_API_TOKEN, SPARKPOINT_DATA_DIR)",
    )
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=_port, default=8081)
    api_help = "the control plane's REST API (default: $SPARKPOINT_API_URL or :8081)"
    dashboard = sub.add_parser(
        "dashboard",
        help="start the dashboard (settings: SPARKPOINT_API_URL, SPARKPOINT_DASHBOARD_REFRESH_MS)",
    )
    dashboard.add_argument("--host", default="127.0.0.1")
    dashboard.add_argument("--port", type=_port, default=8050)
    dashboard.add_argument("--api", help=api_help)
    output_help = "text (default) or json: one JSON document on stdout, errors as JSON on stderr"
    listing = sub.add_parser("list", help="list the jobs the control plane knows")
    listing.add_argument("--api", help=api_help)
    listing.add_argument("--output", choices=["text", "json"], default="text", help=output_help)
    for name, what in (
        ("checkpoint", "trigger a checkpoint and wait for it"),
        (
            "savepoint",
            "trigger a savepoint and wait for its location; `sparkpoint savepoint inspect "
            "PATH` and `... dispose PATH` read and delete one",
        ),
        (
            "checkpoints",
            "a job's checkpoint history; --id N: one checkpoint's subtasks (which acknowledged, "
            "their phases, why it failed)",
        ),
        ("stop", "stop a job with a savepoint"),
        ("cancel", "cancel a job"),
        ("restore", "restore a job to a checkpoint or a savepoint"),
    ):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("job_id")
        cmd.add_argument("--api", help=api_help)
        cmd.add_argument("--output", choices=["text", "json"], default="text", help=output_help)
        if name in ("savepoint", "stop"):
            cmd.add_argument("target_directory", nargs="?")
        if name == "checkpoints":
            cmd.add_argument("--id", type=int, help="one checkpoint, subtask by subtask")
            cmd.add_argument(
                "--limit", type=int, default=20, help="history entries, newest first (20)"
            )
        if name == "restore":
            which = cmd.add_mutually_exclusive_group(required=True)
            which.add_argument("--checkpoint", type=int, help="a retained checkpoint's id")
            which.add_argument("--savepoint", help="a savepoint's (or checkpoint's) path")
    _add_status_commands(sub, api_help, output_help)
    token = sub.add_parser("token", help="manage API tokens (needs an admin token)")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token; prints its secret once")
    create.add_argument("name", help="what the token is for")
    create.add_argument(
        "--role", required=True, choices=["viewer", "operator", "admin"], help="its role"
    )
    create.add_argument(
        "--expires-in", type=parse_duration, help="expire after 90s, 15m, 12h, 30d (default: never)"
    )
    token_sub.add_parser("list", help="list the tokens (never their secrets)")
    revoke = token_sub.add_parser("revoke", help="revoke a token: it answers 401 from now on")
    revoke.add_argument("token_id")
    for cmd in token_sub.choices.values():
        cmd.add_argument("--api", help=api_help)
        cmd.add_argument("--output", choices=["text", "json"], default="text", help=output_help)
    ns = parser.parse_args(args)
    if ns.command == "restart-strategy" and ns.strategy:
        from sparkpoint.cli_status import restart_strategy_body

        try:
            ns.strategy = restart_strategy_body(ns.strategy)
        except argparse.ArgumentTypeError as err:
            print(f"sparkpoint restart-strategy: {err}", file=sys.stderr)
            return 2
    if ns.command == "run":
        return _run(ns.job, ns.args)
    if ns.command == "server":
        return _server(ns.host, ns.port)
    if ns.command == "dashboard":
        return _dashboard(ns.host, ns.port, ns.api)
    if ns.command in (
        "list",
        "checkpoint",
        "checkpoints",
        "savepoint",
        "stop",
        "cancel",
        "restore",
        *STATUS_COMMANDS,
    ):
        try:
            return _client_command(ns)
        except BrokenPipeError:  # | head: the reader has what it wanted
            # Python flushes stdout again at exit; pointing it at /dev/null keeps that quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    if ns.command == "token":
        return _token_command(ns)
    parser.error(f"unknown command {ns.command}")
    return 2


def _add_status_commands(sub: Any, api_help: str, output_help: str) -> None:
    from sparkpoint.cli_status import CONFIG_OPTIONS, millis

    helps = {
        "status": "where a job stands: its status and why, its epochs and driver, its last "
        "completed and failed checkpoints, its restart strategy and latest failures",
        "exceptions": "a job's failures, newest first, with what the restart strategy did",
        "config": "a job's checkpoint configuration; --interval, --timeout, --min-pause, "
        "--tolerable-failures, --retained change it from the next trigger",
        "restart-strategy": "a job's restart strategy; TYPE [KEY=VALUE ...] replaces it "
        "(fixed-delay attempts=3 delay='10 s'; Flink's restart-strategy.* options)",
    }
    for name, what in helps.items():
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("job_id")
        cmd.add_argument("--api", help=api_help)
        cmd.add_argument("--output", choices=["text", "json"], default="text", help=output_help)
        if name == "exceptions":
            cmd.add_argument("--limit", type=int, default=20, help="failures, newest first (20)")
        if name == "config":
            for option, (_, is_duration, what) in CONFIG_OPTIONS.items():
                cmd.add_argument(
                    f"--{option.replace('_', '-')}",
                    dest=option,
                    type=millis if is_duration else int,
                    metavar="DURATION" if is_duration else "N",
                    help=what,
                )
        if name == "restart-strategy":
            cmd.add_argument(
                "strategy",
                nargs="*",
                help="none | fixed-delay | failure-rate | exponential-delay, then KEY=VALUE",
            )


if __name__ == "__main__":
    sys.exit(main())
