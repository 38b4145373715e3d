"""A model of shared files' lifetime: after any sequence of completions, aborts, retention
and restarts, every file a checkpoint references exists and no shared file outlives them."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparkpoint.checkpointing.shared_state import split_shared_name
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.protocol import StateHandleModel

from .shared_state_support import FMT, JOB, complete, fs_path, shared_names

# ----------------------------------------------------------------------------- model


@dataclass
class _Model:
    """What the checkpoints of one job reference, as the authority sees them."""

    completed: dict[int, StateHandleModel] = field(default_factory=dict)
    in_flight: tuple[int, StateHandleModel] | None = None
    uploading: bytes | None = None  # the in-flight manifest, not written yet
    next_id: int = 1
    uploads: int = 0


_OPS = st.one_of(
    st.tuples(st.just("complete"), st.integers(0, 3), st.integers(0, 31)),
    st.tuples(st.just("start"), st.integers(0, 3), st.integers(0, 31)),
    st.tuples(st.just("abort"), st.integers(0, 3), st.integers(0, 31)),
    st.tuples(st.just("discard_oldest"), st.just(0), st.just(0)),
    st.tuples(st.just("sweep"), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.just(0), st.just(0)),
)


@settings(max_examples=150, deadline=None)
# Pinned: uploads of a checkpoint whose manifest is not written yet survive a sweep (the
# uploader-id rule); a reused file survives the discard of its uploader; an aborted
# checkpoint's upload goes once a later one completed and one is discarded.
@example(ops=[("start", 1, 16), ("sweep", 0, 0)], retained=1)
@example(ops=[("complete", 2, 0), ("complete", 1, 1), ("discard_oldest", 0, 0)], retained=3)
@example(ops=[("abort", 1, 0), ("complete", 1, 0), ("complete", 0, 0)], retained=1)
@given(ops=st.lists(_OPS, max_size=14), retained=st.integers(1, 3))
def test_shared_files_live_exactly_as_long_as_a_checkpoint_needs_them(
    ops: list[tuple[str, int, int]], retained: int
) -> None:
    root = f"/sparkpoint-model-{uuid.uuid4().hex}"
    local = tempfile.mkdtemp()
    storage = FileSystemCheckpointStorage(f"memory://{root}")
    model = _Model()
    try:
        for op, new, mask in ops:
            swept = _apply(storage, model, op, new, mask, retained, local)
            if op == "restart":
                storage = FileSystemCheckpointStorage(f"memory://{root}")
                storage.cleanup_incomplete(JOB)
                model.in_flight, model.uploading = None, None
            _check(storage, model, swept=swept or op == "restart")
    finally:
        shutil.rmtree(local)
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)


def _apply(
    storage: FileSystemCheckpointStorage,
    model: _Model,
    op: str,
    new: int,
    mask: int,
    retained: int,
    local: str,
) -> bool:
    """Apply one operation to storage and model; whether a discard (a sweep) ran."""
    if op == "discard_oldest":
        if not model.completed:
            return False
        oldest = min(model.completed)
        del model.completed[oldest]
        storage.discard(JOB, oldest)
        return True
    if op == "restart":
        return False  # the caller swaps the storage object
    if op == "sweep":  # another host's discard or restart, while a checkpoint is in flight
        storage.sweep_shared(JOB)
        return True
    if model.in_flight is None:  # one checkpoint in flight at a time (max concurrent 1)
        model.in_flight = (model.next_id, _upload(storage, model, new, mask, local))
        model.next_id += 1
        if mask & 16:  # still uploading: its files are there, its manifest is not yet
            manifest = fs_path(storage, model.in_flight[1].path or "")
            model.uploading = storage.fs.cat_file(manifest)
            storage.fs.rm(manifest)
    if op == "start":
        return False
    cid, handle = model.in_flight
    model.in_flight = None
    if model.uploading is not None:
        storage.fs.pipe_file(fs_path(storage, handle.path or ""), model.uploading)
        model.uploading = None
    if op == "abort":
        storage.discard(JOB, cid)
        return True
    complete(storage, cid, handle)
    model.completed[cid] = handle
    swept = False
    while len(model.completed) > retained:  # the authority discards subsumed ones
        oldest = min(model.completed)
        del model.completed[oldest]
        storage.discard(JOB, oldest)
        swept = True
    return swept


def _upload(
    storage: FileSystemCheckpointStorage, model: _Model, new: int, mask: int, local: str
) -> StateHandleModel:
    """The shared files of a new checkpoint: ``new`` uploads, and of the latest completed
    checkpoint's files those that ``mask`` picks."""
    base = model.completed[max(model.completed)].shared if model.completed else []
    reused = [ref for i, ref in enumerate(base) if mask >> (i % 4) & 1]
    shared = {}
    for _ in range(new):
        model.uploads += 1
        path = os.path.join(local, f"f{model.uploads}")
        Path(path).write_bytes(b"z" * model.uploads)
        shared[f"{model.uploads:06d}.sst"] = path
    private = {"CURRENT": os.path.join(local, "CURRENT")}
    Path(private["CURRENT"]).write_bytes(f"current {model.next_id}".encode())
    return storage.write_native(
        JOB, model.next_id, "pv-0", private, shared, reused, key_group_range=None, fmt=FMT
    )


def _check(storage: FileSystemCheckpointStorage, model: _Model, *, swept: bool) -> None:
    on_disk = {f"{storage.shared_path(JOB)}/{n}" for n in shared_names(storage)}
    needed = {r.path for h in model.completed.values() for r in h.shared}
    in_flight = {r.path for r in model.in_flight[1].shared} if model.in_flight else set()
    assert needed | in_flight <= on_disk, "a file that a checkpoint references is gone"
    for cid in model.completed:
        storage.verify_checkpoint(JOB, cid)
    if not swept:
        return
    latest = max(model.completed, default=0)
    for url in on_disk - needed - in_flight:
        uploader = split_shared_name(url.rsplit("/", 1)[1])
        assert uploader is not None and uploader[0] > latest, f"{url} outlived every checkpoint"
