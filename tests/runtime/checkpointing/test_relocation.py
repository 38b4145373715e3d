"""A checkpoint read from another directory than the one it was written to: the state files it
holds are read there, what lies elsewhere keeps its URL."""

from __future__ import annotations

from sparkpoint import protocol as p
from sparkpoint.checkpointing.relocation import relocated
from tests.support.acks import bare_ack

WRITTEN = "file:///data/savepoints/savepoint-orders-7"
NOW = "file:///backups/orders-7"
SHARED = "file:///data/chk/orders/shared/pv-0-c5-000012.sst"


def handle(path: str | None, *shared: str) -> p.StateHandleModel:
    refs = [p.SharedFileModel(path=s, size=1, checksum="sha256:00") for s in shared]
    return p.StateHandleModel(path=path, size=1, checksum="sha256:00", shared=refs)


def paths(acks: list[p.SnapshotCompleted]) -> list[tuple[str | None, list[str]]]:
    return [(h.path, [s.path for s in h.shared]) for a in acks for h in a.handles]


def test_files_of_the_directory_written_to_are_read_where_they_are_now() -> None:
    acks = [
        bare_ack(7, "events", 0),  # no state
        bare_ack(7, "pv", 0, handles=[handle(None)]),  # inline
        bare_ack(7, "pv", 1, handles=[handle(f"{WRITTEN}/pv-1-a1-t4", SHARED)]),
        bare_ack(7, "pv", 2, handles=[handle(f"{WRITTEN}/pv-2-a1-t5")]),
    ]
    here = {f"{NOW}/pv-1-a1-t4", f"{NOW}/pv-2-a1-t5"}

    moved = relocated(acks, NOW + "/", here.__contains__)

    assert paths(moved) == [
        (None, []),
        (f"{NOW}/pv-1-a1-t4", [SHARED]),  # the shared file lies outside: it stays
        (f"{NOW}/pv-2-a1-t5", []),
    ]
    assert paths(acks)[1] == (f"{WRITTEN}/pv-1-a1-t4", [SHARED])  # the input is unchanged


def test_a_checkpoint_read_where_it_was_written_or_not_copied_here_is_left_as_it_is() -> None:
    in_place = [bare_ack(7, handles=[handle(f"{NOW}/pv-0-a1-t4")])]
    assert relocated(in_place, NOW, lambda url: True) == in_place
    elsewhere = [bare_ack(7, handles=[handle(f"{WRITTEN}/pv-0-a1-t4")])]
    assert relocated(elsewhere, NOW, lambda url: False) == elsewhere


def test_a_native_snapshot_keeps_its_manifest_where_its_files_are() -> None:
    """A native RocksDB snapshot's manifest names its files by URL: moving the manifest alone
    would read it here and its files there, so it is not moved."""
    manifest = f"{WRITTEN}/pv-0-a1-t4/_manifest.json"
    acks = [bare_ack(7, handles=[handle(manifest, SHARED)])]
    assert relocated(acks, NOW, lambda url: True) == acks
