"""Working-state versions as a changelog: a base snapshot and the changes of each epoch since.

Flink's changelog state backend in miniature. Version *v+1* of a subtask's keyed state is
written as the entries the epoch read or wrote (:meth:`KeyedStateBackend.take_changes`), a
delta with tombstones (``<tag>.delta``), plus a chain file (``<tag>.chain``, JSON) naming the
files that rebuild the version in order: a base of every entry (``<tag>.base``) and the deltas
after it. Bases and deltas are columnar (:mod:`sparkpoint.state.changelog_delta`: nothing
sorted or hashed to write them); chains of earlier versions, canonical snapshots, still read.
The cost of an epoch without a checkpoint is thus proportional to the keys it touched, not to
the state. When the deltas of a chain outweigh its base (or there are more than
:data:`MAX_DELTAS`), the next version writes a new base.

Every file goes to the subtask's local directory and, on clusters, through
:meth:`VersionStore.write_durable` to the checkpoint storage: the chain records the durable
URL of each file, so another executor rebuilds the version from the durable copies.

A Python worker keeps the backend it saved (:data:`_LIVE`, per local directory and tag): the
next epoch of the same subtask in the same worker continues on it without reading a byte. A
backend is only reused at the exact tag it saved; a retry of a failed epoch asks for the
previous tag and gets it rebuilt from the files. Spark hands a subtask's next task to any idle
Python worker, so a worker often kept the subtask at an earlier version of the same chain:
with ``catch_up`` (the ``hashmap`` backend), it reads only the deltas written since (the
epochs that other workers ran), not the base and every delta again.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, NamedTuple

from sparkpoint.checkpointing.file_ops import write_local_atomically
from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state import canonical, changelog_delta
from sparkpoint.state.backend import (
    DELETED,
    KeyedStateBackend,
)
from sparkpoint.state.restoring import SnapshotMerge, check_max_parallelism, register
from sparkpoint.state.snapshot_contracts import (
    SavedVersion,
    VersionStore,
)

MAX_DELTAS = 32


class _Live(NamedTuple):
    """The backend this worker saved last for a subtask: its tag and its chain's files."""

    tag: str
    backend: KeyedStateBackend
    files: tuple[str, ...]


# local directory -> the backend this worker saved last for that subtask.
_LIVE: dict[str, _Live] = {}


def _write_local(directory: str, name: str, data: bytes) -> None:
    write_local_atomically(os.path.join(directory, name), data)


def _read_local(directory: str, name: str) -> bytes | None:
    try:
        with open(os.path.join(directory, name), "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _chain(store: VersionStore, tag: str, durable_url: str | None) -> dict[str, Any] | None:
    """The chain of version ``tag``: the local file, else the durable one."""
    data = _read_local(store.local_dir, f"{tag}.chain")
    if data is None and durable_url is not None:
        data = store.read_durable(durable_url)
    if data is None:
        return None
    try:
        chain = json.loads(data)
        if not isinstance(chain["files"], list) or chain["tag"] != tag:  # not an assert: -O
            raise ValueError(f"not the chain of version {tag}")
    except Exception as err:
        raise CorruptSnapshotError(
            f"working-state chain {tag} of {store.local_dir} is damaged: {err!r}"
        ) from err
    return chain


def save(backend: KeyedStateBackend, store: VersionStore, tag: str, previous: str | None) -> Any:
    """Write version ``tag`` of ``backend``: a delta after ``previous``'s chain, or a base.

    Steps: (1) take the epoch's changes, (2) a delta when the previous chain is here and
    still light, else a full base, (3) the chain, (4) keep the backend for the next epoch.
    """
    # Step 1
    changes = backend.take_changes()
    common: dict[str, Any] = {
        "max_parallelism": backend.max_parallelism,
        "key_group_range": backend.key_group_range,
        "watermarks": backend.channel_watermarks,
    }
    # Step 2
    chain = _chain(store, previous, store.durable_url) if previous is not None else None
    light = (
        chain is not None
        and len(chain["files"]) <= MAX_DELTAS
        and chain["delta_bytes"] <= chain["base_bytes"]
        # a durable store whose previous version has no durable chain (a copy could not be
        # written) starts again from a base: the next chain must not name a file without one
        and not (store.durable and store.durable_url is None)
    )
    if chain is not None and light:
        blob = changelog_delta.encode_delta(changes.states, changes.changes, **common)
        name = f"{tag}.delta"
        chain = dict(chain, delta_bytes=chain["delta_bytes"] + len(blob))
        files = list(chain["files"])
    else:
        tables = changelog_delta.tables_of(backend.entries())
        blob = changelog_delta.encode_delta(backend.state_infos, tables, **common, full=True)
        name = f"{tag}.base"
        chain = {"base_bytes": len(blob), "delta_bytes": 0}
        files = []
    _write_local(store.local_dir, name, blob)
    files.append({"name": name, "durable": store.write_durable(name, blob)})
    # Step 3
    chain_blob = json.dumps(dict(chain, tag=tag, files=files)).encode()
    _write_local(store.local_dir, f"{tag}.chain", chain_blob)
    # Durable only when every file of the chain is: else no other executor can rebuild it.
    whole = all(f["durable"] for f in files)
    durable = store.write_durable(f"{tag}.chain", chain_blob) if whole else None
    # Step 4
    _LIVE[store.local_dir] = _Live(tag, backend, tuple(f["name"] for f in files))
    needed = tuple(f["durable"] for f in files if f["durable"]) + ((durable,) if durable else ())
    return SavedVersion(len(blob) + len(chain_blob), durable, needed)


def open_version(
    backend: KeyedStateBackend, store: VersionStore, tag: str, *, catch_up: bool = False
) -> KeyedStateBackend | None:
    """Version ``tag``: this worker's live backend when it is at ``tag``; with ``catch_up``,
    the live backend brought to ``tag`` when its version's files begin ``tag``'s chain (only
    the later files are read); else ``backend`` (empty) rebuilt from the chain's files. None
    when neither this executor nor the durable copy has the chain.

    Raises:
        CorruptSnapshotError: a chain file is missing or damaged.
    """
    live = _LIVE.pop(store.local_dir, None)
    if live is not None and (
        live.backend.max_parallelism != backend.max_parallelism
        or live.backend.key_group_range != backend.key_group_range
    ):
        live.backend.close()
        live = None
    if live is not None and live.tag == tag:
        return live.backend
    chain = _chain(store, tag, store.durable_url)
    if live is not None and not (catch_up and chain is not None and _extends(chain, live.files)):
        live.backend.close()
        live = None
    if chain is None:
        return None
    target, start = (backend, 0) if live is None else (live.backend, len(live.files))
    _load(target, store, tag, chain["files"], start)
    target.take_changes()  # what was loaded is not a change of the next epoch
    return target


def _extends(chain: dict[str, Any], files: tuple[str, ...]) -> bool:
    """Whether ``chain`` is ``files`` followed by at least one more file."""
    names = tuple(entry["name"] for entry in chain["files"])
    return len(names) > len(files) and names[: len(files)] == files


def _load(
    backend: KeyedStateBackend, store: VersionStore, tag: str, files: list[Any], start: int
) -> None:
    """Apply the chain files ``files[start:]`` of version ``tag`` to ``backend``."""
    merge = SnapshotMerge(backend)
    for index, entry in enumerate(files[start:], start):
        data = _read_local(store.local_dir, entry["name"])
        if data is None and entry.get("durable"):
            data = store.read_durable(entry["durable"])
        if data is None:
            raise CorruptSnapshotError(
                f"working-state file {entry['name']} of version {tag} is neither in "
                f"{store.local_dir} nor stored durably"
            )
        where = os.path.join(store.local_dir, entry["name"])
        snap: Any
        if changelog_delta.is_delta(data):
            snap = changelog_delta.decode_delta(data, where)
        else:  # a chain of an earlier version: canonical snapshots
            snap = canonical.decode_snapshot(data, where)
            if index == 0:
                merge.add(snap, entry["name"])
                merge.finish()
                continue
        check_max_parallelism(snap.max_parallelism, backend.max_parallelism, entry["name"])
        for info in snap.states.values():
            register(backend, info, entry["name"])
        if isinstance(snap, changelog_delta.Delta):
            snap.load_into(backend)
        else:
            backend.load(snap.entries(backend.key_group_range))
        backend.channel_watermarks = dict(snap.watermarks)


def prune(store: VersionStore, keep: set[str]) -> None:
    """Delete local files that the chains of ``keep`` do not name."""
    names = {f"{tag}.chain" for tag in keep}
    for tag in keep:
        chain = _chain(store, tag, None)
        if chain is not None:
            names |= {entry["name"] for entry in chain["files"]}
    try:
        present = os.listdir(store.local_dir)
    except FileNotFoundError:
        return
    for name in present:
        if name not in names and not os.path.isdir(os.path.join(store.local_dir, name)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(store.local_dir, name))


__all__ = ["DELETED", "MAX_DELTAS", "open_version", "prune", "save"]
