"""Reading the canonical snapshot format of keyed state: its constants, the checked
:class:`CanonicalSnapshot` and :func:`decode_snapshot` (the layout is documented in
:mod:`sparkpoint.state.canonical`, which writes it and re-exports what is here)."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import msgpack

from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state import canonical_codec
from sparkpoint.state.backend import DELETED, StateInfo
from sparkpoint.state.canonical_codec import RawEntry
from sparkpoint.state.key_groups import (
    KeyGroupRange,
)
from sparkpoint.state.serializers import (
    TypeSerializer,
    decode_key,
    decode_value,
    serializer_named,
)

FORMAT_NAME = "sparkpoint-keyed-state"
FORMAT_VERSION = 1
#: The ``fmt`` recorded in the state handles of this format.
FORMAT_ID = f"{FORMAT_NAME}-v{FORMAT_VERSION}"
MAGIC = b"SPKV"

_PREFIX = struct.Struct("<4sBII")  # magic, version, header length, header CRC-32
_KINDS = ("value", "list", "map")


def is_canonical(blob: bytes | bytearray | memoryview) -> bool:
    """Whether ``blob`` starts with the magic of this format (nothing else is checked)."""
    return bytes(blob[: len(MAGIC)]) == MAGIC


# ----------------------------------------------------------------------------- decoding


@dataclass
class CanonicalSnapshot:
    """A checked snapshot (from :func:`decode_snapshot`); entries decode when asked for."""

    max_parallelism: int
    key_group_range: KeyGroupRange
    states: dict[str, StateInfo]
    watermarks: dict[int, int]
    backend: str
    changelog: bool
    entry_count: int
    size: int
    where: str = field(default="a canonical snapshot", repr=False)
    _body: memoryview = field(default_factory=lambda: memoryview(b""), repr=False)
    _blocks: list[tuple[int, int, int, int]] = field(default_factory=list, repr=False)
    _state_sizes: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    def key_groups(self) -> list[int]:
        """The key groups that have entries, in increasing order."""
        return [block[0] for block in self._blocks]

    def state_sizes(self) -> dict[str, tuple[int, int]]:
        """State name -> (number of entries, bytes of their keys and values)."""
        return dict(self._state_sizes)

    def raw_entries(self, key_group_range: KeyGroupRange | None = None) -> Iterator[RawEntry]:
        """The entries of the key groups in ``key_group_range`` (all when None), undecoded.

        Yields ``(key group, state name, key bytes, value bytes)``, a value of None being a
        tombstone, by key group then state then key. Blocks of other key groups are not read.

        Raises:
            CorruptSnapshotError: a block whose structure is wrong (naming ``where``).
        """
        names = list(self.states)
        for key_group, offset, length, count in self._blocks:
            if key_group_range is not None and key_group not in key_group_range:
                continue
            columns = canonical_codec.block_columns(
                self._body[offset : offset + length], count, len(names), self.changelog
            )
            if columns is None:  # the reference reading names what is wrong
                yield from self._block(names, key_group, offset, length, count)
                continue
            sis, keys, values = columns
            yield from zip(repeat(key_group), map(names.__getitem__, sis), keys, values)

    def entries(
        self, key_group_range: KeyGroupRange | None = None
    ) -> Iterator[tuple[int, str, Any, Any]]:
        """Like :meth:`raw_entries`, decoded: ``(key group, state name, key, value)``, a
        tombstone's value being :data:`~sparkpoint.state.backend.DELETED`.

        Raises:
            CorruptSnapshotError: an entry that does not decode (naming ``where``, the key
                group and the state).
        """
        codecs = {
            name: (info.kind, serializer_named(info.serializer, self.where))
            for name, info in self.states.items()
        }
        by_index = [(name, *codec) for name, codec in codecs.items()]
        names = list(self.states)
        for key_group, offset, length, count in self._blocks:
            if key_group_range is not None and key_group not in key_group_range:
                continue
            columns = canonical_codec.block_columns(
                self._body[offset : offset + length], count, len(names), self.changelog
            )
            runs = None if columns is None else canonical_codec.decode_columns(*columns, by_index)
            if runs is None:  # the reference decoding names what is wrong
                block = self._block(names, key_group, offset, length, count)
                yield from self._decoded(codecs, block)
                continue
            for name, keys, values in runs:
                yield from zip(repeat(key_group), repeat(name), keys, values)

    def _decoded(
        self, codecs: Mapping[str, tuple[str, TypeSerializer]], raw: Iterable[RawEntry]
    ) -> Iterator[tuple[int, str, Any, Any]]:
        """The reference decoding of raw entries, one by one, naming the first that fails."""
        for key_group, name, key_bytes, value_bytes in raw:
            kind, serializer = codecs[name]
            try:
                key = decode_key(key_bytes)
                value = (
                    DELETED if value_bytes is None else decode_value(kind, serializer, value_bytes)
                )
            except CorruptSnapshotError as err:
                raise CorruptSnapshotError(
                    f"{self.where}: an entry of keyed state {name!r} in key group {key_group} "
                    f"does not decode: {err}"
                ) from err
            yield key_group, name, key, value

    def _block(
        self, names: list[str], key_group: int, offset: int, length: int, count: int
    ) -> Iterator[RawEntry]:
        def corrupt(problem: str) -> CorruptSnapshotError:
            return CorruptSnapshotError(f"{self.where}: key group {key_group}: {problem}")

        try:
            items = msgpack.unpackb(self._body[offset : offset + length], raw=False)
        except Exception as err:  # a damaged msgpack block can raise several kinds
            raise corrupt(f"block does not decode: {err!r}") from err
        if not isinstance(items, list) or len(items) != count:
            size = len(items) if isinstance(items, list) else type(items).__name__
            raise corrupt(f"block holds {size} entries, the header says {count}")
        previous: tuple[int, bytes] | None = None
        for item in items:
            match item:
                case [int(state_index), bytes(key), bytes() | None as value] if type(
                    state_index
                ) is int and 0 <= state_index < len(names):
                    pass
                case _:
                    raise corrupt(f"malformed entry {item!r:.80}")
            if previous is not None and (state_index, key) <= previous:
                raise corrupt("entries are out of order or repeated")
            previous = (state_index, key)
            if value is None and not self.changelog:
                raise corrupt(f"a tombstone of state {names[state_index]!r} in a full snapshot")
            yield key_group, names[state_index], key, value


def decode_snapshot(blob: bytes | bytearray | memoryview, where: str) -> CanonicalSnapshot:
    """Check a canonical snapshot's prefix, checksums and header; the snapshot.

    Args:
        blob: the bytes.
        where: where they came from (a file path, ``"inline state"``...), for errors.

    Raises:
        CorruptSnapshotError: a wrong magic or version, a truncated or altered snapshot, or a
            header of the wrong structure; the message names ``where`` and the problem.
    """
    view = memoryview(blob).cast("B")

    def corrupt(problem: str) -> CorruptSnapshotError:
        return CorruptSnapshotError(
            f"{where} is not a valid canonical keyed state snapshot: {problem}"
        )

    # Step 1: the fixed prefix.
    if len(view) < _PREFIX.size:
        raise corrupt(f"{len(view)} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, version, header_len, header_crc = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise corrupt(f"starts with {magic!r}, expected magic {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise corrupt(
            f"format version {version}; this version of Sparkpoint reads version {FORMAT_VERSION}"
        )
    if header_len > len(view) - _PREFIX.size:
        raise corrupt(
            f"truncated: the header is {header_len} bytes, "
            f"{len(view) - _PREFIX.size} bytes follow the prefix"
        )
    # Step 2: the header.
    header_bytes = view[_PREFIX.size : _PREFIX.size + header_len]
    if zlib.crc32(header_bytes) != header_crc:
        raise corrupt("the header's CRC-32 does not match (altered)")
    try:
        header = msgpack.unpackb(header_bytes, raw=False)
    except Exception as err:  # a damaged header can raise several kinds
        raise corrupt(f"the header does not decode: {err!r}") from err
    try:
        snapshot = _parse_header(header, where, size=len(view))
    except (KeyError, TypeError, ValueError) as err:
        raise corrupt(f"malformed header: {err}") from err
    # Step 3: the body.
    body = view[_PREFIX.size + header_len :]
    if len(body) != header["body_size"]:
        raise corrupt(
            f"the body is {len(body)} bytes, the header says {header['body_size']} "
            "(truncated or extended)"
        )
    if zlib.crc32(body) != header["body_crc32"]:
        raise corrupt("the body's CRC-32 does not match (altered)")
    snapshot._body = body
    return snapshot


def _int(value: Any, what: str, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{what} is {value!r}, expected an int {bound}")
    return value


def _parse_header(header: Any, where: str, size: int) -> CanonicalSnapshot:
    """The snapshot the header describes, its body not yet attached; ValueError, TypeError
    or KeyError naming the wrong field."""
    if not isinstance(header, dict):
        raise TypeError(f"the header is a {type(header).__name__}, expected a map")
    if header["format"] != FORMAT_NAME or header["version"] != FORMAT_VERSION:
        raise ValueError(f"format {header['format']!r} version {header['version']!r}")
    if not isinstance(header["backend"], str) or type(header["changelog"]) is not bool:
        raise TypeError("backend must be a str and changelog a bool")
    max_parallelism = _int(header["max_parallelism"], "max_parallelism", 1, 1 << 15)
    start, end = header["key_group_range"]
    start = _int(start, "key_group_range start", 0, max_parallelism - 1)
    end = _int(end, "key_group_range end", start, max_parallelism - 1)
    states: dict[str, StateInfo] = {}
    state_sizes: dict[str, tuple[int, int]] = {}
    for item in header["states"]:
        name, kind, serializer = item["name"], item["kind"], item["serializer"]
        if not isinstance(name, str) or name in states or kind not in _KINDS:
            raise ValueError(f"state {name!r} of kind {kind!r} (repeated or unknown kind)")
        serializer_named(serializer, f"{where}, state {name!r},")  # CorruptSnapshotError
        states[name] = StateInfo(name, kind, serializer)
        state_sizes[name] = (
            _int(item["entries"], f"entries of state {name!r}"),
            _int(item["bytes"], f"bytes of state {name!r}"),
        )
    watermarks = {
        _int(c, "a watermark channel"): _int(w, "a watermark", -(1 << 63), (1 << 63) - 1)
        for c, w in header["watermarks"]
    }
    blocks: list[tuple[int, int, int, int]] = []
    position = 0
    for key_group, offset, length, count in header["key_groups"]:
        _int(key_group, "a key group", start if not blocks else blocks[-1][0] + 1, end)
        if _int(offset, f"offset of key group {key_group}") != position:
            raise ValueError(f"key group {key_group} starts at {offset}, expected {position}")
        _int(length, f"length of key group {key_group}", 1)
        blocks.append((key_group, offset, length, _int(count, f"count of key group {key_group}")))
        position += length
    if position != _int(header["body_size"], "body_size"):
        raise ValueError(f"the key groups' blocks cover {position} bytes, not body_size")
    _int(header["body_crc32"], "body_crc32", 0, 0xFFFFFFFF)
    entry_count = sum(block[3] for block in blocks)
    if entry_count != sum(n for n, _ in state_sizes.values()):
        raise ValueError("the key groups' entry counts do not add up to the states' counts")
    return CanonicalSnapshot(
        max_parallelism=max_parallelism,
        key_group_range=KeyGroupRange(start, end),
        states=states,
        watermarks=watermarks,
        backend=header["backend"],
        changelog=header["changelog"],
        entry_count=entry_count,
        size=size,
        where=where,
        _blocks=blocks,
        _state_sizes=state_sizes,
    )
