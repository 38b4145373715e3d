"""Blocks of rows assembled with numpy are the bytes ``msgpack.packb`` writes for them: every
header width (fixarray, array 16; bin 8, 16, 32), nil values, any gather order."""

from __future__ import annotations

import itertools

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.state.msgpack_rows import concatenated, pack_blocks

ROWS = st.lists(
    st.tuples(
        st.integers(0, 127),
        st.binary(max_size=20),
        st.one_of(st.none(), st.binary(max_size=20)),
    ),
    min_size=1,
    max_size=60,
)


Row = tuple[int, bytes, bytes | None]


def packed(
    cuts: list[int], rows: list[Row], positions: list[int]
) -> tuple[list[bytes] | None, list[bytes]]:
    state_of = np.array([rows[p][0] for p in positions], dtype=np.int64)
    ordered = [rows[p] for p in positions]
    key_data = b"".join(r[1] for r in ordered)
    value_data = b"".join(r[2] or b"" for r in ordered)
    lengths = (
        np.array([len(r[1]) for r in ordered], dtype=np.int64),
        np.array([0 if r[2] is None else len(r[2]) for r in ordered], dtype=np.int64),
        np.array([r[2] is None for r in ordered], dtype=bool),
    )
    got = pack_blocks(cuts, state_of, key_data, value_data, lengths)
    want = [msgpack.packb(ordered[a:b], use_bin_type=True) for a, b in itertools.pairwise(cuts)]
    return got, want


@settings(max_examples=300, deadline=None)
@given(ROWS, st.data())
def test_blocks_are_what_msgpack_writes(rows: list, data: st.DataObject) -> None:
    positions = data.draw(st.permutations(range(len(rows))))
    inner = data.draw(st.sets(st.integers(1, max(1, len(rows) - 1)), max_size=5))
    cuts = sorted({0, len(rows), *(c for c in inner if c < len(rows))})
    got, want = packed(cuts, rows, list(positions))
    assert got == want


@pytest.mark.parametrize(
    ("rows", "cuts"),
    [
        ([(1, b"k" * 300, b"v" * 70_000), (0, b"", None)], [0, 1, 2]),  # bin 16 and 32
        ([(i % 3, b"%d" % i, None if i % 7 == 0 else b"x") for i in range(70_000)], [0, 70_000]),
        ([(0, b"a", b"b")] * 20, [0, 15, 16, 20]),  # fixarray of 15, of 1 and of 4
    ],
)
def test_wide_headers_and_large_blocks(rows: list, cuts: list[int]) -> None:
    got, want = packed(cuts, rows, list(range(len(rows))))
    assert got == want


def test_a_state_index_past_a_fixint_is_left_to_msgpack() -> None:
    lengths = (np.array([1]), np.array([1]), np.array([False]))
    assert pack_blocks([0, 1], np.array([128]), b"k", b"v", lengths) is None
    assert packed([0, 1], [(127, b"k", b"v")], [0])[0] is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=40))
def test_concatenated_keeps_trailing_nul_bytes(items: list[bytes]) -> None:
    width = max(1, *map(len, items))
    fixed = np.array(items, dtype=f"S{width}")
    lengths = np.array([len(i) for i in items], dtype=np.int64)
    assert concatenated(fixed, lengths) == b"".join(items)
