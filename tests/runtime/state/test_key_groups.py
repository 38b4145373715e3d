"""Key group assignment: stable hashes, vectorized == scalar, ranges that partition exactly."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.errors import ConfigurationError
from sparkpoint.state.key_groups import (
    DEFAULT_MAX_PARALLELISM,
    KeyGroupOutOfRangeError,
    KeyGroupRange,
    key_group_for,
    key_group_range,
    key_groups_of,
    operator_index_for_key_group,
    operator_indices_of,
    stable_hash,
)

JOBS_DIR = Path(__file__).resolve().parents[3] / "jobs"

# Computed once with this implementation; a change here reshuffles every key of every
# checkpoint taken before it, so these are regression constants, not to be "updated".
KNOWN = [
    ("a", 3320656311, 55),
    ("app-1", 2471135418, 58),
    ("app-42", 494716462, 46),
    ("ключ", 2812998054, 38),
    ("", 0, 0),
    (b"app-1", 2471135418, 58),
    (0, 3793791033, 57),
    (1, 2433363436, 108),
    (-1, 3839455607, 119),
    (42, 3184996902, 38),
    (2**63, 1209974946, 34),
    (2**64, 1155905921, 1),
    (-(2**70), 4072586156, 44),
    (None, 3821733446, 70),
    (1.5, 3604656526, 14),
    (-0.25, 4226246498, 98),
    (float("inf"), 614355984, 16),
    (float("nan"), 3341382104, 88),
    ((1, "a"), 4070344602, 26),
    (("a", 1), 3301210888, 8),
    ((), 3430008, 120),
    (("app-1", (2, None)), 1034204183, 23),
]


@pytest.mark.parametrize(("key", "expected_hash", "expected_group"), KNOWN)
def test_stable_hash_known_values(key: object, expected_hash: int, expected_group: int) -> None:
    assert stable_hash(key) == expected_hash
    assert key_group_for(key) == expected_group
    assert key_group_for(key, DEFAULT_MAX_PARALLELISM) == expected_hash % 128


def test_str_hash_is_crc32_of_utf8_then_murmur_finalizer() -> None:
    h = zlib.crc32(b"app-1")
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    assert stable_hash("app-1") == h == 2471135418


def test_stable_hash_is_the_same_in_a_process_with_another_hash_seed() -> None:
    keys = [k for k, _, _ in KNOWN if k == k]  # NaN cannot round-trip through equality
    script = (
        "import json, pickle, sys\n"
        "from sparkpoint.state.key_groups import stable_hash\n"
        "keys = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
        "print(json.dumps([[stable_hash(k), hash('salted')] for k in keys]))\n"
    )
    results = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(JOBS_DIR)}
        out = subprocess.run(
            [sys.executable, "-c", script, pickle.dumps(keys).hex()],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(out.stdout))
    # The seeds really differ (Python's own str hash changes) ...
    assert results[0][0][1] != results[1][0][1]
    # ... and the stable hashes do not, in either process or in this one.
    expected = [stable_hash(k) for k in keys]
    assert [h for h, _ in results[0]] == expected
    assert [h for h, _ in results[1]] == expected
    assert expected == [h for k, h, _ in KNOWN if k == k]


def test_keys_that_compare_equal_hash_equally() -> None:
    assert stable_hash(1) == stable_hash(1.0) == stable_hash(True) == 2433363436
    assert stable_hash(np.int64(1)) == stable_hash(np.float32(1.0)) == stable_hash(np.True_)
    assert stable_hash(0) == stable_hash(-0.0) == stable_hash(False) == 3793791033
    assert stable_hash(np.str_("app-1")) == stable_hash("app-1")
    assert stable_hash(np.uint64(2**63)) == stable_hash(2**63) == stable_hash(float(2**63))
    assert stable_hash(float("nan")) == stable_hash(-float("nan")) == stable_hash(np.nan)


def test_tuples_combine_elements_in_order() -> None:
    assert stable_hash((1, "a")) != stable_hash(("a", 1))
    assert stable_hash((1,)) != stable_hash(1)
    assert stable_hash(((1, 2), 3)) != stable_hash((1, (2, 3)))


@pytest.mark.parametrize(
    ("key", "type_name"),
    [
        ([1], "builtins.list"),
        ({"a": 1}, "builtins.dict"),
        ({1}, "builtins.set"),
        ((1, [2]), "builtins.list"),
    ],
)
def test_unsupported_key_types_are_refused_by_name(key: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=f"key of type {type_name};"):
        stable_hash(key)


def test_hashes_are_32_bit_and_spread_over_every_key_group() -> None:
    hashes = [stable_hash(f"app-{i}") for i in range(10_000)]
    assert min(hashes) >= 0 and max(hashes) < 2**32
    counts = np.bincount([h % 128 for h in hashes], minlength=128)
    assert counts.min() == 57 and counts.max() == 97  # mean 78
    int_counts = np.bincount(key_groups_of(np.arange(10_000)), minlength=128)
    assert int_counts.min() == 55 and int_counts.max() == 98


# ----------------------------------------------------------------------------- vectorized


def _scalar(keys: np.ndarray, max_parallelism: int = 128) -> list[int]:
    return [key_group_for(k, max_parallelism) for k in keys.reshape(-1)]


@pytest.mark.parametrize("max_parallelism", [1, 7, 128, 32768])
def test_vectorized_str_array_equals_scalar(max_parallelism: int) -> None:
    keys = np.array([f"app-{i % 300}" for i in range(5000)] + ["", "ключ", "a b"])
    assert keys.dtype.kind == "U"
    groups = key_groups_of(keys, max_parallelism)
    assert groups.dtype == np.int32
    assert groups.tolist() == _scalar(keys, max_parallelism)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=70), min_size=1))
def test_short_ascii_strings_hashed_down_the_columns_equal_scalar(keys: list[str]) -> None:
    """str keys hashed a character position at a time (ASCII, up to 64 characters) give
    what each hashes to alone: NUL inside or at the end (a ``U`` array drops trailing NULs,
    so such a list takes the one-by-one path), empty strings, lengths past the limit."""
    as_list = np.fromiter(keys, dtype=object, count=len(keys))
    assert key_groups_of(as_list, 128).tolist() == [key_group_for(k, 128) for k in keys]
    array = np.array(keys, dtype=str)
    assert key_groups_of(array, 128).tolist() == [key_group_for(k, 128) for k in array.tolist()]


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64])
def test_vectorized_int_array_equals_scalar(dtype: type) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    keys = np.concatenate(
        [
            rng.integers(info.min, info.max, 2000, dtype=dtype, endpoint=True),
            np.array([info.min, info.max, 0, 1], dtype=dtype),
        ]
    )
    groups = key_groups_of(keys)
    assert groups.dtype == np.int32
    assert groups.tolist() == [key_group_for(int(k)) for k in keys]


def test_vectorized_known_int_values() -> None:
    keys = np.array([0, 1, -1, 42, 2**62], dtype=np.int64)
    assert key_groups_of(keys).tolist() == [57, 108, 119, 38, key_group_for(2**62)]
    assert key_groups_of(np.array([2**63], dtype=np.uint64)).tolist() == [34]


def test_vectorized_object_arrays_equal_scalar() -> None:
    mixed = np.empty(9, dtype=object)
    mixed[:] = ["a", 1, None, (1, "a"), 2**70, 1.5, b"x", "a", np.int64(3)]
    assert key_groups_of(mixed).tolist() == _scalar(mixed)
    assert key_groups_of(mixed).tolist()[:3] == [55, 108, 70]

    ints = np.array([1, 2, -1, 2**63 + 5, True], dtype=object)  # uint64 range
    assert key_groups_of(ints).tolist() == _scalar(ints)
    huge = np.array([1, -(2**70), 2**64], dtype=object)  # beyond 64 bits
    assert key_groups_of(huge).tolist() == [108, 44, 1]
    strs = np.array(["b", "a", "b", "c"], dtype=object)
    assert key_groups_of(strs).tolist() == _scalar(strs)


def test_vectorized_bool_float_bytes_arrays_equal_scalar() -> None:
    for keys in (
        np.array([True, False, True]),
        np.array([1.0, 1.5, np.nan, -0.0, np.inf, 2.5], dtype=np.float64),
        np.array([0.5, 3.0], dtype=np.float32),
        np.array([b"app-1", b"", b"app-1"]),
    ):
        assert key_groups_of(keys).tolist() == _scalar(keys)
    assert key_groups_of(np.array([b"app-1"])).tolist() == [58]


def test_vectorized_keeps_shape_and_handles_empty_arrays() -> None:
    grid = np.array([[0, 1], [-1, 42]])
    assert key_groups_of(grid).tolist() == [[57, 108], [119, 38]]
    empty = key_groups_of(np.array([], dtype=object))
    assert empty.dtype == np.int32 and empty.shape == (0,)
    assert key_groups_of(np.array([], dtype=np.int64)).shape == (0,)


def test_vectorized_refuses_unsupported_arrays() -> None:
    with pytest.raises(TypeError, match=r"dtype datetime64\[D\]"):
        key_groups_of(np.array(["2024-01-01"], dtype="datetime64[D]"))
    with pytest.raises(TypeError, match=r"builtins\.list"):
        key_groups_of(np.array([[1], "a"], dtype=object))


# ----------------------------------------------------------------------------- assignment


def test_flink_key_group_ranges() -> None:
    assert [key_group_range(i, 3, 128) for i in range(3)] == [
        KeyGroupRange(0, 42),
        KeyGroupRange(43, 85),
        KeyGroupRange(86, 127),
    ]
    assert key_group_range(0, 1) == KeyGroupRange(0, 127)
    assert key_group_range(5, 128, 128) == KeyGroupRange(5, 5)
    assert [operator_index_for_key_group(kg, 3, 128) for kg in (0, 42, 43, 85, 86, 127)] == [
        0,
        0,
        1,
        1,
        2,
        2,
    ]


@pytest.mark.parametrize("max_parallelism", [1, 2, 7, 128, 1000])
def test_ranges_of_all_subtasks_partition_the_key_groups(max_parallelism: int) -> None:
    candidates = {1, 2, 3, max_parallelism // 2, max_parallelism - 1, max_parallelism}
    for parallelism in sorted(p for p in candidates if 1 <= p <= max_parallelism):
        ranges = [key_group_range(i, parallelism, max_parallelism) for i in range(parallelism)]
        covered = [kg for r in ranges for kg in r]
        assert covered == list(range(max_parallelism))
        for subtask, r in enumerate(ranges):
            assert len(r) >= 1
            owners = {operator_index_for_key_group(kg, parallelism, max_parallelism) for kg in r}
            assert owners == {subtask}
        all_groups = np.arange(max_parallelism)
        assert operator_indices_of(all_groups, parallelism, max_parallelism).tolist() == [
            operator_index_for_key_group(kg, parallelism, max_parallelism)
            for kg in range(max_parallelism)
        ]


def test_operator_indices_of_is_int32_and_checks_its_input() -> None:
    out = operator_indices_of(np.array([0, 64, 127], dtype=np.int32), 2, 128)
    assert out.dtype == np.int32 and out.tolist() == [0, 1, 1]
    with pytest.raises(KeyGroupOutOfRangeError, match=r"key group 128 is outside \[0, 127\]"):
        operator_indices_of(np.array([3, 128]), 2, 128)
    with pytest.raises(ConfigurationError, match="integer array"):
        operator_indices_of(np.array([1.0]), 2, 128)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: key_group_range(0, 0, 128),
            "parallelism must be between 1 and max_parallelism (128), got 0",
        ),
        (
            lambda: key_group_range(0, 129, 128),
            "parallelism must be between 1 and max_parallelism (128), got 129",
        ),
        (
            lambda: key_group_range(3, 3, 128),
            "subtask must be between 0 and parallelism - 1 (2), got 3",
        ),
        (
            lambda: key_group_range(-1, 3, 128),
            "subtask must be between 0 and parallelism - 1 (2), got -1",
        ),
        (lambda: key_group_range(0, 1, 0), "max_parallelism must be between 1 and 32768, got 0"),
        (
            lambda: key_group_range(0, 1, 32769),
            "max_parallelism must be between 1 and 32768, got 32769",
        ),
        (lambda: key_group_range(0, True, 128), "parallelism must be an int, got True"),
        (
            lambda: key_group_range(0, "2", 128),  # type: ignore[arg-type]
            "parallelism must be an int, got str",
        ),
        (lambda: key_group_for("a", 0), "max_parallelism must be between 1 and 32768, got 0"),
        (
            lambda: key_groups_of(np.array([1]), -5),
            "max_parallelism must be between 1 and 32768, got -5",
        ),
        (
            lambda: operator_index_for_key_group(128, 2, 128),
            "key group must be between 0 and max_parallelism - 1 (127), got 128",
        ),
        (lambda: KeyGroupRange(5, 4), "invalid key group range [5, 4]"),
        (lambda: KeyGroupRange(-1, 4), "invalid key group range [-1, 4]"),
        (
            lambda: KeyGroupRange(0, 1.5),  # type: ignore[arg-type]
            "key group range end must be an int, got float",
        ),
    ],
)
def test_invalid_arguments_are_refused(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        call()
    assert message in str(info.value)


def test_key_group_range_helpers() -> None:
    r = KeyGroupRange(3, 5)
    assert list(r) == [3, 4, 5] and len(r) == 3 and str(r) == "[3, 5]"
    assert 3 in r and 5 in r and np.int32(4) in r
    assert 2 not in r and 6 not in r and "4" not in r
    assert pickle.loads(pickle.dumps(r)) == r
