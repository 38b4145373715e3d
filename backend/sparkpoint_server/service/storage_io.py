"""The control plane's edge to checkpoint storage: every call bounded in time, confined to roots.

Storage is the one thing the control plane does not control: a remote filesystem may never
answer, a protocol may raise anything (missing credentials, a malformed URL). So:

- every storage call runs on a thread of its own and is given up after
  ``SPARKPOINT_STORAGE_TIMEOUT`` seconds (the thread is left to end on its own); whatever it
  raises becomes a :class:`~sparkpoint_server.errors.StorageUnavailableError` naming what was
  being done, and no storage call runs while the coordination lock is held. A call takes a
  thread that is idle (one that finished a call) or starts one, so no call ever waits behind
  another, and one watcher thread gives up the calls past their time: starting two threads
  per call (a worker and a timer) cost the ingest more than writing ``_metadata`` itself;
- the control plane reads and writes only under its *storage roots*: savepoint targets,
  restore paths, the state files a restored ``_metadata`` names (a native snapshot's shared
  files too, :func:`state_paths`), and the directories a job registers with. The data
  directory's ``checkpoints/`` and ``savepoints/`` always are roots
  (never the data directory itself: it holds the database and the API token); then either
  ``SPARKPOINT_STORAGE_ROOTS`` (URLs or paths separated by commas), or, when it is unset, the
  local directories each job names at registration (its checkpoint directory, the one holding
  its ``--from-checkpoint``), as roots of that job. A directory that contains the data
  directory is refused.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import os
import posixpath
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, TypeVar

from fsspec.core import split_protocol

from sparkpoint.locations import is_relative
from sparkpoint.protocol import StateHandleModel
from sparkpoint_server.errors import InvalidRequestError, StorageUnavailableError

T = TypeVar("T")
LOCAL = "file"
LOCAL_PROTOCOLS = frozenset({None, "file", "local"})


def start(what: str, timeout_s: float, fn: Callable[..., T], *args: Any) -> Future[T]:
    """Run ``fn(*args)`` on its own thread; the future fails with a
    :class:`StorageUnavailableError` naming ``what`` when ``fn`` raises anything or has not
    returned after ``timeout_s`` seconds."""
    future: Future[T] = Future()

    def settle(result: Any = None, error: BaseException | None = None) -> None:
        try:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
        except InvalidStateError:  # the other one (answer or timeout) came first
            pass

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as err:  # any protocol may raise anything: fail this call only
            failure = StorageUnavailableError(f"{what}: {type(err).__name__}: {err}")
            failure.__cause__ = err
            settle(error=failure)
        else:
            settle(result)

    def expire() -> None:
        late = f"storage did not answer within {timeout_s:g} s (SPARKPOINT_STORAGE_TIMEOUT)"
        settle(error=StorageUnavailableError(f"{what}: {late}"))

    deadline = _DEADLINES.add(timeout_s, expire)
    future.add_done_callback(lambda _: deadline.clear())
    _WORKERS.submit(run)
    return future


def call(what: str, timeout_s: float, fn: Callable[..., T], *args: Any) -> T:
    """:func:`start`, waiting for the answer (never call it under the coordination lock).

    Raises:
        StorageUnavailableError: ``fn`` raised, or did not answer within ``timeout_s``.
    """
    return start(what, timeout_s, fn, *args).result()


class _Workers:
    """Daemon threads for storage calls: a call goes to an idle thread, or to a new one when
    none is idle, so a call never waits behind another (a hung one keeps its thread). A thread
    idle for ``idle_s`` seconds ends."""

    def __init__(self, idle_s: float = 60.0) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # One permit per thread that is waiting for a call and has not been promised one.
        self._idle = threading.Semaphore(0)
        self._idle_s = idle_s

    def submit(self, call: Callable[[], None]) -> None:
        self._calls.put(call)
        if not self._idle.acquire(blocking=False):
            threading.Thread(target=self._work, name="sparkpoint-storage", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                call = self._calls.get(timeout=self._idle_s)
            except queue.Empty:
                if self._idle.acquire(blocking=False):
                    return  # idle, and no call was promised to this thread
                continue  # a call was promised: it is in the queue
            call()
            del call
            self._idle.release()


class _Deadlines:
    """One daemon thread that runs each call's ``expire`` at its deadline, unless cleared."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, delay_s: float, expire: Callable[[], None]) -> _Deadline:
        deadline = _Deadline(expire)
        with self._ready:
            at = time.monotonic() + delay_s
            heapq.heappush(self._heap, (at, next(self._order), deadline))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="sparkpoint-storage-deadlines", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is deadline:
                self._ready.notify()
        return deadline

    def _watch(self) -> None:
        while True:
            with self._ready:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._ready.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, deadline = heapq.heappop(self._heap)
            expire, deadline.expire = deadline.expire, None
            if expire is not None:
                expire()


class _Deadline:
    """A call's ``expire``; cleared when the call settled (the watcher then skips it)."""

    __slots__ = ("expire",)

    def __init__(self, expire: Callable[[], None]) -> None:
        self.expire: Callable[[], None] | None = expire

    def clear(self) -> None:
        self.expire = None


_WORKERS = _Workers()
_DEADLINES = _Deadlines()


# ----------------------------------------------------------------------------- roots


@dataclass(frozen=True)
class Location:
    """A storage URL split into its protocol and a normalised path (local: ``file``)."""

    protocol: str
    path: str

    @classmethod
    def of(cls, url: str) -> Location:
        """Raises ValueError for a URL with a NUL byte (no filesystem has such a path)."""
        if "\x00" in url:
            raise ValueError(f"{url!r} contains a NUL byte")
        protocol, path = split_protocol(url.strip())
        if protocol in LOCAL_PROTOCOLS:
            return cls(LOCAL, os.path.normpath(os.path.abspath(path)))
        assert protocol is not None
        return cls(protocol, posixpath.normpath(path.lstrip("/")).rstrip("/"))

    def under(self, root: Location) -> bool:
        if self.protocol != root.protocol:
            return False
        base = root.path.rstrip("/") or "/"
        return self.path == base or self.path.startswith(base if base == "/" else base + "/")

    def __str__(self) -> str:
        return self.path if self.protocol == LOCAL else f"{self.protocol}://{self.path}"


@dataclass(frozen=True)
class JobRoots:
    """The storage roots of one job: where its requests and restores may read and write."""

    roots: tuple[Location, ...]

    def contains(self, url: str) -> bool:
        try:
            location = Location.of(url)
        except (TypeError, ValueError):  # a NUL byte and the like: nowhere the server goes
            return False
        return any(location.under(root) for root in self.roots)

    def describe(self) -> str:
        listed = ", ".join(str(r) for r in self.roots)
        return f"the storage roots are {listed} (SPARKPOINT_STORAGE_ROOTS)"

    def check(self, field: str, url: str) -> str:
        """``url`` if it lies under a root; else a 400 naming ``field`` and the roots.

        Raises:
            InvalidRequestError: ``url`` is outside every root.
        """
        if not self.contains(url):
            raise InvalidRequestError(
                field, f"{url!r} is outside the storage roots: {self.describe()}"
            )
        return url


class StorageRoots:
    """Where the control plane may read and write (see the module docstring).

    Args:
        data_dir: the server's data directory: its ``checkpoints/`` and ``savepoints/`` are
            always roots.
        configured: ``SPARKPOINT_STORAGE_ROOTS`` split at commas; empty: the default rule,
            where the local directories a job names at registration are roots of that job.
    """

    def __init__(self, data_dir: str, configured: Iterable[str] = ()) -> None:
        self.configured = tuple(Location.of(r) for r in configured if r.strip())
        self._data = tuple(
            {Location.of(form(data_dir)) for form in (os.path.abspath, os.path.realpath)}
        )
        # Not the data directory itself: it holds the database and the API token. As given
        # and resolved (the server names its own directories by their resolved paths).
        own = {
            Location.of(form(os.path.join(data_dir, d)))
            for d in ("checkpoints", "savepoints")
            for form in (os.path.abspath, os.path.realpath)
        }
        self._global = JobRoots((*sorted(own, key=str), *self.configured))

    def _contains_data(self, directory: Location) -> bool:
        return any(data.under(directory) for data in self._data)

    def of_job(self, config: Mapping[str, Any] | None = None) -> JobRoots:
        """The roots of a job registered with ``config`` (see :func:`named_directories`)."""
        if self.configured or not config:
            return self._global
        local = [
            d
            for d in (location_of(n) for n in named_directories(config, self._contains_data))
            if d.protocol == LOCAL
        ]
        return JobRoots((*self._global.roots, *local))

    def registration_refusal(self, config: Mapping[str, Any]) -> str | None:
        """Why a job may not register with ``config`` (None: it may): its checkpoint directory
        contains the data directory, or it or the checkpoint it starts from is relative or
        outside the roots."""
        roots = self.of_job(config)
        own, start = _named(config)
        if own is not None and self._contains_data(location_of(own)):
            return (
                f"checkpoint_dir {own!r} contains the control plane's data directory "
                f"{self._data[0]} (its database and API token)"
            )
        named = (("checkpoint_dir", own), ("from_checkpoint", start))
        for name, directory in named:
            if directory is not None and is_relative(directory):
                return (
                    f"{name} {directory!r} is a relative path: the control plane would read "
                    "and write it in its own working directory, not the driver's; give an "
                    "absolute path or a URL"
                )
        for name, directory in named:
            if directory is not None and not roots.contains(directory):
                return f"{name} {directory!r} is outside the storage roots: {roots.describe()}"
        return None


def location_of(url: str) -> Location:
    """:meth:`Location.of`, or a location under no root (a NUL byte)."""
    try:
        return Location.of(url)
    except ValueError:
        return Location("", "")


def aliases(url: str) -> set[Location]:
    """Where ``url`` is, as the roots see it, and (a local path) with its links resolved; a
    checkpoint named by its ``_metadata`` is its directory.

    Raises:
        ValueError: a URL with a NUL byte.
    """
    if url.rstrip("/").endswith("/_metadata"):
        url = url.rstrip("/").removesuffix("/_metadata")
    where = Location.of(url)
    if where.protocol != LOCAL:
        return {where}
    return {where, Location(LOCAL, _resolved(where.path))}


@functools.lru_cache(maxsize=4096)
def _resolved(path: str) -> str:
    """``os.path.realpath``, once per path: callers under the coordination lock compare the
    same origins again and again, and each resolution is a system call per path component.
    A filesystem error leaves the path as it is."""
    try:
        return os.path.realpath(path)
    except OSError:
        return path


def same_place(url: str, other: str) -> bool:
    """Whether two spellings name one checkpoint: ``/_metadata`` or not, links or not."""
    try:
        return bool(aliases(url) & aliases(other))
    except ValueError:
        return False


def named_directories(
    config: Mapping[str, Any], contains_data: Callable[[Location], bool]
) -> list[str]:
    """The directories a job names at registration that may become its roots: its checkpoint
    directory, and the one holding the checkpoint it starts from (``<dir>/<job>/chk-<n>``:
    ``<dir>/<job>``, where its shared state lives too; a savepoint: its target directory), or
    that checkpoint's own directory when the one holding it contains the data directory.
    None that contains the data directory."""
    own, start = _named(config)
    named = [own] if own is not None else []
    if start is not None:
        start = start.removesuffix("/_metadata")
        holder = start.rsplit("/", 1)[0] or "/"
        named.append(start if contains_data(location_of(holder)) else holder)
    return [d for d in named if not contains_data(location_of(d))]


def _named(config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The ``checkpoint_dir`` and ``from_checkpoint`` of a registration (or None)."""
    own = str(config["checkpoint_dir"]) if config.get("checkpoint_dir") else None
    start = str(config["from_checkpoint"]).rstrip("/") if config.get("from_checkpoint") else None
    return own, start


def state_paths(handle: StateHandleModel) -> list[str]:
    """Every file a state handle names: its path (none when inline) and, for a native
    (incremental) snapshot, each file of the job's ``shared/`` directory it references."""
    own = [handle.path] if handle.path is not None else []
    return [*own, *(shared.path for shared in handle.shared)]


def parse_roots(value: str | None) -> list[str]:
    """``SPARKPOINT_STORAGE_ROOTS``: URLs or absolute paths separated by commas."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]
