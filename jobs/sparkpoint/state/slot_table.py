"""The ``hashmap`` table of a value state of fixed-width numbers (declared ``int64`` or
``float64``): the values in one numpy array, not one Python object per key.

A dict maps each key to a slot (or, for a table of many str keys updated a batch at a time,
a :class:`~sparkpoint.state.hash_index.HashIndex`: see :meth:`SlotTable.add_many`);
``values[slot]`` is its number, ``present[slot]`` whether it
has one (a removed key keeps its slot, so adding it again reuses it) and ``written[slot]``
whether it was written since the last :meth:`SlotTable.take_changes`. A batch of keys costs one
dict lookup per key and numpy for the rest, where a dict of objects pays a lookup per read, per
write and per tracked key; the epoch's changelog is the written mask; a snapshot's capture
copies the arrays (a number cannot change in place, so no copy-on-write is needed, and a read
is not a change as it is for a :class:`~sparkpoint.state.hashmap.TrackedTable`).

A value the serializer could not write (a float in an ``int64`` state, an int beyond 64 bits,
a string) is refused when written, naming the state, the key and the value.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from sparkpoint.errors import ConfigurationError
from sparkpoint.records import object_array
from sparkpoint.state.hash_index import HashIndex, str_array

__all__ = ["COLUMN_SERIALIZERS", "SlotColumns", "SlotTable", "refused_value"]

COLUMN_SERIALIZERS = {"int64": np.dtype(np.int64), "float64": np.dtype(np.float64)}
_MISSING: Any = object()
_INT64 = (-(1 << 63), (1 << 63) - 1)
_ITEMS_CHUNK = 4096
# A batch of at least this many keys, given as a str array, moves the table to a hash index.
INDEX_MIN_KEYS = 4096


class SlotColumns(Mapping[Any, Any]):
    """Keys and values as two columns (a capture of a :class:`SlotTable`, or its changes): a
    read-only mapping that lists its columns without building a dict. Columns given as numpy
    arrays become lists when first asked for (a capture's synchronous part only copies
    arrays; the asynchronous part lists them)."""

    __slots__ = ("_dict", "_keys", "_values")

    def __init__(self, keys: list[Any] | np.ndarray, values: list[Any] | np.ndarray) -> None:
        self._keys = keys
        self._values = values
        self._dict: dict[Any, Any] | None = None

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def __getitem__(self, key: Any) -> Any:
        if self._dict is None:
            self._dict = dict(zip(self.keys(), self.values(), strict=True))
        return self._dict[key]

    def keys(self) -> list[Any]:  # type: ignore[override]
        keys = self._keys
        if isinstance(keys, np.ndarray):
            keys = self._keys = keys.tolist()
        return keys

    def values(self) -> list[Any]:  # type: ignore[override]
        values = self._values
        if isinstance(values, np.ndarray):
            values = self._values = values.tolist()
        return values

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        return zip(self.keys(), self.values(), strict=True)

    def number_column(self) -> np.ndarray | None:
        """The values as the numpy array they came as (no entry removed), else None."""
        values = self._values
        return values if isinstance(values, np.ndarray) else None


class SlotTable:
    """Key -> number of one value state, in columns (see the module docstring)."""

    __slots__ = (
        "_dtype",
        "_index",
        "_indexable",
        "_keys",
        "_len",
        "_n",
        "_name",
        "_present",
        "_serializer",
        "_slot",
        "_values",
        "_written",
        "cow",
    )

    def __init__(self, name: str, serializer: str) -> None:
        self._name = name
        self._serializer = serializer
        self._dtype = COLUMN_SERIALIZERS[serializer]
        # key -> slot; None while the hash index finds the slots instead (see add_many)
        self._slot: dict[Any, int] | None = {}
        self._index: HashIndex | None = None
        self._indexable = True  # False once the index had to give way to the dict
        self._n = 0  # slots taken
        self._keys = np.empty(0, dtype=object)
        self._values = np.zeros(0, dtype=self._dtype)
        self._present = np.zeros(0, dtype=bool)
        self._written = np.zeros(0, dtype=bool)
        self._len = 0
        self.cow: Any = None  # the backend's copy-on-write switch: numbers need none

    def __repr__(self) -> str:
        return f"SlotTable({self._name!r}, {self._serializer}, {self._len} keys)"

    def __eq__(self, other: object) -> bool:  # equal to a dict of the same entries
        if isinstance(other, (SlotTable, Mapping)):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    # ------------------------------------------------------------------------- one key

    def __len__(self) -> int:
        return self._len

    def __contains__(self, key: object) -> bool:
        slot = self._slots().get(key)
        return slot is not None and bool(self._present[slot])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def get(self, key: Any, default: Any = None) -> Any:
        slot = (self._slot if self._slot is not None else self._slots()).get(key)
        if slot is None or not self._present.item(slot):
            return default
        return self._values.item(slot)

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        slot = self.raw_set(key, value)  # first: a new slot may grow the arrays
        self._written[slot] = True

    def __delitem__(self, key: Any) -> None:
        if self.pop(key, _MISSING) is _MISSING:
            raise KeyError(key)

    def pop(self, key: Any, default: Any = None) -> Any:
        slot = self._slots().get(key)
        if slot is None or not self._present[slot]:
            return default
        self._present[slot] = False
        self._written[slot] = True
        self._len -= 1
        return self._values[slot].item()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            self[key] = default
            return self.get(key)
        return value

    def keys(self) -> list[Any]:
        return self._keys[self._live()].tolist()

    def values(self) -> list[Any]:
        return self._values[self._live()].tolist()

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The entries, listed a chunk at a time (a sample of the first few lists little)."""
        live = self._live()
        for start in range(0, len(live), _ITEMS_CHUNK):
            chunk = live[start : start + _ITEMS_CHUNK]
            yield from zip(self._keys[chunk].tolist(), self._values[chunk].tolist(), strict=True)

    # ------------------------------------------------------------------------- batches

    def get_many(self, keys: list[Any], default: Any) -> list[Any]:
        slots = self._lookup(keys)
        found = slots >= 0
        found[found] = self._present[slots[found]]
        if found.all():
            return self._values[slots].tolist()
        values: list[Any] = [default] * len(keys)
        hits = np.flatnonzero(found)
        for index, value in zip(hits.tolist(), self._values[slots[hits]].tolist(), strict=True):
            values[index] = value
        return values

    def put_many(self, keys: list[Any], values: Any) -> None:
        slots = self._put(keys, values)
        self._written[slots] = True

    def add_many(
        self,
        keys: list[Any],
        deltas: np.ndarray,
        strings: np.ndarray | None = None,
        hashes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add ``deltas[i]`` to the number of ``keys[i]`` (0 when absent), for distinct
        ``keys``, with one lookup per key; the new values. A sum that leaves ``int64`` is
        refused (naming its key) before anything is written.

        ``strings``: the keys as a ``U`` or ``S`` array, when they are all str. A batch of
        :data:`INDEX_MIN_KEYS` or more of them moves a table of str keys from its dict to a
        :class:`~sparkpoint.state.hash_index.HashIndex` (which then finds the slots of every
        such batch, and takes in the new keys without a dict to update); a lookup of one key,
        a batch without strings, or any doubt of the index moves it back to a dict for good.
        ``hashes``: the strings' hashes in ascending order, when the keys were grouped by them
        (:class:`~sparkpoint.key_grouping.KeyGroups`): the index takes them as they are.
        """
        indexed = strings is not None and self._index_ready(strings, len(keys))
        slots = self._lookup(keys, strings if indexed else None, hashes)
        new = slots < 0
        if new.any():
            slots[new] = self._new_slots(list(itertools.compress(keys, new.tolist())))
            if self._index is not None and strings is not None:
                self._index_new(strings[new], None if hashes is None else hashes[new])
        present = self._present[slots]
        base = np.where(present, self._values[slots], 0)
        totals = base + deltas
        if self._dtype.kind == "i":
            wrapped = np.flatnonzero(((base ^ totals) & (deltas ^ totals)) < 0)
            if len(wrapped):
                first = int(wrapped[0])
                self._checked(keys[first], int(base[first]) + int(deltas[first]))
        self._len += len(slots) - int(np.count_nonzero(present))
        self._present[slots] = True
        self._written[slots] = True
        self._values[slots] = totals
        return totals.astype(self._dtype, copy=False)

    # ------------------------------------------------------------------------- the backend's

    def raw_set(self, key: Any, value: Any) -> int:
        """Set one value without counting it as a change (a restore); its slot."""
        number = self._checked(key, value)
        slot = (self._slot if self._slot is not None else self._slots()).get(key)
        if slot is None:
            slot = int(self._new_slots([key])[0])
        if not self._present.item(slot):
            self._present[slot] = True
            self._len += 1
        self._values[slot] = number
        return slot

    def raw_pop(self, key: Any) -> None:
        """Remove one key without counting it as a change (a restore)."""
        slot = self._slots().get(key)
        if slot is not None and self._present[slot]:
            self._present[slot] = False
            self._len -= 1

    def raw_update(self, keys: list[Any], values: list[Any]) -> None:
        """Set many values without counting them as changes (a restore). Into an empty table
        (a working state's base), distinct keys take their slots in order: no lookups. Many
        str keys are indexed by hash (as :meth:`add_many` would index them), not by a dict."""
        strings = self._batch_strings(keys)
        if self._n or not keys or not self._fill(keys, values, strings):
            self._put(keys, values, strings)

    def _fill(self, keys: list[Any], values: list[Any], strings: np.ndarray | None) -> bool:
        """Distinct ``keys`` into an empty table, in order; False on a repeated key."""
        index: HashIndex | None = None
        slot: dict[Any, int] | None = None
        if strings is not None:
            index = HashIndex()
            if not index.add(strings) or index.shares_a_hash():  # a repeat, or a collision
                index = None
        if index is None:
            slot = dict(zip(keys, range(len(keys)), strict=False))
            if len(slot) < len(keys):  # a repeated key: the last one wins, as in a dict
                return False
        numbers = self._column(keys, values)
        self._reserve(max(len(keys), 1024))
        self._slot, self._index = slot, index
        self._n = len(keys)
        self._keys[: len(keys)] = object_array(keys)
        self._values[: len(keys)] = numbers
        self._present[: len(keys)] = True
        self._len = len(keys)
        return True

    def _batch_strings(self, keys: list[Any]) -> np.ndarray | None:
        """``keys`` as a ``U`` array for the hash index to find: when it finds this table's
        slots already, or the batch is large enough to move the table to it; else None."""
        if not keys or not self._indexable or (self._index is None and len(keys) < INDEX_MIN_KEYS):
            return None
        return str_array(keys)

    def copy(self) -> SlotColumns:
        """The live entries now (the synchronous part of a snapshot: a copy of columns)."""
        live = self._live()
        return SlotColumns(self._keys[live], self._values[live])

    def take_changes(self, deleted: Any) -> SlotColumns:
        """The keys written since the last call and their values (``deleted`` for a removed
        key); then none is."""
        n = self._n
        changed = np.flatnonzero(self._written[:n])
        self._written[:n] = False
        removed = np.flatnonzero(~self._present[changed]).tolist()
        if not removed:  # the numbers stay an array: a delta writes them as one buffer
            return SlotColumns(self._keys[changed].tolist(), self._values[changed])
        values: list[Any] = self._values[changed].tolist()
        for index in removed:
            values[index] = deleted
        return SlotColumns(self._keys[changed].tolist(), values)

    def __reduce__(self) -> Any:  # a plain dict when pickled, as a TrackedTable
        return (dict, (dict(self.items()),))

    # ------------------------------------------------------------------------- inside

    def _live(self) -> np.ndarray:
        return np.flatnonzero(self._present[: self._n])

    def _slots(self) -> dict[Any, int]:
        """The dict of key -> slot, made from the keys if the hash index had it instead
        (which then gives way for good: lookups of single keys would rebuild it each time)."""
        if self._slot is None:
            self._slot = dict(zip(self._keys[: self._n].tolist(), range(self._n), strict=True))
            self._index = None
            self._indexable = False
        return self._slot

    def _index_ready(self, strings: np.ndarray, count: int) -> bool:
        """Whether the hash index, brought up to date with every slot, finds the slots of
        this batch of str keys (see :meth:`add_many`)."""
        if not self._indexable or strings.dtype.kind not in "US":
            return False
        if self._index is None:
            if count < INDEX_MIN_KEYS:
                return False
            self._index = HashIndex()
        behind = self._keys[self._index.indexed : self._n]
        known = str_array(behind) if len(behind) else strings[:0]
        if known is None or not self._index.add(known):
            self._slots()
            self._index, self._indexable = None, False  # for good, as a dict's table
            return False
        self._slot = None  # the index finds the slots now: no dict to keep up to date
        return True

    def _index_new(self, strings: np.ndarray, hashes: np.ndarray | None = None) -> None:
        """Index the slots just made for ``strings`` (the last ``len(strings)``)."""
        assert self._index is not None
        if self._index.indexed + len(strings) != self._n or not self._index.add(strings, hashes):
            self._slots()

    def _lookup(
        self, keys: list[Any], strings: np.ndarray | None = None, hashes: np.ndarray | None = None
    ) -> np.ndarray:
        if strings is not None and self._index is not None:
            slots = self._index.find(strings, keys, self._keys, hashes)
            if slots is not None:
                return slots
        get = self._slots().get
        return np.fromiter(map(get, keys, itertools.repeat(-1)), dtype=np.int64, count=len(keys))

    def _put(self, keys: list[Any], values: Any, strings: np.ndarray | None = None) -> np.ndarray:
        """Write ``values`` at ``keys`` (the last of a repeated key wins, as in a dict); the
        slots written. ``strings``: the keys as a ``U`` array, for the hash index."""
        numbers = self._column(keys, values)
        indexed = strings is not None and self._index_ready(strings, len(keys))
        slots = self._lookup(keys, strings if indexed else None)
        new = slots < 0
        if new.any():
            unseen = list(itertools.compress(keys, new.tolist()))
            fresh = list(dict.fromkeys(unseen))
            self._new_slots(fresh)
            if self._index is not None and strings is not None:
                self._index_new(np.array(fresh, dtype=str))
                slots[new] = self._lookup(unseen, strings[new])
            else:
                slots[new] = self._lookup(unseen)
        if len(slots) > 1 and np.bincount(slots).max() > 1:  # repeated keys: keep the last
            last = len(slots) - 1 - np.unique(slots[::-1], return_index=True)[1]
            slots, numbers = slots[last], numbers[last]
        self._len += int(np.count_nonzero(~self._present[slots]))
        self._present[slots] = True
        self._values[slots] = numbers
        return slots

    def _new_slots(self, keys: list[Any]) -> np.ndarray:
        """Slots for ``keys`` (distinct and not in the table)."""
        start = self._n
        end = start + len(keys)
        if end > len(self._values):
            self._reserve(max(end, 2 * len(self._values), 1024))
        if self._slot is not None:
            self._slot.update(zip(keys, range(start, end), strict=True))
        self._keys[start:end] = object_array(keys)
        self._n = end
        return np.arange(start, end, dtype=np.int64)

    def _reserve(self, capacity: int) -> None:
        n = self._n
        keys = np.empty(capacity, dtype=object)
        keys[:n] = self._keys[:n]
        self._keys = keys
        for field in ("_values", "_present", "_written"):
            old = getattr(self, field)
            grown = np.zeros(capacity, dtype=old.dtype)
            grown[:n] = old[:n]
            setattr(self, field, grown)

    def _column(self, keys: list[Any], values: Any) -> np.ndarray:
        """``values`` as this table's dtype, every one checked as :meth:`_checked` does."""
        if len(values) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        if isinstance(values, np.ndarray) and values.dtype == self._dtype:
            return values
        allowed = {int, bool} if self._dtype.kind == "i" else {int, bool, float}
        if set(map(type, values)) <= allowed:
            try:
                return np.array(values, dtype=self._dtype)
            except OverflowError:
                pass
        for key, value in zip(keys, values, strict=True):
            self._checked(key, value)
        return np.array(values, dtype=self._dtype)

    def _checked(self, key: Any, value: Any) -> Any:
        """``value`` if this table can hold it, else the error naming the state and key."""
        if type(value) is int and _INT64[0] <= value <= _INT64[1]:  # a record's usual case
            return value
        if self._dtype.kind == "i":
            ok = isinstance(value, (int, np.integer)) and _INT64[0] <= value <= _INT64[1]
        else:
            ok = isinstance(value, (int, float, np.integer, np.floating))
        if not ok:
            raise refused_value(self._name, self._serializer, key, value)
        return value


def refused_value(state: str, serializer: str, key: Any, value: Any) -> ConfigurationError:
    """The error for a value that a number state's serializer cannot write."""
    return ConfigurationError(
        f"keyed state {state!r} declares serializer {serializer!r}; key "
        f"{key!r} was given {value!r} ({type(value).__name__}), which it cannot hold"
    )
