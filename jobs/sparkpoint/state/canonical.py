"""The canonical snapshot format of keyed state, which every state backend writes and restores.

Flink's canonical savepoint format: savepoints, full checkpoints and (with tombstones) the
changelogs of an epoch are written in this one layout, so state written by the ``hashmap``
backend restores into ``rocksdb`` and back, with any parallelism of the same max parallelism.
Handles of it record the format as :data:`FORMAT_ID`.

**Layout, version 1.** All integers of the fixed prefix are little endian.

- bytes 0-3: the magic ``b"SPKV"``;
- byte 4: the format version, ``1``;
- bytes 5-8: ``H``, the length of the header (uint32);
- bytes 9-12: the CRC-32 (zlib) of the header's bytes (uint32);
- bytes 13 to 13 + H: the header, one msgpack map (below);
- the rest, ``B`` bytes: the body, one block per non-empty key group in increasing key group
  order, each directly after the previous one.

The header is a msgpack map with str keys:

- ``format``: ``"sparkpoint-keyed-state"``; ``version``: ``1`` (the version byte again);
- ``backend``: the name of the backend that wrote it (informative only);
- ``changelog``: ``true`` when the snapshot is an epoch's changes, whose entries may be
  tombstones; ``false`` for a full snapshot;
- ``max_parallelism``: the number of key groups; ``key_group_range``: ``[start, end]``,
  both inclusive, the key groups the writing subtask owned;
- ``states``: an array of maps ``{name, kind, serializer, entries, bytes}``, sorted by name,
  where ``kind`` is ``"value"``, ``"list"`` or ``"map"``, ``serializer`` a name of
  :mod:`sparkpoint.state.serializers`, ``entries`` the number of entries of the state and
  ``bytes`` the sum of their key and value lengths. A state's *index* is its position here;
- ``watermarks``: an array of ``[channel, watermark]`` pairs sorted by channel (the latest
  watermark of every input channel: operator state of event time);
- ``key_groups``: an array of ``[key_group, offset, length, count]``, sorted by key group,
  one per non-empty key group: its block starts ``offset`` bytes into the body, is ``length``
  bytes long and holds ``count`` entries. The blocks tile the body exactly;
- ``body_size``: ``B``; ``body_crc32``: the CRC-32 (zlib) of the body.

A block is one msgpack array of ``count`` entries, each an array ``[state_index, key,
value]``: ``key`` is a bin, the key's :func:`~sparkpoint.state.serializers.encode_key` bytes;
``value`` a bin, :func:`~sparkpoint.state.serializers.encode_value` of the entry's value by the
state's kind and serializer, or nil for a tombstone (a deleted entry; only in changelogs).
Entries are sorted by ``(state_index, key)`` (bytes compared as unsigned) and no pair
occurs twice, so equal state encodes to equal bytes.

Decoding checks the magic, the version, both checksums and the structure before anything
is returned; every problem raises :class:`~sparkpoint.errors.CorruptSnapshotError` naming
where the bytes came from. Values of the ``pickle`` serializer are unpickled when entries are
decoded: read snapshots only from storage you trust.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgpack

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state import canonical_codec
from sparkpoint.state.backend import StateInfo
from sparkpoint.state.canonical_codec import EntryColumns
from sparkpoint.state.canonical_read import (
    _KINDS,
    _PREFIX,
    FORMAT_ID,
    FORMAT_NAME,
    FORMAT_VERSION,
    MAGIC,
    CanonicalSnapshot,
    decode_snapshot,
    is_canonical,
)
from sparkpoint.state.key_groups import (
    KeyGroupRange,
    check_max_parallelism,
)
from sparkpoint.state.serializers import (
    TypeSerializer,
    serializer_named,
)

__all__ = [
    "FORMAT_ID",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAGIC",
    "CanonicalSnapshot",
    "decode_snapshot",
    "encode_snapshot",
    "encode_snapshot_raw",
    "is_canonical",
]


# ----------------------------------------------------------------------------- encoding


def encode_snapshot(
    states: Mapping[str, StateInfo],
    entries: Iterable[tuple[int, str, Any, Any]],
    *,
    max_parallelism: int,
    key_group_range: KeyGroupRange,
    watermarks: Mapping[int, int],
    backend: str,
    changelog: bool = False,
) -> bytes:
    """A canonical snapshot of ``entries``.

    Args:
        states: every registered state, by name (states without entries are kept too).
        entries: ``(key group, state name, key, value)`` in any order; a value of
            :data:`~sparkpoint.state.backend.DELETED` is a tombstone (changelogs only).
            An :class:`EntryColumns` (a backend's dicts) is encoded a column at a time.
        max_parallelism: the number of key groups.
        key_group_range: the key groups the writing subtask owns.
        watermarks: the latest watermark of every input channel.
        backend: the name of the writing backend (recorded, informative).
        changelog: whether this is an epoch's changes rather than a full snapshot.

    Raises:
        KeyGroupOutOfRangeError: an entry's key group is outside ``key_group_range``.
        ConfigurationError: an entry of an unknown state, a tombstone outside a changelog,
            a value its serializer cannot write, a duplicate key, or invalid arguments.
    """
    codecs = _codecs(states)
    _check_range(max_parallelism, key_group_range)
    names = sorted(states)

    def reference(some: Iterable[Any]) -> canonical_codec.Body:
        raw = canonical_codec.encoded_entries(codecs, states, some)
        return canonical_codec.reference_body(
            states, names, raw, key_group_range, max_parallelism, changelog
        )

    listed = (
        entries
        if isinstance(entries, EntryColumns)
        else canonical_codec.listed_entries(entries, reference)
    )
    start, end = key_group_range.start, key_group_range.end
    body = canonical_codec.encode_body(
        codecs, names, listed, start, end, changelog=changelog, encoded=False
    )
    if body is None:  # entries the column-wise path does not take: entry by entry
        body = reference(listed)
    return _assemble(
        states, names, body, key_group_range, max_parallelism, watermarks, backend, changelog
    )


def encode_snapshot_raw(
    states: Mapping[str, StateInfo],
    raw_entries: Iterable[tuple[int, str, bytes, bytes | None]],
    *,
    max_parallelism: int,
    key_group_range: KeyGroupRange,
    watermarks: Mapping[int, int],
    backend: str,
    changelog: bool = False,
) -> bytes:
    """Like :func:`encode_snapshot`, from keys and values already encoded (a RocksDB export).

    ``raw_entries`` are ``(key group, state name, encode_key bytes, encode_value bytes)``;
    a value of None is a tombstone (changelogs only).

    Raises:
        KeyGroupOutOfRangeError, ConfigurationError: as :func:`encode_snapshot`.
    """
    # Step 1: check the arguments and number the states by name.
    _check_range(max_parallelism, key_group_range)
    codecs = _codecs(states)
    names = sorted(states)

    # Step 2: the blocks, column-wise, else (an unusual entry, or an error) entry by entry.
    def reference(some: list[Any]) -> canonical_codec.Body:
        return canonical_codec.reference_body(
            states, names, some, key_group_range, max_parallelism, changelog
        )

    listed = canonical_codec.listed_entries(raw_entries, reference)
    start, end = key_group_range.start, key_group_range.end
    body = canonical_codec.encode_body(
        codecs, names, listed, start, end, changelog=changelog, encoded=True
    )
    if body is None:
        body = reference(listed)
    # Step 3: the header, then the prefix.
    return _assemble(
        states, names, body, key_group_range, max_parallelism, watermarks, backend, changelog
    )


def _check_range(max_parallelism: int, key_group_range: KeyGroupRange) -> None:
    check_max_parallelism(max_parallelism)
    if key_group_range.end >= max_parallelism:
        raise ConfigurationError(
            f"key group range {key_group_range} does not fit in max_parallelism "
            f"{max_parallelism} (key groups 0 to {max_parallelism - 1})"
        )


def _assemble(
    states: Mapping[str, StateInfo],
    names: list[str],
    body_parts: canonical_codec.Body,
    key_group_range: KeyGroupRange,
    max_parallelism: int,
    watermarks: Mapping[int, int],
    backend: str,
    changelog: bool,
) -> bytes:
    """The snapshot: prefix, header and body."""
    blocks, table, counts, sizes = body_parts
    body = b"".join(blocks)
    header_map = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "backend": str(backend),
        "changelog": bool(changelog),
        "max_parallelism": max_parallelism,
        "key_group_range": [key_group_range.start, key_group_range.end],
        "states": [
            {
                "name": name,
                "kind": states[name].kind,
                "serializer": states[name].serializer,
                "entries": counts[i],
                "bytes": sizes[i],
            }
            for i, name in enumerate(names)
        ],
        "watermarks": [[int(c), int(w)] for c, w in sorted(watermarks.items())],
        "key_groups": table,
        "body_size": len(body),
        "body_crc32": zlib.crc32(body),
    }
    try:
        header = msgpack.packb(header_map, use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as err:
        raise ConfigurationError(f"snapshot header cannot be encoded: {err}") from err
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header), zlib.crc32(header))
    return prefix + header + body


def _codecs(states: Mapping[str, StateInfo]) -> dict[str, tuple[str, TypeSerializer]]:
    """State name -> (kind, serializer), refusing a state that does not describe itself."""
    codecs: dict[str, tuple[str, TypeSerializer]] = {}
    for name, info in states.items():
        if not isinstance(info, StateInfo) or info.name != name:
            raise ConfigurationError(f"state {name!r} must map to its StateInfo, got {info!r}")
        if info.kind not in _KINDS:
            raise ConfigurationError(f"state {name!r} has unknown kind {info.kind!r}")
        try:
            codecs[name] = (info.kind, serializer_named(info.serializer, f"state {name!r}"))
        except CorruptSnapshotError as err:
            raise ConfigurationError(str(err)) from None
    return codecs
