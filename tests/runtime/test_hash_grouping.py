"""Grouping strings by hash gives numpy.unique's groups, and refuses what it cannot group."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint import hash_grouping
from sparkpoint.hash_grouping import MIN_VALUES, group_dictionaries, unique_strings


def _own_hashes_ascending(distinct: np.ndarray, hashes: np.ndarray) -> None:
    """The hashes handed back are each distinct value's own, in ascending order (a state
    table indexes the keys by them without hashing again)."""
    np.testing.assert_array_equal(hashes, hash_grouping.string_hashes(distinct))
    assert np.all(hashes[1:] > hashes[:-1])


def _same_groups(values: np.ndarray) -> None:
    found = unique_strings(values)
    assert found is not None
    distinct, inverse, hashes = found
    _own_hashes_ascending(distinct, hashes)
    expected, expected_inverse = np.unique(values, return_inverse=True)
    assert sorted(distinct.tolist()) == expected.tolist()
    assert distinct.dtype == values.dtype
    np.testing.assert_array_equal(distinct[inverse], values)
    # Two values share a group exactly when numpy.unique puts them in one.
    pairs = set(zip(inverse.tolist(), expected_inverse.reshape(-1).tolist(), strict=True))
    assert len(pairs) == len(distinct)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text(max_size=12), min_size=1, max_size=60),
    st.integers(0, 2**32 - 1),
)
def test_str_groups_are_numpys_groups(alphabet: list[str], seed: int) -> None:
    rng = np.random.default_rng(seed)
    words = np.array(alphabet, dtype=str)  # trailing NULs go, as numpy compares them
    _same_groups(words[rng.integers(0, len(words), MIN_VALUES + 50)])


def test_bytes_and_many_keys_group_like_numpy() -> None:
    rng = np.random.default_rng(7)
    names = np.array([f"app-{i}" for i in range(200_000)])
    _same_groups(names[rng.integers(0, len(names), 300_000)])
    raw = np.array([f"k{i}".encode() for i in range(5000)], dtype="S")
    _same_groups(raw[rng.integers(0, len(raw), 20_000)])


def test_short_wide_or_other_arrays_are_left_to_numpy() -> None:
    assert unique_strings(np.array(["a", "b"] * 10)) is None
    assert unique_strings(np.arange(MIN_VALUES * 2)) is None
    wide = np.array(["x" * 100, "y" * 100] * MIN_VALUES)
    assert unique_strings(wide) is None


def test_a_hash_collision_falls_back_instead_of_merging_two_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = np.array(["a", "b", "c"] * MIN_VALUES)

    def one_hash(strings: np.ndarray) -> np.ndarray:
        return np.zeros(len(strings), dtype=np.uint64)

    monkeypatch.setattr(hash_grouping, "string_hashes", one_hash)
    assert unique_strings(values) is None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.text(max_size=9), min_size=1, max_size=30), min_size=1, max_size=6))
def test_dictionary_columns_group_as_their_joined_records(dictionaries: list[list[str]]) -> None:
    """Dictionaries of different widths, values that repeat within and across them, and
    values no record uses: the groups are numpy.unique's of the records' values."""
    rng = np.random.default_rng(len(dictionaries))
    # Each dictionary tiled past MIN_VALUES values, so that they are many enough to hash.
    values = [
        np.tile(np.array(words, dtype=str), MIN_VALUES // len(words) + 2) for words in dictionaries
    ]
    codes = [rng.integers(0, len(v) - 1, 2000) for v in values]  # the last value unused
    records = np.concatenate([v[c] for v, c in zip(values, codes, strict=True)])
    found = group_dictionaries(codes, values)
    assert found is not None
    distinct, inverse, hashes = found
    _own_hashes_ascending(distinct, hashes)
    np.testing.assert_array_equal(distinct[inverse], records)
    assert sorted(distinct.tolist()) == np.unique(records).tolist()


def test_dictionaries_of_other_kinds_or_a_collision_are_left_to_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    words = np.array([f"w{i}" for i in range(MIN_VALUES)])
    codes = np.arange(MIN_VALUES)
    assert group_dictionaries([codes], [words]) is not None
    assert group_dictionaries([codes, codes], [words, np.arange(MIN_VALUES)]) is None
    assert group_dictionaries([codes, codes], [words, words.astype("S")]) is None

    def one_hash(strings: np.ndarray, width: int | None = None) -> np.ndarray:
        return np.zeros(len(strings), dtype=np.uint64)

    monkeypatch.setattr(hash_grouping, "string_hashes", one_hash)
    assert group_dictionaries([codes], [words]) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.integers(0, 62))
def test_hash_order_sorts_the_hashes(hashes: list[int], shift: int) -> None:
    # Shifted down, many hashes share their high bits: the packed sort must notice.
    array = np.array(hashes, dtype=np.uint64) >> np.uint64(shift)
    order, ordered = hash_grouping.hash_order(array)
    assert sorted(order.tolist()) == list(range(len(array)))
    assert array[order].tolist() == ordered.tolist() == sorted(array.tolist())


def test_hashes_that_share_their_high_bits_out_of_order_are_argsorted() -> None:
    high = np.uint64(1 << 40)
    array = np.array([5, 3, 4, 1, 2, 0], dtype=np.uint64) | high  # differ in the low bits only
    assert array[hash_grouping.hash_order(array)[0]].tolist() == sorted(array.tolist())
