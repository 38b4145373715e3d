"""The canonical format's column-wise codec: the same bytes and entries as the entry-by-entry
reference code, bulk key groups, and the cases where it hands over to the reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.errors import ConfigurationError
from sparkpoint.state import canonical, canonical_codec, hashmap
from sparkpoint.state.backend import DELETED, StateInfo
from sparkpoint.state.canonical import decode_snapshot, encode_snapshot_raw
from sparkpoint.state.canonical_codec import EntryColumns
from sparkpoint.state.key_groups import KeyGroupOutOfRangeError, key_group_for, key_groups_of

from .test_canonical import _JSON, _KEYS, FULL, MP, STATES, TABLES, encode, entries_of, tables_of

# ----------------------------------------------------------------------------- column-wise path
# encode_body / block_columns give up (None) on anything unusual, and the entry-by-entry
# reference code writes or reads it: both paths must give the same bytes and the same entries.


def reference_blob(encode_it: Any) -> bytes:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(canonical_codec, "encode_body", lambda *args, **kwargs: None)
        return bytes(encode_it())


def reference_entries(blob: bytes, raw: bool = False) -> list[Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(canonical_codec, "block_columns", lambda *args, **kwargs: None)
        snapshot = decode_snapshot(blob, "x")
        return list(snapshot.raw_entries() if raw else snapshot.entries())


_STR_KEYS = st.text(
    st.characters(codec="utf-8") | st.sampled_from(["\x00", "\ud800", "é"]), max_size=8
)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.dictionaries(_KEYS | _STR_KEYS, st.integers(-(2**63), 2**63 - 1), max_size=12),
    names=st.dictionaries(_STR_KEYS, st.integers(-(2**70), 2**70) | st.text(max_size=3)),
    blobs=st.dictionaries(st.binary(max_size=6), st.floats(allow_nan=False), max_size=8),
    events=st.dictionaries(_KEYS, st.lists(_JSON, max_size=3), max_size=4),
    deleted=st.sets(_STR_KEYS, max_size=4),
)
def test_the_column_wise_path_writes_and_reads_what_the_reference_does(
    counts: dict[Any, int],
    names: dict[str, Any],
    blobs: dict[bytes, float],
    events: dict[Any, list[Any]],
    deleted: set[str],
) -> None:
    states = {
        "count": StateInfo("count", "value", "int64"),
        "events": StateInfo("events", "list", "json"),
        "names": StateInfo("names", "value", "pickle"),
        "ratio": StateInfo("ratio", "value", "float64"),
    }
    tables = {
        "count": counts,
        "names": {**names, **dict.fromkeys(deleted, DELETED)},
        "ratio": blobs,
        "events": events,
    }
    entries = entries_of(tables)

    def write() -> bytes:
        return encode(entries, states=states, changelog=True)

    fast = write()

    assert fast == reference_blob(write)
    assert list(decode_snapshot(fast, "x").entries()) == reference_entries(fast)
    raw = list(decode_snapshot(fast, "x").raw_entries())
    assert raw == reference_entries(fast, raw=True)

    def write_raw() -> bytes:
        return encode_snapshot_raw(
            states,
            raw,
            max_parallelism=MP,
            key_group_range=FULL,
            watermarks={},
            backend="hashmap",
            changelog=True,
        )

    assert write_raw() == reference_blob(write_raw) == fast


def test_entry_columns_encode_as_their_entries_do() -> None:
    tables = {"count": {f"app-{i}": i for i in range(300)}, "unused": {}}
    columns = EntryColumns(tables, lambda keys: [key_group_for(key, MP) for key in keys])

    assert list(columns) == entries_of(tables)
    assert encode(columns) == encode(entries_of(tables))  # type: ignore[arg-type]
    assert encode(columns) == reference_blob(lambda: encode(entries_of(tables)))  # type: ignore[arg-type]


def test_keys_that_differ_in_trailing_zero_bytes_sort_as_bytes() -> None:
    """numpy's bytes arrays compare b"a" and b"a\\x00" equal: the reference sorts those."""
    tables = {"count": {"a\x00": 1, "a": 2, b"a": 3, b"a\x00\x00": 4, 0: 5, 256: 6}}

    blob = encode(entries_of(tables))

    assert blob == reference_blob(lambda: encode(entries_of(tables)))
    assert tables_of(list(decode_snapshot(blob, "x").entries())) == tables


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ((0, "count", "a", 2**63), "cannot be written with serializer 'int64'"),
        ((0, "count", "a", 1.5), "cannot be written with serializer 'int64'"),
        ((0, "nope", "a", 1), "not a state of the snapshot"),
        ((MP, "count", "a", 1), "outside the key group range"),
        ((0, "count", "a", DELETED), "tombstones are only allowed in changelogs"),
    ],
)
def test_a_bad_entry_among_many_is_named_as_entry_by_entry(
    entry: tuple[int, str, Any, Any], message: str
) -> None:
    entries = entries_of({"count": {f"k{i}": i for i in range(500)}})
    entries.insert(250, entry)

    with pytest.raises((ConfigurationError, KeyGroupOutOfRangeError), match=message):
        encode(entries)


def test_an_entry_source_that_fails_names_an_earlier_bad_entry_first() -> None:
    def source() -> Any:
        yield (0, "nope", "a", 1)
        raise RuntimeError("source broke")

    with pytest.raises(ConfigurationError, match="not a state of the snapshot"):
        encode(source())


def test_mixed_entries_take_the_column_wise_path() -> None:
    """Not a fallback that always gives up: the property above compares two real paths."""
    entries = entries_of(TABLES)
    codecs = canonical._codecs(STATES)

    body = canonical_codec.encode_body(
        codecs, sorted(STATES), entries, 0, MP - 1, changelog=False, encoded=False
    )

    assert body is not None
    blocks, table, counts, sizes = body
    assert counts == [4, 3, 2, 0]  # count, events, seen, unused
    blob = encode(entries)
    snapshot = decode_snapshot(blob, "x")
    view = memoryview(blob)[len(blob) - len(b"".join(blocks)) :]
    for _key_group, offset, length, count in table:
        columns = canonical_codec.block_columns(view[offset : offset + length], count, 4, False)
        assert columns is not None
    assert sizes == [n for _, n in snapshot.state_sizes().values()]


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(_STR_KEYS, unique=True) | st.lists(st.binary(max_size=9), unique=True))
def test_key_groups_of_many_str_or_bytes_keys_are_their_stable_hashes(keys: list[Any]) -> None:
    array = np.fromiter(keys, dtype=object, count=len(keys))

    assert key_groups_of(array, 128).tolist() == [key_group_for(key, 128) for key in keys]
    assert hashmap._key_groups(keys, 128) == [key_group_for(key, 128) for key in keys]


def test_long_keys_are_sorted_without_a_numpy_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    tables: dict[str, dict[Any, Any]] = {
        "count": {f"k{i}": i for i in range(200)},
        "seen": {(1, "x" * 50): {2: 3}},
    }
    expected = reference_blob(lambda: encode(entries_of(tables)))

    def refuse(*args: Any) -> Any:
        raise AssertionError("the column-wise path gave up")

    monkeypatch.setattr(canonical_codec, "_SORT_COPY_LIMIT", 0)
    monkeypatch.setattr(canonical_codec, "reference_body", refuse)

    assert encode(entries_of(tables)) == expected


@settings(max_examples=40, deadline=None)
@given(
    counts=st.dictionaries(st.text(st.characters(max_codepoint=0x7F), max_size=6), st.integers()),
    ratios=st.dictionaries(
        st.text(st.characters(max_codepoint=0x7F), max_size=9), st.floats(allow_nan=False)
    ),
)
def test_ascii_str_keys_of_every_state_encode_as_the_reference_does(
    counts: dict[str, int], ratios: dict[str, float]
) -> None:
    """The keys of all states in one fixed-width array (ASCII, none ending in NUL), and the
    same keys with a trailing NUL (which such an array would drop) through bytes objects."""
    states = {
        "count": StateInfo("count", "value", "int64"),
        "ratio": StateInfo("ratio", "value", "float64"),
    }
    counts = {key: value % 2**63 for key, value in counts.items()}
    for tables in (
        {"count": counts, "ratio": ratios},
        {"count": {key + "\x00": value for key, value in counts.items()}, "ratio": ratios},
    ):
        columns = EntryColumns(tables, lambda keys: [key_group_for(key, MP) for key in keys])

        def write(columns: EntryColumns = columns) -> bytes:
            return encode(columns, states=states)  # type: ignore[arg-type]

        fast = write()
        assert fast == reference_blob(write)
        assert list(decode_snapshot(fast, "x").entries()) == reference_entries(fast)
