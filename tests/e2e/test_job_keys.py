"""A job's key from the real control plane: over the authenticated API, or from its data
directory's secret, the same either way (``sparkpoint.signing``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sparkpoint.errors import ConfigurationError
from sparkpoint.signing import SECRET_FILE, driver_job_key, job_key, read_secret

from .control_plane import TOKEN, ServerProcess


def test_a_driver_elsewhere_gets_its_jobs_key_over_the_api_with_the_token(
    server: ServerProcess, tmp_path: Path
) -> None:
    secret = read_secret(server.data_dir)
    assert secret is not None
    assert (server.data_dir / SECRET_FILE).stat().st_mode & 0o777 == 0o600
    expected = job_key(secret, "job-a")
    elsewhere = {"SPARKPOINT_DATA_DIR": str(tmp_path / "not-the-server")}
    remote = {**elsewhere, "SPARKPOINT_API_URL": server.url, "SPARKPOINT_API_TOKEN": TOKEN}
    assert driver_job_key("job-a", remote) == expected
    assert driver_job_key("job-a", {"SPARKPOINT_DATA_DIR": str(server.data_dir)}) == expected
    assert driver_job_key("job-b", remote) != expected

    anonymous = httpx.post(f"{server.url}/jobs/job-a/key", timeout=10)
    assert anonymous.status_code == 401
    with pytest.raises(ConfigurationError, match="no key from the control plane's API"):
        driver_job_key("job-a", {**remote, "SPARKPOINT_API_TOKEN": "wrong-token-0123456789"})
    bad = httpx.post(
        f"{server.url}/jobs/..%2Fx/key", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert bad.status_code in (400, 404)
