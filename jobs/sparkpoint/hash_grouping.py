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

from typing import NamedTuple

import numpy as np

# Fewer values than this: numpy.unique's string sort is as fast.
MIN_VALUES = 4096
# Wider strings: the column-by-column hash costs more steps than the sort saves.
MAX_WIDTH = 64

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = np.uint64(0x100000001B3)
# _PADDING[w]: FNV's multiplications for MAX_WIDTH - w zero units after a string of w units.
_PADDING = [np.uint64(pow(int(_FNV_PRIME), MAX_WIDTH - w, 1 << 64)) for w in range(MAX_WIDTH + 1)]


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of integer values, as a new uint64 array: a deterministic,
    well-spread hash in which every input bit reaches every output bit."""
    z = values.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def _width(values: np.ndarray) -> int:
    """Code units per element of a ``U`` or ``S`` array."""
    return values.dtype.itemsize // (4 if values.dtype.kind == "U" else 1)


def string_hashes(values: np.ndarray) -> np.ndarray | None:
    """A 64-bit hash of every string of a ``U`` or ``S`` array (FNV-1a over its code units
    padded with zeros to :data:`MAX_WIDTH` units, then mixed), or None when the strings are
    wider than that. The padding makes the hash a function of the string alone: arrays of
    different widths (two batches' dictionaries, a table's keys and a batch's) hash alike."""
    unit = np.uint32 if values.dtype.kind == "U" else np.uint8
    own = _width(values)
    if not 0 < own <= MAX_WIDTH:
        return None
    units = np.ascontiguousarray(values).view(unit).reshape(len(values), own)
    h = np.full(len(values), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in range(own):
            h ^= units[:, column].astype(np.uint64)
            h *= _FNV_PRIME
        # A zero unit leaves the xor as it is: the padding is only its multiplications.
        h *= _PADDING[own]
    return mix64(h)


def hash_order(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order that sorts ``hashes`` (equal hashes in any order), and the sorted hashes.

    A sort of values is faster than an argsort (61 against 97 ms for 1.2 M here), so each
    hash's low bits are replaced by its index and the packed values sorted: that orders the
    hashes by their high bits. Two different hashes that share their high bits (a few in a
    hundred batches of a million) may then come out of order, which a check finds; that
    batch is argsorted instead."""
    bits = max(1, (len(hashes) - 1).bit_length())
    if bits <= 32:
        low = np.uint64((1 << bits) - 1)
        packed = hashes & ~low
        packed |= np.arange(len(hashes), dtype=np.uint64)
        packed.sort()
        order = (packed & low).astype(np.intp)
        ordered = hashes[order]
        if not np.any(ordered[1:] < ordered[:-1]):
            return order, ordered
    order = np.argsort(hashes)
    return order, hashes[order]


class _HashGroups(NamedTuple):
    order: np.ndarray  # the order that sorts the hashes
    first: np.ndarray  # whether each sorted hash starts a group
    groups: np.ndarray  # the group of each sorted hash (groups numbered in hash order)
    hashes: np.ndarray  # each group's hash, ascending


def _hash_groups(hashes: np.ndarray) -> _HashGroups:
    order, ordered = hash_order(hashes)
    first = np.empty(len(ordered), dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return _HashGroups(order, first, np.cumsum(first) - 1, ordered[first])


def unique_strings(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The distinct values of a 1-d ``U`` or ``S`` array, each value's index into them
    (``numpy.unique(values, return_inverse=True)``, in hash order instead of sorted) and the
    distinct values' hashes (:func:`string_hashes`, ascending), or None
    when the array is too short or too wide for hashing to pay off, or two of its distinct
    strings share a hash: then the caller sorts.

    Equality is numpy's: a ``U`` array holds no trailing NUL, so the strings compare as
    ``numpy.unique`` compares them.
    """
    if values.dtype.kind not in "US" or len(values) < MIN_VALUES:
        return None
    hashes = string_hashes(values)
    if hashes is None:
        return None
    order, first, groups, distinct_hashes = _hash_groups(hashes)
    inverse = np.empty(len(values), dtype=np.int64)
    inverse[order] = groups
    distinct = values[order[first]]
    if not np.array_equal(distinct[inverse], values):  # a collision: two strings, one hash
        return None
    return distinct, inverse, distinct_hashes


def group_dictionaries(
    codes: list[np.ndarray], dictionaries: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`unique_strings` of the records of several dictionary-encoded columns (record
    ``j`` of column ``c`` is ``dictionaries[c][codes[c][j]]``) without joining their
    dictionaries first: each dictionary is hashed where it is, and only the distinct values
    are gathered. The records' indexes come in the columns' order, and the distinct values'
    hashes (ascending) last. None when the dictionaries
    are not all ``U`` (or all ``S``) arrays, are too short or too wide, or on a collision.
    """
    kinds = {values.dtype.kind for values in dictionaries}
    if len(kinds) != 1 or not kinds <= {"U", "S"}:
        return None
    sizes = np.array([len(values) for values in dictionaries], dtype=np.int64)
    if sizes.sum() < MIN_VALUES:
        return None
    width = max(map(_width, dictionaries))
    hashes: list[np.ndarray] = []
    for values in dictionaries:
        h = string_hashes(values)
        if h is None:
            return None
        hashes.append(h)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    everywhere = np.concatenate(
        [c.astype(np.int64) + start for c, start in zip(codes, starts, strict=True)]
    )
    occurs = np.flatnonzero(np.bincount(everywhere, minlength=int(sizes.sum())))
    occurring = np.concatenate(hashes)[occurs]
    order, first, groups, distinct_hashes = _hash_groups(occurring)
    group_of = np.full(int(sizes.sum()), -1, dtype=np.int64)
    group_of[occurs[order]] = groups
    # The distinct values: each group's first value, taken from the dictionary that has it
    # (the groups sorted by where that value is, so each dictionary's share is one slice).
    leaders = order[first]  # each group's first value, as positions in occurs
    chosen = occurs[leaders]
    column_of = np.searchsorted(starts, chosen, side="right") - 1
    # A stable sort of 16-bit integers is a radix sort: O(n).
    narrow = column_of.astype(np.uint16 if len(dictionaries) <= 1 << 16 else np.int64)
    by_place = np.argsort(narrow, kind="stable")
    placed = chosen[by_place]
    cuts = np.searchsorted(column_of[by_place], np.arange(len(dictionaries))).tolist()
    cuts.append(len(placed))
    distinct = np.empty(len(chosen), dtype=f"{next(iter(kinds))}{width}")
    for column, values in enumerate(dictionaries):
        a, b = cuts[column], cuts[column + 1]
        distinct[by_place[a:b]] = values[placed[a:b] - starts[column]]
    # Every occurring value equals its group's (a collision would merge two keys); a group's
    # first value is its own, so only the others are compared. occurs is sorted, and so are
    # the others, so each dictionary's share of them is one slice.
    follows = np.ones(len(occurs), dtype=bool)
    follows[leaders] = False
    others = occurs[follows]
    cuts = [*np.searchsorted(others, starts).tolist(), len(others)]
    for column, values in enumerate(dictionaries):
        mine = others[cuts[column] : cuts[column + 1]]
        if not np.array_equal(values[mine - starts[column]], distinct[group_of[mine]]):
            return None
    return distinct, group_of[everywhere], distinct_hashes
