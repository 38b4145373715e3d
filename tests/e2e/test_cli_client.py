"""``sparkpoint list | cancel | restore ...`` against a real control plane."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.transport import RedisEventSink, Streams, redis_client

from ..support.acks import bare_ack
from ..support.waiting import wait_for
from .control_plane import REDIS_URL, ROOT, ServerProcess

CLI = str(Path(sys.executable).with_name("sparkpoint"))


def _cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return _command(server, [CLI, *args])


def _command(server: ServerProcess, command: list[str]) -> subprocess.CompletedProcess[str]:
    """``command`` run against ``server`` (``SPARKPOINT_API_URL`` set), its output captured."""
    env = {**server.env(), "SPARKPOINT_API_URL": server.url}
    return subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_list_cancel_and_errors_through_the_command_line(server: ServerProcess) -> None:
    empty = _cli(server, "list")
    assert (empty.returncode, empty.stdout) == (
        0,
        f"no jobs: the control plane at {server.url} knows none\n",
    )
    assert json.loads(_cli(server, "list", "--output", "json").stdout) == {"jobs": []}
    server.register_running_job("job-cli")
    server.register_running_job("j2")
    listed = wait_for(
        "both jobs in `sparkpoint list`",
        lambda: (out := _cli(server, "list")).stdout.count("RUNNING") == 2 and out,
    )
    assert "job-cli" in listed.stdout and "pv" in listed.stdout
    header, *lines = listed.stdout.splitlines()
    assert header.split() == [
        "id", "status", "attempt", "restarts", "last", "checkpoint", "(UTC)", "records/s", "name",
    ]  # fmt: skip
    assert len({line.index("RUNNING") for line in lines}) == 1, lines  # ids in one column
    assert all(line.split()[2:5] == ["1", "0", "-"] for line in lines), lines  # no checkpoint
    cancel = _cli(server, "cancel", "job-cli")
    assert cancel.returncode == 0 and "cancelling job job-cli" in cancel.stdout
    assert "CANCELLING" in _cli(server, "list").stdout
    unknown = _cli(server, "restore", "no-such-job", "--checkpoint", "3")
    assert unknown.returncode == 1 and "job no-such-job not found" in unknown.stderr
    wrong = _cli(server, "savepoint", "job-cli", "relative/dir")
    assert wrong.returncode == 1 and "target-directory" in wrong.stderr


def _cli_in(
    cwd: Path, server: ServerProcess, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in server.env().items()
        if k not in ("SPARKPOINT_API_TOKEN", "SPARKPOINT_DATA_DIR")
    }
    return subprocess.run(
        [str(Path(sys.executable).with_name("sparkpoint")), *args],
        cwd=cwd,
        env={**base, "SPARKPOINT_API_URL": server.url, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_finds_the_demo_servers_token_and_a_401_says_where_it_looked(
    server: ServerProcess, tmp_path: Path
) -> None:
    # No token anywhere: the 401 names the places looked in and the variables to set.
    missing = _cli_in(tmp_path, server, "cancel", "no-such-job")  # reads need no token
    assert missing.returncode == 1 and "HTTP 401" in missing.stderr
    assert "no API token found" in missing.stderr
    assert str(tmp_path / ".sparkpoint/server/api-token") in missing.stderr
    assert str(tmp_path / ".sparkpoint/demo/server/api-token") in missing.stderr
    assert "SPARKPOINT_API_TOKEN" in missing.stderr and "SPARKPOINT_DATA_DIR" in missing.stderr
    # A token that is not this control plane's: said so, with where it came from.
    wrong = _cli_in(tmp_path, server, "cancel", "no-such-job", SPARKPOINT_API_TOKEN="not-it")
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
    assert "the token from SPARKPOINT_API_TOKEN was refused" in wrong.stderr
    # `make demo`'s data directory, relative to where the CLI runs: found without a variable.
    demo = tmp_path / ".sparkpoint" / "demo" / "server"
    demo.mkdir(parents=True)
    (demo / "api-token").write_text(server.env()["SPARKPOINT_API_TOKEN"] + "\n")
    found = _cli_in(tmp_path, server, "cancel", "no-such-job")
    assert "HTTP 404" in found.stderr and "no-such-job" in found.stderr, found.stderr


def test_every_client_command_speaks_json_with_output_json(server: ServerProcess) -> None:
    server.register_running_job("job-json", name="pv-json")

    def listed() -> dict[str, Any] | None:
        out = _cli(server, "list", "--output", "json")
        jobs = json.loads(out.stdout)["jobs"] if out.returncode == 0 else []
        return next((j for j in jobs if j["id"] == "job-json" and j["status"] == "RUNNING"), None)

    job = wait_for("job-json RUNNING in `sparkpoint list --output json`", listed)
    assert job["name"] == "pv-json" and job["attempt"] == 1
    cancel = _cli(server, "cancel", "job-json", "--output", "json")
    assert cancel.returncode == 0 and json.loads(cancel.stdout) == {
        "command": "cancel",
        "job": "job-json",
    }
    unknown = _cli(server, "restore", "no-such-job", "--checkpoint", "3", "--output", "json")
    assert unknown.returncode == 1 and unknown.stdout == ""
    error = json.loads(unknown.stderr)
    assert error["command"] == "restore" and "job no-such-job not found" in error["error"]
    tokens = _cli(server, "token", "list", "--output", "json")
    assert tokens.returncode == 0 and isinstance(json.loads(tokens.stdout)["tokens"], list)


def test_dispose_goes_through_the_control_plane_when_one_is_set(
    server: ServerProcess, tmp_path: Path
) -> None:
    """With ``SPARKPOINT_API_URL`` set, ``savepoint dispose`` asks the control plane (which
    deletes only under its storage roots); ``--local`` deletes from here."""
    storage = FileSystemCheckpointStorage(str(server.data_dir / "savepoints"))
    metadata = {"format": "sparkpoint-checkpoint/1", "checkpoint_id": 3, "acks": []}
    path = storage.write_metadata("elsewhere", 3, {**metadata, "kind": "savepoint"})
    done = _cli(server, "savepoint", "dispose", path)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert re.fullmatch(rf"disposed savepoint 3: deleted {path} \(1 files, \d+ bytes\)", first)
    assert second == f"the control plane at {server.url} no longer lists or restores it"
    assert not Path(path.removeprefix("file://")).exists()
    again = _cli(server, "savepoint", "dispose", path)
    assert again.returncode == 2
    assert again.stderr.startswith(
        "sparkpoint savepoint dispose: POST /savepoint-disposal: HTTP 404"
    )
    outside = tmp_path.parent / f"outside-{server.port}"
    kept = FileSystemCheckpointStorage(str(outside)).write_metadata("x", 4, metadata)
    refused = _cli(server, "savepoint", "dispose", kept)
    assert refused.returncode == 2 and "is outside the storage roots" in refused.stderr
    local = _cli(server, "savepoint", "dispose", "--local", kept)
    assert local.returncode == 0 and "no longer lists" not in local.stdout, local.stderr
    assert not Path(kept.removeprefix("file://")).exists()


def _in_progress(server: ServerProcess, job_id: str, after: int = 0) -> int:
    """Trigger a checkpoint and wait until it is in progress; its id. ``after``: the id of
    the previous one, which may still show IN_PROGRESS until its acknowledgement is applied
    (the trigger is applied on the engine, after the API answered)."""
    with server.api() as api:
        rid = api.post(f"/jobs/{job_id}/checkpoints").json()["request-id"]
        assert rid

        def pending() -> int | None:
            history = api.get(f"/jobs/{job_id}/checkpoints").json()["history"]
            ids = (h["id"] for h in history if h["status"] == "IN_PROGRESS" and h["id"] > after)
            return next(ids, None)

        return int(wait_for("a checkpoint in progress", pending))


def test_checkpoints_shows_the_history_and_why_a_checkpoint_failed(server: ServerProcess) -> None:
    """``sparkpoint checkpoints JOB`` and ``--id N`` against a real control plane, the job's
    acknowledgement and decline sent, signed, as its driver would."""
    job = "job-chk"
    server.register_running_job(job)
    wait_for("job-chk RUNNING", lambda: "RUNNING" in _cli(server, "list").stdout)
    sink = RedisEventSink(
        redis_client(REDIS_URL), Streams(prefix=server.prefix), signer=server.signer()
    )
    done = _in_progress(server, job)
    now = int(time.time() * 1000)
    ack = bare_ack(done, "source", 0, ack_timestamp=now, sync_duration_ms=3.0, state_size=2048)
    ack = ack.model_copy(update={"async_duration_ms": 41.0, "alignment_duration_ms": 5.0})
    sink.publish([p.envelope(job, 1, now, ack)])
    failed = _in_progress(server, job, after=done)
    declined = p.CheckpointDeclined(
        checkpoint_id=failed, operator_id="source", subtask=0, reason="No space left on device"
    )
    sink.publish([p.envelope(job, 1, now, declined)])
    # Until the decline is applied, the second checkpoint shows as in progress.
    shown = wait_for(
        "both in `sparkpoint checkpoints`, the second failed",
        lambda: (
            "1 failed, 0 in progress" in (out := _cli(server, "checkpoints", job)).stdout and out
        ),
    )
    assert shown.returncode == 0, shown.stderr
    head, failover, header, *rows = shown.stdout.splitlines()
    # No tolerable checkpoint failure and no restart strategy: the decline failed the job.
    assert head == (
        f"job {job} (pv) FAILED, attempt 1: 2 checkpoints (1 completed, 1 failed, 0 in "
        "progress), 0 restores"
    )
    assert failover == f"a failover restores: checkpoint {done}"
    assert header.split() == [
        "id", "status", "kind", "attempt", "triggered", "(UTC)", "duration", "size", "acks",
        "failure",
    ]  # fmt: skip
    newest, oldest = (row.split() for row in rows)
    assert newest[:4] == [str(failed), "FAILED", "checkpoint", "1"]
    assert newest[7] == "ms"  # its duration: from the trigger to the decline
    assert "No space left on device" in rows[0] and "0/1" in rows[0]
    assert oldest[:4] == [str(done), "COMPLETED", "checkpoint", "1"]
    assert "2.0 KiB" in rows[1] and "1/1" in rows[1]
    one = _cli(server, "checkpoints", job, "--id", str(failed))
    assert one.returncode == 0, one.stderr
    first, *rest = one.stdout.splitlines()
    assert first.startswith(f"checkpoint {failed} of job {job}: FAILED, attempt 1, ")
    assert re.search(r"0/1 subtasks acknowledged, failed \d+ ms after the trigger, ", first)
    assert any(line.startswith("failure: ") and "No space left" in line for line in rest)
    assert "operator source: 0/1 acknowledged; not acknowledged: subtask 0" in rest
    [subtask] = [line for line in rest if line.startswith("  0 ")]
    assert subtask.split()[1] == "pending_or_failed" and "No space left" in subtask
    completed = _cli(server, "checkpoints", job, "--id", str(done)).stdout
    assert re.search(r"  0 +completed .* 5 ms +3 ms +41 ms +2\.0 KiB", completed), completed
    as_json = json.loads(_cli(server, "checkpoints", job, "--output", "json").stdout)
    assert [h["id"] for h in as_json["checkpoints"]["history"]] == [failed, done]
    missing = _cli(server, "checkpoints", job, "--id", "99")
    assert missing.returncode == 1 and "checkpoint 99 of job job-chk not found" in missing.stderr
    # Piped into a reader that stops early (| head -1; here one that reads nothing, so that
    # the write always finds the pipe closed): no traceback, exit 0.
    piped = _command(server, ["bash", "-c", f"set -o pipefail; {CLI} checkpoints {job} | true"])
    assert (piped.returncode, piped.stderr) == (0, ""), piped.stderr


def test_status_exceptions_config_and_restart_strategy_through_the_command_line(
    server: ServerProcess,
) -> None:
    """What an operator paged about a job runs first: ``status`` (where it stands and why),
    ``exceptions``, and the two settings they may change on the spot, against a real control
    plane; the job's acknowledgement and failure sent, signed, as its driver would."""
    job = "job-paged"
    server.register_running_job(job)
    wait_for("job-paged RUNNING", lambda: "RUNNING" in _cli(server, "list").stdout)
    strategy = _cli(server, "restart-strategy", job, "fixed-delay", "attempts=2", "delay=1 h")
    assert strategy.returncode == 0, strategy.stderr
    assert strategy.stdout.splitlines() == [
        f"job {job}: restart strategy fixed-delay: up to 2 restarts, 1 h apart",
        "  restart-strategy.fixed-delay.attempts: 2",
        "  restart-strategy.fixed-delay.delay: 1 h",
        "  restart-strategy.type: fixed-delay",
    ]
    # An interval longer than the test: no periodic checkpoint comes in between.
    config = _cli(server, "config", job, "--interval", "1h", "--tolerable-failures", "2")
    assert config.returncode == 0, config.stderr
    assert config.stdout.splitlines()[:2] == [
        f"job {job}: checkpoints exactly-once, every 1 h",
        "timeout 10 min, minimum pause 0 ms, at most 1 at once, 2 tolerable failures, 1 retained",
    ]
    sink = RedisEventSink(
        redis_client(REDIS_URL), Streams(prefix=server.prefix), signer=server.signer()
    )
    done = _in_progress(server, job)
    now = int(time.time() * 1000)
    sink.publish([p.envelope(job, 1, now, bare_ack(done, "source", 0, ack_timestamp=now))])
    failure = p.TaskFailed(
        epoch=7, cause="ValueError: cannot parse event 15000", operator_id="source", subtask=0
    )
    sink.publish([p.envelope(job, 1, now, failure)])
    shown = wait_for(
        "the failure in `sparkpoint status`",
        lambda: "ValueError" in (out := _cli(server, "status", job)).stdout and out,
    )
    head, since, records, counts, completed, failover, restarts, title, failed = (
        shown.stdout.splitlines()
    )
    assert head.startswith(f"job {job} (pv): RESTARTING, attempt 1, 0 restarts; started ")
    cause = "epoch 7 of attempt 1 failed in source[0]: ValueError: cannot parse event 15000"
    assert since.startswith("RESTARTING since ") and since.endswith(f" ago): {cause}")
    assert records == "records read: 0; no epoch has ended yet"
    assert counts == "checkpoints: 1 (1 completed, 0 failed, 0 in progress)"
    assert completed.startswith(f"latest completed: {done}, ") and completed.endswith(
        f"/{job}/chk-{done}"
    )
    assert failover == f"a failover restores: checkpoint {done}"
    assert restarts == "restart strategy: fixed-delay: up to 2 restarts, 1 h apart"
    assert title == "latest failures, newest first:"
    # The cause names the epoch and the subtask already: the line does not repeat them.
    assert re.fullmatch(
        rf"  \S+ \S+ UTC  attempt 1  TASK_FAILURE: {re.escape(cause)} -> restart in "
        r"1 h \(fixed-delay: restart 1 of 2 in 1 h\)",
        failed,
    ), failed
    [row] = [line for line in _cli(server, "list").stdout.splitlines() if line.startswith(job)]
    assert row.split()[1:5] == ["RESTARTING", "1", "0", str(done)]
    assert row.split()[5] == "COMPLETED" and row.endswith("  pv")
    listed = _cli(server, "exceptions", job).stdout.splitlines()
    assert listed == [f"job {job}: 1 failure, newest first", failed.strip()]
    as_json = json.loads(_cli(server, "status", job, "--output", "json").stdout)
    assert as_json["job"]["state"] == "RESTARTING"
    assert as_json["exceptions"]["entries"][0]["exceptionName"] == "TASK_FAILURE"
    # Bad input: named, and nothing changes.
    bad = _cli(server, "config", job, "--interval", "5x")
    assert bad.returncode == 2 and "'5x' is not a time" in bad.stderr
    bad = _cli(server, "config", job, "--timeout", "0")
    assert bad.returncode == 1 and "HTTP 400: timeout: " in bad.stderr
    bad = _cli(server, "restart-strategy", job, "fixed-delay", "attempts")
    assert (bad.returncode, bad.stderr) == (
        2,
        "sparkpoint restart-strategy: 'attempts' is not KEY=VALUE (attempts=3; quote a value "
        "with spaces: delay='10 s')\n",
    )
    bad = _cli(server, "restart-strategy", job, "fixed-delay", "tries=3")
    assert bad.returncode == 1
    assert "restart-strategy.fixed-delay.tries: unknown restart strategy option" in bad.stderr
    unknown = _cli(server, "status", "no-such-job")
    assert unknown.returncode == 1 and "HTTP 404: job no-such-job not found" in unknown.stderr
    assert "every 1 h" in _cli(server, "config", job).stdout
    assert "up to 2 restarts" in _cli(server, "restart-strategy", job).stdout
