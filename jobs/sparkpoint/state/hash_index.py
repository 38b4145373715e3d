"""Slots of str keys found by their 64-bit hashes in a sorted numpy array, a batch at a time.

A Python dict of a million str keys costs about a microsecond per lookup on this kind of
machine: each lookup misses the caches on the dict's index, its entry and the stored key. The
batch's keys hashed a column at a time (:func:`~sparkpoint.hash_grouping.string_hashes`) and
searched in the sorted hashes of the table's keys cost a fifth of that, and less when the
batch comes in hash order, as :mod:`~sparkpoint.hash_grouping` groups it (consecutive searches
touch neighbouring memory).

A found hash is only a candidate: the key stored in its slot is compared with the key looked
up, and on any mismatch (two keys with one hash; a key ending in NUL, which a ``U`` array
drops) :meth:`HashIndex.find` answers None and the caller asks its dict instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparkpoint.hash_grouping import hash_order, string_hashes
from sparkpoint.records import object_array

__all__ = ["HashIndex", "str_array"]


class HashIndex:
    """Sorted hashes of the keys of slots ``0 .. indexed - 1``, and the slot of each."""

    __slots__ = ("_hashes", "_slots", "indexed")

    def __init__(self) -> None:
        self._hashes = np.empty(0, dtype=np.uint64)
        self._slots = np.empty(0, dtype=np.int64)
        self.indexed = 0

    def add(self, strings: np.ndarray, hashes: np.ndarray | None = None) -> bool:
        """Index the next ``len(strings)`` slots, whose keys are ``strings`` (a ``U`` or
        ``S`` array); False, with nothing indexed, when they are too wide to hash.
        ``hashes``: their :func:`~sparkpoint.hash_grouping.string_hashes`, in ascending
        order (as :mod:`~sparkpoint.hash_grouping` groups keys), when known."""
        if not len(strings):
            return True
        if hashes is None:
            hashes = string_hashes(strings)
            if hashes is None:
                return False
            order, hashes = hash_order(hashes)
        else:
            order = np.arange(len(hashes))
        at = np.searchsorted(self._hashes, hashes)
        self._hashes = np.insert(self._hashes, at, hashes)
        self._slots = np.insert(self._slots, at, order + self.indexed)
        self.indexed += len(strings)
        return True

    def shares_a_hash(self) -> bool:
        """Whether two indexed slots have one hash (the same key twice, or a collision)."""
        return bool(np.any(self._hashes[1:] == self._hashes[:-1]))

    def find(
        self,
        strings: np.ndarray,
        keys: list[Any],
        stored: np.ndarray,
        hashes: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """The slot of every key of ``keys`` (``strings`` as an array, ``hashes`` their
        hashes when known), -1 for a key that no indexed slot holds; None when a hash is
        unusable or matches a slot that ``stored`` (the keys by slot) says holds another key."""
        if hashes is None:
            hashes = string_hashes(strings)
        if hashes is None:
            return None
        slots = np.full(len(keys), -1, dtype=np.int64)
        if not len(self._hashes):
            return slots
        at = np.searchsorted(self._hashes, hashes)
        np.minimum(at, len(self._hashes) - 1, out=at)
        hit = np.flatnonzero(self._hashes[at] == hashes)
        found = self._slots[at[hit]]
        if len(hit) and not bool(np.all(stored[found] == object_array(keys)[hit])):
            return None
        slots[hit] = found
        return slots


def str_array(keys: np.ndarray | list[Any]) -> np.ndarray | None:
    """Keys (an object array or a list) as a ``U`` array when every one is a str, else
    None."""
    listed = keys.tolist() if isinstance(keys, np.ndarray) else keys
    if set(map(type, listed)) != {str}:
        return None if listed else np.array([], dtype="U1")
    return np.array(listed, dtype=str)
