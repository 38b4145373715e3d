"""What the backend contract tests share: backends of one kind made and restored as the
runtime makes them, and reading a backend's tables (the fixtures are in ``conftest.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkpoint.state import backends as backend_registry
from sparkpoint.state.backend import KeyedStateBackend
from sparkpoint.state.key_groups import KeyGroupRange

from .conftest import FULL


class BlobReader:
    """A :class:`~sparkpoint.state.backends.HandleReader` over canonical snapshots in memory:
    a handle is the position of its blob."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs
        self.handles: list[Any] = list(range(len(blobs)))

    def read_state(self, handle: Any) -> bytes:
        return self.blobs[handle]

    def fetch_native(self, handle: Any, dest_dir: str) -> None:
        raise AssertionError("the contract restores canonical snapshots only")


class Backends:
    """Creates and restores backends of one kind, each in a local directory of its own, as the
    runtime does (:mod:`sparkpoint.state.backends`); :meth:`close` closes them all."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self._root = root
        self._made: list[KeyedStateBackend] = []

    def _local_dir(self) -> str:
        return str(self._root / f"{self.name}-{len(self._made)}")

    def create(self, kg_range: KeyGroupRange = FULL) -> KeyedStateBackend:
        backend = backend_registry.create_backend(
            self.name, 128, kg_range, local_dir=self._local_dir()
        )
        self._made.append(backend)
        return backend

    def restore(self, blobs: list[bytes], kg_range: KeyGroupRange = FULL) -> KeyedStateBackend:
        reader = BlobReader(blobs)
        backend = backend_registry.restore_backend(
            self.name, reader.handles, reader, 128, kg_range, local_dir=self._local_dir()
        )
        self._made.append(backend)
        return backend

    def close(self) -> None:
        for backend in self._made:
            backend.close()


def table_of(backend: KeyedStateBackend, name: str) -> dict[Any, Any]:
    return dict(backend.table(name).items())


def write_back(backend: KeyedStateBackend) -> None:
    """Write what a backend caches to its store (``rocksdb``'s write-back cache), so that
    what follows reads values loaded back from it; nothing for a backend without a cache."""
    flush = getattr(backend, "flush", None)
    if flush is not None:
        flush()
