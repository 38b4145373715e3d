"""The distinct keys of a batch's key column (or of several batches') and each record's index
into them: how the vectorized keyed operators (``count``) find one state entry per key.

Many str keys are grouped by a 64-bit hash (:mod:`sparkpoint.hash_grouping`), so their groups
come in hash order, and the groups' hashes come along (:attr:`KeyGroups.hashes`): a state
table that finds its keys by the same hash (:class:`~sparkpoint.state.hash_index.HashIndex`)
takes them instead of hashing the keys again. Other keys are sorted (``numpy.unique``), or
kept in first-seen order when they cannot be ordered.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import numpy as np

from sparkpoint.hash_grouping import group_dictionaries, unique_strings
from sparkpoint.records import DictColumn, object_array

__all__ = ["KeyGroups", "grouped", "grouped_parts", "narrow"]


class KeyGroups(NamedTuple):
    """The distinct keys (``distinct`` as an array, ``keys`` as a list), each record's index
    into them (``inverse``), and, for str keys grouped by hash, each distinct key's
    :func:`~sparkpoint.hash_grouping.string_hashes` hash in ascending order (else None)."""

    distinct: np.ndarray
    keys: list[Any]
    inverse: np.ndarray
    hashes: np.ndarray | None = None


def grouped(keys: np.ndarray | DictColumn) -> KeyGroups:
    """The :class:`KeyGroups` of one key column."""
    if isinstance(keys, DictColumn):
        return _group_codes(keys)
    try:
        uniq, inverse, hashes = _unique(keys)
    except TypeError:  # an object array whose values cannot be ordered: first-seen order
        return _group_codes(DictColumn._of(np.arange(len(keys)), keys))
    return KeyGroups(uniq, uniq.tolist(), inverse.reshape(-1), hashes)


def grouped_parts(parts: list[np.ndarray | DictColumn]) -> KeyGroups:
    """The :class:`KeyGroups` of the key columns of several batches, the records in the
    columns' order; many str keys in dictionary columns are grouped where they are, without
    joining the columns first."""
    columns = [part for part in parts if isinstance(part, DictColumn)]
    if len(columns) == len(parts):
        found = group_dictionaries([c.codes for c in columns], [c.values for c in columns])
        if found is not None:
            distinct, inverse, hashes = found
            return KeyGroups(distinct, distinct.tolist(), inverse, hashes)
    return grouped(_concatenated(parts))


def narrow(indices: np.ndarray, bound: int) -> np.ndarray:
    """Group indices in ``[0, bound)`` as uint16 when they fit, so a stable sort is O(n).

    numpy's stable sort of 16-bit integers is a radix sort; of wider ones, a merge sort.
    """
    if bound <= 1 << 16:
        return indices.astype(np.uint16)
    return indices


def _unique(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``numpy.unique(values, return_inverse=True)`` and None; many strings are grouped by
    hash (:mod:`sparkpoint.hash_grouping`), so their groups come in hash order, not sorted,
    with their hashes."""
    found = unique_strings(values) if values.ndim == 1 else None
    if found is not None:
        return found
    uniq, inverse = np.unique(values, return_inverse=True)
    return uniq, inverse.reshape(-1), None


def _group_codes(keys: DictColumn) -> KeyGroups:
    """:func:`grouped` of a dictionary-encoded column, touching only the values whose code
    occurs (``np.bincount``). Strings and integers (equal as numpy values iff equal as keys)
    are merged in numpy, as :func:`_unique` gives them for a plain array;
    values of an object array that are equal as Python keys (a repeated value, or ``1`` and
    ``1.0``) share one index through a dict, as they share one state entry."""
    occurs = np.flatnonzero(np.bincount(keys.codes, minlength=len(keys.values)))
    present = keys.values[occurs]
    remap = np.zeros(len(keys.values), dtype=np.int64)
    if present.dtype.kind in "USiu":
        ordered, inverse, hashes = _unique(present)
        remap[occurs] = inverse.reshape(-1)
        return KeyGroups(ordered, ordered.tolist(), remap[keys.codes], hashes)
    # An object array whose values cannot be ordered keeps code order.
    with contextlib.suppress(TypeError):
        occurs = occurs[np.argsort(present, kind="stable")]
    slot: dict[Any, int] = {}
    for code, key in zip(occurs.tolist(), keys.values[occurs].tolist(), strict=True):
        remap[code] = slot.setdefault(key, len(slot))
    ukeys = list(slot)
    return KeyGroups(object_array(ukeys), ukeys, remap[keys.codes])


def _concatenated(parts: list[np.ndarray | DictColumn]) -> np.ndarray | DictColumn:
    """The key columns of several batches as one (dictionary-encoded when all are)."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(part, DictColumn) for part in parts):
        columns = [part for part in parts if isinstance(part, DictColumn)]
        offsets = np.cumsum([0, *(len(c.values) for c in columns[:-1])])
        shifted = [c.codes.astype(np.int64) + o for c, o in zip(columns, offsets, strict=True)]
        codes = np.concatenate(shifted)
        return DictColumn._of(codes, _joined([c.values for c in columns]))
    return _joined([np.asarray(part) for part in parts])


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate``, through object arrays when the kinds differ (str and int keys)."""
    if len({array.dtype.kind for array in arrays}) > 1:
        arrays = [array.astype(object) for array in arrays]
    return np.concatenate(arrays)
