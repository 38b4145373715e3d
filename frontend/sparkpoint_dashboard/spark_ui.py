"""Which Spark jobs ran a checkpoint's epoch: a tiny client of Spark's own monitoring REST API.

Each epoch runs as one Spark job group (``sparkpoint-<job>-a<attempt>-e<epoch>``); the checkpoint
page links to the Spark UI pages of that group's jobs. The Spark UI lives in the job's driver, so
it is gone once a job finished, and it may not be reachable from where the dashboard runs: every
call has a short timeout, and answers (and failures) are cached for a few seconds so that a page
refreshing every 2 s neither waits on nor hammers the driver. The jobs of a group that has
finished never change, so they are kept (for the most recent ``GROUPS_KEPT`` groups).

A job reports its Spark UI's address itself, so the dashboard's server asks only hosts on an
allow-list (loopback, plus ``SPARKPOINT_DASHBOARD_SPARK_UI_HOSTS``) and never follows a
redirect: a job cannot make it fetch anything else (server-side request forgery).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

SPARK_UI_TIMEOUT_S = 1.0
CACHE_TTL_S = 5.0  # how long a list of Spark jobs is reused
UNREACHABLE_TTL_S = 30.0  # how long an unreachable Spark UI is not asked again
GROUPS_KEPT = 512
FINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED"})


@dataclass(frozen=True)
class SparkJob:
    """One Spark job as the Spark UI lists it (``JobData``)."""

    job_id: int
    status: str  # RUNNING, SUCCEEDED, FAILED, UNKNOWN


def jobs_api_url(ui_url: str, application_id: str) -> str:
    """The monitoring API's list of an application's Spark jobs."""
    return f"{ui_url.rstrip('/')}/api/v1/applications/{quote(application_id, safe='')}/jobs"


def job_page_url(ui_url: str, spark_job_id: int) -> str:
    """The Spark UI's page of one Spark job."""
    return f"{ui_url.rstrip('/')}/jobs/job/?id={int(spark_job_id)}"


def jobs_of_group(jobs: list[dict[str, Any]], group: str) -> list[SparkJob]:
    """The Spark jobs of job group ``group`` in a ``JobData`` list, oldest (lowest id) first."""
    found = [
        SparkJob(int(j["jobId"]), str(j.get("status") or "UNKNOWN"))
        for j in jobs
        if j.get("jobGroup") == group and isinstance(j.get("jobId"), int)
    ]
    return sorted(found, key=lambda j: j.job_id)


def settled(jobs: list[SparkJob] | None) -> bool:
    """Whether a group's Spark jobs will not change any more: all finished, or none left in
    the UI. Not when the UI did not answer or a job still runs."""
    return jobs is not None and all(j.status in FINAL_STATUSES for j in jobs)


def spark_ui_host(ui_url: str) -> str | None:
    """The host of a Spark UI address, in lower case; None unless it is a plain
    ``http(s)://host[:port][/path]`` URL: credentials, backslashes and control characters,
    which parsers and browsers read differently, are refused."""
    if "@" in ui_url or "\\" in ui_url or any(c.isspace() or ord(c) < 32 for c in ui_url):
        return None
    try:
        url = httpx.URL(ui_url)
    except httpx.InvalidURL:
        return None
    if url.scheme not in ("http", "https") or not url.host:
        return None
    return url.host.lower()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_spark_ui(ui_url: str, hosts: Iterable[str] = ()) -> bool:
    """Whether the dashboard may fetch from the Spark UI at ``ui_url``: an http(s) URL of a
    loopback host or of one of ``hosts`` (names or IP addresses, compared as written)."""
    host = spark_ui_host(ui_url)
    return host is not None and (_is_loopback(host) or host in _normalized(hosts))


def _normalized(hosts: Iterable[str]) -> frozenset[str]:
    return frozenset(h.strip().strip("[]").lower() for h in hosts if h.strip())


def _get_json(url: str, timeout_s: float) -> Any:
    response = httpx.get(url, timeout=timeout_s, follow_redirects=False)
    response.raise_for_status()  # a redirect too: it is never followed
    return response.json()


class SparkUi:
    """The Spark jobs of a job group, from the Spark UI of the job's driver (thread-safe).

    Args:
        allowed_hosts: the hosts besides loopback that may be asked (:func:`allowed_spark_ui`).
        timeout_s: the timeout of one call to the Spark UI.
        ttl_s: how long an answer is reused.
        unreachable_ttl_s: how long a Spark UI that did not answer is not asked again.
        get_json: ``(url, timeout_s) -> decoded JSON``, raising on any failure (tests pass a fake).
        clock: a monotonic clock in seconds.
    """

    def __init__(
        self,
        allowed_hosts: Iterable[str] = (),
        timeout_s: float = SPARK_UI_TIMEOUT_S,
        ttl_s: float = CACHE_TTL_S,
        unreachable_ttl_s: float = UNREACHABLE_TTL_S,
        get_json: Callable[[str, float], Any] = _get_json,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.allowed_hosts = _normalized(allowed_hosts)
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.unreachable_ttl_s = unreachable_ttl_s
        self._get_json = get_json
        self._clock = clock
        self._lock = threading.Lock()
        # (ui url, application id) -> (valid until, the JobData list or None when unreachable)
        self._cache: dict[tuple[str, str], tuple[float, list[dict[str, Any]] | None]] = {}
        # (ui url, application id, group) -> its Spark jobs, once all of them have finished
        self._finished: OrderedDict[tuple[str, str, str], list[SparkJob]] = OrderedDict()

    def allows(self, ui_url: str) -> bool:
        """Whether the Spark UI at ``ui_url`` may be asked (:func:`allowed_spark_ui`)."""
        return allowed_spark_ui(ui_url, self.allowed_hosts)

    def group_jobs(self, ui_url: str, application_id: str, group: str) -> list[SparkJob] | None:
        """The Spark jobs of ``group`` (``[]`` when the UI no longer lists any: it keeps only
        the most recent jobs), or None when the Spark UI cannot be reached or may not be
        asked."""
        if not self.allows(ui_url):
            return None
        key = (ui_url, application_id, group)
        with self._lock:
            if key in self._finished:
                self._finished.move_to_end(key)
                return self._finished[key]
        jobs = self._jobs(ui_url, application_id)
        if jobs is None:
            return None
        found = jobs_of_group(jobs, group)
        if found and all(j.status in FINAL_STATUSES for j in found):
            with self._lock:
                self._finished[key] = found
                while len(self._finished) > GROUPS_KEPT:
                    self._finished.popitem(last=False)
        return found

    def _jobs(self, ui_url: str, application_id: str) -> list[dict[str, Any]] | None:
        key = (ui_url, application_id)
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        jobs: list[dict[str, Any]] | None = None
        try:
            answer = self._get_json(jobs_api_url(ui_url, application_id), self.timeout_s)
            if isinstance(answer, list):
                jobs = [j for j in answer if isinstance(j, dict)]
            ttl = self.ttl_s if jobs is not None else self.unreachable_ttl_s
        except httpx.ReadTimeout:  # a busy driver: ask again soon
            ttl = self.ttl_s
        except (httpx.HTTPError, ValueError, OSError):  # gone: not again for a while
            ttl = self.unreachable_ttl_s
        with self._lock:
            self._cache[key] = (self._clock() + ttl, jobs)
            if len(self._cache) > 64:  # drop the stale entries of jobs long gone
                stale = [k for k, (until, _) in self._cache.items() if until <= now]
                for k in stale:
                    del self._cache[k]
        return jobs
