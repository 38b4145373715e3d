"""Distinct values of a string column found by a 64-bit hash instead of a string sort.

``numpy.unique`` of a ``U`` array sorts the strings themselves: a comparison of up to the
whole width per step, about a second for a million keys here. Hashing every string down
its columns (one numpy step per character position) and sorting the 64-bit hashes gives the
same groups four to five times faster. Two distinct strings with the same hash would share
a group, so every value is compared with its group's representative afterwards; on any
mismatch the caller falls back to the string sort. The groups come in hash order, which is
deterministic (the same values give the same order in every process) but not sorted.
"""

from __future__ import annotations

import numpy as np

# Fewer values than this: numpy.unique's string sort is as fast.
MIN_VALUES = 4096
# Wider strings: the column-by-column hash costs more steps than the sort saves.
MAX_WIDTH = 64

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = np.uint64(0x100000001B3)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, in place where it can: every input bit reaches every output bit."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _hashes(values: np.ndarray) -> np.ndarray | None:
    """A 64-bit hash of every string of a ``U`` or ``S`` array (FNV-1a over its code units,
    then mixed), or None when the strings are too wide to be worth it."""
    unit = np.uint32 if values.dtype.kind == "U" else np.uint8
    width = values.dtype.itemsize // np.dtype(unit).itemsize
    if not 0 < width <= MAX_WIDTH:
        return None
    units = np.ascontiguousarray(values).view(unit).reshape(len(values), width)
    h = np.full(len(values), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in range(width):
            h ^= units[:, column].astype(np.uint64)
            h *= _FNV_PRIME
        return _mix64(h)


def unique_strings(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The distinct values of a 1-d ``U`` or ``S`` array and each value's index into them
    (``numpy.unique(values, return_inverse=True)``, in hash order instead of sorted), or None
    when the array is too short or too wide for hashing to pay off, or two of its distinct
    strings share a hash: then the caller sorts.

    Equality is numpy's: a ``U`` array holds no trailing NUL, so the strings compare as
    ``numpy.unique`` compares them.
    """
    if values.dtype.kind not in "US" or len(values) < MIN_VALUES:
        return None
    hashes = _hashes(values)
    if hashes is None:
        return None
    order = np.argsort(hashes)
    ordered = hashes[order]
    first = np.empty(len(ordered), dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    inverse = np.empty(len(values), dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    distinct = values[order[first]]
    if not np.array_equal(distinct[inverse], values):  # a collision: two strings, one hash
        return None
    return distinct, inverse
