"""``sparkpoint token create | list | revoke`` against a real control plane, and what the
tokens they make may do: their role, their revocation, the audit log that records it all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .control_plane import ROOT, TOKEN, ServerProcess


def _cli(server: ServerProcess, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {**server.env(), "SPARKPOINT_API_URL": server.url, "SPARKPOINT_API_TOKEN": token}
    return subprocess.run(
        [str(Path(sys.executable).with_name("sparkpoint")), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_tokens_made_on_the_command_line_have_their_role_until_revoked(
    server: ServerProcess,
) -> None:
    created = _cli(
        server, "token", "create", "ci deploys", "--role", "operator", "--expires-in", "1d"
    )
    assert created.returncode == 0, created.stderr
    summary, secret = created.stdout.splitlines()
    token_id = summary.split()[3]
    assert summary == f"created operator token {token_id} (ci deploys)"
    assert secret.startswith("spt_")
    assert "shown once" in created.stderr

    listed = _cli(server, "token", "list")
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    assert line.startswith(f"{token_id}  operator active  expires 20")
    assert line.endswith(" ci deploys")
    assert secret not in listed.stdout

    # An operator may act on jobs (the job is unknown: 404, not 403) but not manage tokens.
    cancel = _cli(server, "cancel", "no-such-job", token=secret)
    assert cancel.returncode == 1 and "HTTP 404: job no-such-job not found" in cancel.stderr
    refused = _cli(server, "token", "list", token=secret)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "sparkpoint token list: GET /tokens: HTTP 403: this call needs a token with the role "
        f"admin (or higher); token {token_id} has the role operator"
    )

    revoked = _cli(server, "token", "revoke", token_id)
    assert revoked.returncode == 0 and revoked.stdout == f"revoked token {token_id} (ci deploys)\n"
    after = _cli(server, "cancel", "no-such-job", token=secret)
    assert after.returncode == 1
    assert f"HTTP 401: the bearer token {token_id} is revoked" in after.stderr
    assert " revoked " in _cli(server, "token", "list").stdout

    with server.api() as api:
        audit = api.get("/audit").json()["entries"]
    calls = [(e["token-name"], e["method"], e["path"], e["status"]) for e in audit]
    assert calls == [
        ("invalid token", "PATCH", "/jobs/no-such-job", 401),
        ("bootstrap admin", "DELETE", f"/tokens/{token_id}", 200),
        ("ci deploys", "PATCH", "/jobs/no-such-job", 404),
        ("bootstrap admin", "POST", "/tokens", 201),
    ]
    assert secret not in str(audit)


def test_a_bad_duration_is_refused_before_any_call(server: ServerProcess) -> None:
    bad = _cli(server, "token", "create", "x", "--role", "viewer", "--expires-in", "soon")

    assert bad.returncode == 2
    assert "'soon' is not a duration" in bad.stderr
