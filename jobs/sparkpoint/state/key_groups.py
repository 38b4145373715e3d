"""Key groups: which key group a key belongs to, and which subtask owns a key group.

This is Flink's ``KeyGroupRangeAssignment``. Keyed state is partitioned into ``max_parallelism``
key groups; a key belongs to key group ``stable_hash(key) % max_parallelism`` and subtask *i* of
an operator with parallelism *p* owns a contiguous range of key groups. A checkpoint stores
state per key group, so it can be restored with a different parallelism (rescaling) as long as
``max_parallelism`` stays the same.

The hash must be the same in every process on every machine: Python's ``hash()`` of a ``str``
is salted per process (``PYTHONHASHSEED``) and is never used here. Keys that compare equal hash
equally (``1 == 1.0 == True``), as Python's own hash does, so they land in one key group.
"""

from __future__ import annotations

import operator
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkpoint.errors import ConfigurationError, SparkpointError
from sparkpoint.records import DictColumn

DEFAULT_MAX_PARALLELISM = 128
#: Flink's ``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM``.
UPPER_BOUND_MAX_PARALLELISM = 1 << 15

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment
_MIX64_C1 = 0xBF58476D1CE4E5B9
_MIX64_C2 = 0x94D049BB133111EB
_INT64_MIN = -(1 << 63)
_CANONICAL_NAN_BITS = 0x7FF8000000000000


class KeyGroupOutOfRangeError(SparkpointError):
    """A key group lies outside the range a subtask or a state backend is responsible for."""


@dataclass(frozen=True)
class KeyGroupRange:
    """A contiguous range of key groups, both ends inclusive (Flink's ``KeyGroupRange``)."""

    start: int
    end: int  # inclusive

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(
                    f"key group range {name} must be an int, got {type(value).__name__}"
                )
        if not 0 <= self.start <= self.end:
            raise ConfigurationError(
                f"invalid key group range [{self.start}, {self.end}]: "
                "need 0 <= start <= end (end is inclusive)"
            )

    def __contains__(self, key_group: object) -> bool:
        if not isinstance(key_group, (int, np.integer)):
            return False
        return self.start <= int(key_group) <= self.end

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}]"


# ----------------------------------------------------------------------------- hashing


def _fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finalizer: spreads every input bit over the output."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _mix64(x: int) -> int:
    """splitmix64's finalizer of ``x`` (a 64-bit unsigned int), as a 64-bit unsigned int."""
    z = (x + _GOLDEN_GAMMA) & _M64
    z = ((z ^ (z >> 30)) * _MIX64_C1) & _M64
    z = ((z ^ (z >> 27)) * _MIX64_C2) & _M64
    return z ^ (z >> 31)


def _hash_int(value: int) -> int:
    if _INT64_MIN <= value <= _M64:
        # int64 and uint64 values: the two's complement bits, as numpy's integer arrays have them.
        return _mix64(value & _M64) >> 32
    # Larger ints: fold the 64-bit limbs of the magnitude, then mark the sign.
    acc = 0
    magnitude = -value if value < 0 else value
    while magnitude:
        acc = _mix64(acc ^ (magnitude & _M64))
        magnitude >>= 64
    if value < 0:
        acc = ~acc & _M64
    return _mix64(acc) >> 32


def _hash_float(value: float) -> int:
    if value.is_integer():  # 2.0 == 2 must hash as 2 does; -0.0 as 0
        return _hash_int(int(value))
    if value != value:  # every NaN alike
        bits = _CANONICAL_NAN_BITS
    else:
        (bits,) = struct.unpack("<Q", struct.pack("<d", value))
    return _mix64(bits) >> 32


def _hash_bytes(data: bytes) -> int:
    return _fmix32(zlib.crc32(data))


_NONE_HASH = _fmix32(0x6E6F6E65)  # "none"


def stable_hash(key: Any) -> int:
    """A 32-bit hash of ``key`` that is the same in every process, run and machine.

    Args:
        key: a ``str`` (CRC-32 of its UTF-8 bytes, then MurmurHash3's finalizer), ``bytes``
            (same, so a ``str`` and its UTF-8 bytes share a hash), an ``int`` or ``bool``
            (splitmix64's finalizer of the 64-bit value), a ``float`` (integral floats hash as
            the equal int, others by their IEEE bits), ``None``, numpy scalars of those kinds,
            or a ``tuple`` of any of these (element hashes combined in order).

    Returns:
        An int in ``[0, 2**32)``.

    Raises:
        TypeError: for any other type (the message names it).
    """
    if isinstance(key, str):
        return _hash_bytes(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, int):  # bool too: True == 1
        return _hash_int(key)
    if isinstance(key, bytes):
        return _hash_bytes(key)
    if isinstance(key, float):
        return _hash_float(key)
    if key is None:
        return _NONE_HASH
    if isinstance(key, tuple):
        acc = (0x345678 + len(key)) & _M32
        for item in key:
            acc = _fmix32(((acc * 1000003) & _M32) ^ stable_hash(item))
        return acc
    if isinstance(key, (np.integer, np.bool_)):
        return _hash_int(int(key))
    if isinstance(key, np.floating):
        return _hash_float(float(key))
    raise TypeError(
        f"cannot compute a stable hash of a key of type {type(key).__module__}."
        f"{type(key).__qualname__}; keys must be str, bytes, int, bool, float, None "
        "or tuples of those"
    )


def _mix64_array(values: np.ndarray) -> np.ndarray:
    """:func:`_mix64` over a uint64 array, upper 32 bits (what :func:`_hash_int` returns)."""
    z = values + np.uint64(_GOLDEN_GAMMA)  # uint64 arithmetic wraps, as the & _M64 above
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX64_C1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX64_C2)
    z ^= z >> np.uint64(31)
    return z >> np.uint64(32)


def _fmix32_array(h: np.ndarray) -> np.ndarray:
    """:func:`_fmix32` over a uint32 array (uint32 arithmetic wraps, as the & _M32 above)."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _crc32_table() -> np.ndarray:
    """zlib's CRC-32 (reflected polynomial 0xEDB88320) lookup table, one entry per byte."""
    table = np.zeros(256, dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xEDB88320 if crc & 1 else crc >> 1
        table[byte] = crc
    return table


_CRC32_TABLE = _crc32_table()
# Strings up to this many characters are hashed a character position at a time in numpy.
_COLUMN_CRC_WIDTH = 64


def _ascii_crc32s(strings: np.ndarray) -> np.ndarray | None:
    """``zlib.crc32`` of the UTF-8 bytes of every str of a ``U`` array, computed down the
    columns (one numpy step per character position, no call per string), when every
    character is ASCII (its UTF-8 is its code point) and no string is longer than
    :data:`_COLUMN_CRC_WIDTH`; None otherwise."""
    width = strings.dtype.itemsize // 4
    if strings.dtype.kind != "U" or not 0 < width <= _COLUMN_CRC_WIDTH or not strings.size:
        return None
    points = np.ascontiguousarray(strings).view(np.uint32).reshape(-1, width)
    if int(points.max()) >= 0x80:
        return None
    lengths = np.strings.str_len(strings).reshape(-1)
    shortest = int(lengths.min())
    crc = np.full(len(points), _M32, dtype=np.uint32)
    for column in range(int(lengths.max())):
        step = _CRC32_TABLE[(crc ^ points[:, column]) & 0xFF] ^ (crc >> np.uint32(8))
        # Every string is longer than the shortest: no choice to make up to its length.
        crc = step if column < shortest else np.where(column < lengths, step, crc)
    return crc ^ np.uint32(_M32)


def _str_or_bytes_hashes(items: list[Any], kind: type) -> np.ndarray:
    """:func:`stable_hash` of every item of a list of only str or only bytes, as uint64: the
    CRC-32s down the columns of a ``U`` array when they are short ASCII strings (and none
    ends in NUL, which a ``U`` array drops), else one by one in C; the finalizer in numpy."""
    crcs = None
    if kind is str and items:
        lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
        if int(lengths.max()) <= _COLUMN_CRC_WIDTH:
            strings = np.array(items, dtype=str)
            if np.array_equal(np.strings.str_len(strings), lengths):
                crcs = _ascii_crc32s(strings)
    if crcs is None:
        data = (
            map(operator.methodcaller("encode", "utf-8", "surrogatepass"), items)
            if kind is str
            else items
        )
        crcs = np.fromiter(map(zlib.crc32, data), dtype=np.uint32, count=len(items))
    return _fmix32_array(crcs).astype(np.uint64)


def _hashes_of_unique(flat: np.ndarray) -> np.ndarray:
    """Hash each distinct value once and map the hashes back to every position."""
    try:
        unique, inverse = np.unique(flat, return_inverse=True)
    except TypeError:  # an object array whose values cannot be ordered (mixed types)
        return np.fromiter(map(stable_hash, flat.tolist()), dtype=np.uint64, count=flat.size)
    return _hashes_of_each(unique)[inverse.reshape(-1)]


def _hashes_of_each(flat: np.ndarray) -> np.ndarray:
    """:func:`stable_hash` of every element, one by one (str and bytes arrays in C)."""
    if flat.dtype.kind in "US":
        crcs = _ascii_crc32s(flat)  # a U array holds no trailing NUL: nothing to check
        if crcs is not None:
            return _fmix32_array(crcs).astype(np.uint64)
        return _str_or_bytes_hashes(flat.tolist(), str if flat.dtype.kind == "U" else bytes)
    return np.fromiter(map(stable_hash, flat.tolist()), dtype=np.uint64, count=flat.size)


def _int_array_of(values: list[Any]) -> np.ndarray | None:
    """``values`` (all Python ints) as a uint64 array of their 64-bit patterns, or None."""
    for dtype in (np.int64, np.uint64):
        try:
            return np.array(values, dtype=dtype).view(np.uint64)
        except OverflowError:
            continue
    return None


def _stable_hashes(flat: np.ndarray, distinct: bool = False) -> np.ndarray:
    """:func:`stable_hash` of every element of a 1-D array, as a uint64 array. ``distinct``:
    the values are (mostly) distinct, so str and bytes are hashed one by one, not per
    distinct value after a sort."""
    kind = flat.dtype.kind
    if kind in "bu":
        return _mix64_array(flat.astype(np.uint64))
    if kind == "i":
        return _mix64_array(flat.astype(np.int64).view(np.uint64))
    if kind in "US" and distinct:
        return _hashes_of_each(flat)
    if kind in "USf":
        return _hashes_of_unique(flat)
    if kind == "O":
        items = flat.tolist()
        types = set(map(type, items))
        if items and types <= {int, bool}:
            as_ints = _int_array_of(items)
            if as_ints is not None:
                return _mix64_array(as_ints)
        if types == {str} or types == {bytes}:
            return _str_or_bytes_hashes(items, types.pop())
        return _hashes_of_unique(flat)
    raise TypeError(
        f"cannot compute stable hashes of an array of dtype {flat.dtype}; "
        "use str, bytes, integer, bool, float or object arrays"
    )


# ----------------------------------------------------------------------------- assignment


def _check_int(name: str, value: Any, low: int, high: int, high_name: str | None = None) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"{name} must be an int, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ConfigurationError(f"{name} must be an int, got {type(value).__name__}") from None
    if not low <= number <= high:
        upper = f"{high_name} ({high})" if high_name else str(high)
        raise ConfigurationError(f"{name} must be between {low} and {upper}, got {number}")
    return number


def check_max_parallelism(max_parallelism: int) -> int:
    """Validate a max parallelism (1 to 32768, as Flink allows) and return it."""
    return _check_int("max_parallelism", max_parallelism, 1, UPPER_BOUND_MAX_PARALLELISM)


def check_parallelism(parallelism: int, max_parallelism: int) -> int:
    """Validate a parallelism against its max parallelism and return it."""
    check_max_parallelism(max_parallelism)
    return _check_int("parallelism", parallelism, 1, max_parallelism, "max_parallelism")


def key_group_for(key: Any, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """The key group of ``key``: ``stable_hash(key) % max_parallelism``."""
    return stable_hash(key) % check_max_parallelism(max_parallelism)


def key_groups_of(
    keys: np.ndarray | DictColumn, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> np.ndarray:
    """The key group of every key in an array, as an int32 array of the same shape.

    Gives the same result as :func:`key_group_for` on each element. Integer and bool arrays
    are hashed in numpy uint64 arithmetic; str, bytes, float and object arrays hash each
    distinct value once (``numpy.unique``) and map the results back. A :class:`DictColumn`
    hashes only its ``values`` and indexes the result by its codes: O(n), no sort.

    Raises:
        TypeError: for an unsupported dtype or element type.
    """
    check_max_parallelism(max_parallelism)
    if isinstance(keys, DictColumn):  # its values are mostly distinct: hashed without a sort
        array, codes = keys.values, keys.codes
        hashes = _stable_hashes(array.reshape(-1), distinct=True)
    else:
        array, codes = np.asarray(keys), None
        hashes = _stable_hashes(array.reshape(-1))
    groups = (hashes % np.uint64(max_parallelism)).astype(np.int32).reshape(array.shape)
    return groups if codes is None else groups[codes]


def operator_index_for_key_group(
    key_group: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> int:
    """The subtask that owns ``key_group`` (Flink's ``computeOperatorIndexForKeyGroup``)."""
    check_parallelism(parallelism, max_parallelism)
    key_group = _check_int("key group", key_group, 0, max_parallelism - 1, "max_parallelism - 1")
    return key_group * parallelism // max_parallelism


def operator_indices_of(
    key_groups: np.ndarray, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> np.ndarray:
    """:func:`operator_index_for_key_group` of every key group in an array (int32)."""
    check_parallelism(parallelism, max_parallelism)
    groups = np.asarray(key_groups)
    if groups.dtype.kind not in "iu":
        raise ConfigurationError(f"key groups must be an integer array, got dtype {groups.dtype}")
    groups = groups.astype(np.int64)
    if groups.size and (groups.min() < 0 or groups.max() >= max_parallelism):
        bad = groups[(groups < 0) | (groups >= max_parallelism)][0]
        raise KeyGroupOutOfRangeError(
            f"key group {bad} is outside [0, {max_parallelism - 1}] "
            f"(max_parallelism {max_parallelism})"
        )
    return (groups * parallelism // max_parallelism).astype(np.int32)


def key_group_range(
    subtask: int, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> KeyGroupRange:
    """The key groups subtask ``subtask`` of ``parallelism`` owns.

    Flink's ``computeKeyGroupRangeForOperatorIndex``: the ranges of subtasks ``0 ..
    parallelism - 1`` partition ``[0, max_parallelism)`` into contiguous, non-empty ranges,
    consistent with :func:`operator_index_for_key_group`.
    """
    check_parallelism(parallelism, max_parallelism)
    subtask = _check_int("subtask", subtask, 0, parallelism - 1, "parallelism - 1")
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)
