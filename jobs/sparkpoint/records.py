"""Batches of records: the unit that moves between operators, columnar where it can be.

A :class:`Batch` holds either columns (name -> numpy array or :class:`DictColumn`, all the
same length), which the built-in operators process without a Python call per record, or a
list of rows (any Python objects), which user functions receive one at a time. Conversions
happen only where an operator needs the other form.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np


class DictColumn:
    """A dictionary-encoded column (Arrow's ``DictionaryArray``): int32 codes into values.

    Record ``i`` is ``values[codes[i]]``. ``values`` is usually small (the distinct keys of a
    batch), so hashing, grouping and serializing touch each distinct value once and the rest is
    integer work over ``codes``. It behaves like a 1-D numpy array where a :class:`Batch` uses
    its columns (``len``, indexing, ``nbytes``, ``tolist``, ``dtype``); ``np.asarray`` and
    :meth:`decode` give the plain array. Comparing with ``==``/``!=`` is elementwise, as numpy.
    """

    __slots__ = ("codes", "values")

    codes: np.ndarray
    values: np.ndarray

    def __init__(self, codes: np.ndarray | Sequence[int], values: np.ndarray | Sequence[Any]):
        codes_arr = np.asarray(codes)
        values_arr = np.asarray(values)
        if codes_arr.ndim != 1 or values_arr.ndim != 1:
            raise ValueError("a DictColumn needs 1-D codes and 1-D values")
        if codes_arr.size and codes_arr.dtype.kind not in "iu":
            raise TypeError(f"DictColumn codes must be integers, got dtype {codes_arr.dtype}")
        if codes_arr.size and (codes_arr.min() < 0 or codes_arr.max() >= len(values_arr)):
            raise ValueError(
                f"DictColumn codes must lie in [0, {len(values_arr)}) (the number of values)"
            )
        self.codes = codes_arr.astype(np.int32, copy=False)
        self.values = values_arr

    @classmethod
    def _of(cls, codes: np.ndarray, values: np.ndarray) -> DictColumn:
        """A column from codes already checked against ``values`` (no validation pass)."""
        col = cls.__new__(cls)
        col.codes = codes
        col.values = values
        return col

    @classmethod
    def encode(cls, array: np.ndarray | Sequence[Any]) -> DictColumn:
        """Dictionary-encode a plain array (``numpy.unique``: sorts, so O(n log n))."""
        values, codes = np.unique(np.asarray(array), return_inverse=True)
        return cls(codes.reshape(-1), values)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dtype of the decoded values."""
        return self.values.dtype

    @property
    def shape(self) -> tuple[int]:
        return (len(self.codes),)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def size(self) -> int:
        return len(self.codes)

    @property
    def nbytes(self) -> int:
        """Bytes held: the codes and the values (shared values count in every column)."""
        return int(self.codes.nbytes + self.values.nbytes)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, index: Any) -> Any:
        """One value for an integer index; a DictColumn sharing ``values`` for anything else."""
        if isinstance(index, (int, np.integer)):
            return self.values[self.codes[index]]
        codes = self.codes[index]
        if codes.ndim != 1:
            raise IndexError("indexing a DictColumn must give a 1-D selection")
        return DictColumn._of(codes, self.values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values[self.codes])

    def tolist(self) -> list[Any]:
        """The decoded records as Python objects (equal values share one object)."""
        return list(map(self.values.tolist().__getitem__, self.codes.tolist()))

    def decode(self) -> np.ndarray:
        """The plain array ``values[codes]``."""
        return self.values[self.codes]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a DictColumn cannot be read as an array without decoding (a copy)")
        decoded = self.decode()
        return decoded if dtype is None else decoded.astype(dtype, copy=False)

    def _compare(self, other: Any, equal: bool) -> np.ndarray:
        if np.ndim(other):
            result = np.asarray(self.decode() == np.asarray(other), dtype=bool)
        else:  # a scalar: compare the values once, then index by codes
            per_value = np.asarray(self.values == other, dtype=bool)
            if per_value.ndim == 0:
                per_value = np.full(len(self.values), bool(per_value))
            result = per_value[self.codes]
        return result if equal else ~result

    def __eq__(self, other: object) -> Any:
        return self._compare(other, True)

    def __ne__(self, other: object) -> Any:
        return self._compare(other, False)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray, np.ndarray]]:
        # Codes and the values they use only (a selection, such as one target's share of a
        # batch in the exchange, shares all its batch's values); ASCII str values as one byte
        # per character, not four.
        codes, values = _used(self.codes, self.values)
        narrow = ascii_bytes(values)
        if narrow is not None:
            return (_dict_column_ascii, (codes, narrow))
        return (_dict_column, (codes, values))

    def __repr__(self) -> str:
        return f"DictColumn({len(self)} records, {len(self.values)} values, dtype={self.dtype})"


def object_array(items: list[Any]) -> np.ndarray:
    """``items`` as a 1-D object array, each element as it is (``np.array`` would turn
    ``[1, "x"]`` into strings and tuples into rows)."""
    return np.fromiter(items, dtype=object, count=len(items))


def _dict_column(codes: np.ndarray, values: np.ndarray) -> DictColumn:
    """Rebuild a pickled :class:`DictColumn` (its codes were checked when it was made)."""
    return DictColumn._of(codes, values)


def _used(codes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``codes`` and ``values`` of the same records, without the values no code uses
    (those kept in their order): O(codes + values), no sort."""
    used = np.zeros(len(values), dtype=bool)
    used[codes] = True
    if used.all():
        return codes, values
    renumbered = np.cumsum(used, dtype=np.int64) - 1
    return renumbered[codes].astype(codes.dtype, copy=False), values[used]


def ascii_bytes(values: np.ndarray) -> np.ndarray | None:
    """A ``U`` array whose characters are all ASCII as an ``S`` array of the same width (a
    quarter of the bytes to pickle and ship; a byte per character), else None (also for an
    empty or zero-width array). Both pad with NULs alike; :func:`str_of_ascii` undoes it."""
    width = values.dtype.itemsize // 4
    if values.dtype.kind != "U" or not values.size or not width:
        return None
    points = np.ascontiguousarray(values).view(np.uint32).reshape(-1, width)
    if int(points.max()) >= 0x80:
        return None
    return points.astype(np.uint8).view(f"S{width}").reshape(-1)


def str_of_ascii(narrow: np.ndarray) -> np.ndarray:
    """An ``S`` array of ASCII text as a ``U`` array of the same width (str again)."""
    width = narrow.dtype.itemsize
    points = np.ascontiguousarray(narrow).view(np.uint8).reshape(-1, width).astype(np.uint32)
    return points.view(f"U{width}").reshape(-1)


def _dict_column_ascii(codes: np.ndarray, narrow: np.ndarray) -> DictColumn:
    """Rebuild a :class:`DictColumn` pickled with :func:`ascii_bytes` values (str again)."""
    return DictColumn._of(codes, str_of_ascii(narrow))


@functools.lru_cache(maxsize=256)
def _row_maker(names: tuple[str, ...]) -> Callable[..., dict[str, Any]]:
    """A function of one value per field of ``names`` that returns the record as a dict: a
    dict display compiled for these names, which makes a row in about half the time of
    ``dict(zip(names, values))`` (no zip, no pairs; a million rows of three fields take about
    0.5 s against 1.0 s here). Each name is written as its ``repr``, a str literal."""
    params = ", ".join(f"_{i}" for i in range(len(names)))
    fields = ", ".join(f"{name!r}: _{i}" for i, name in enumerate(names))
    return eval(f"lambda {params}: {{{fields}}}")  # only str literals and parameter names


#: A column of a columnar :class:`Batch`.
Column = np.ndarray | DictColumn


class Batch:
    """A sequence of records, columnar (``columns``) or row-wise (``rows``)."""

    __slots__ = ("_columns", "_rows")

    def __init__(
        self, *, columns: dict[str, Column] | None = None, rows: list[Any] | None = None
    ) -> None:
        if (columns is None) == (rows is None):
            raise ValueError("a Batch has exactly one of columns or rows")
        if columns is not None:
            lengths = {len(col) for col in columns.values()}
            if len(lengths) > 1:
                raise ValueError(f"columns of one batch differ in length: {sorted(lengths)}")
        self._columns = columns
        self._rows = rows

    @classmethod
    def of_rows(cls, rows: Iterable[Any]) -> Batch:
        return cls(rows=list(rows))

    @classmethod
    def of_columns(cls, **columns: Column) -> Batch:
        return cls(columns=dict(columns))

    @property
    def is_columnar(self) -> bool:
        return self._columns is not None

    @property
    def columns(self) -> dict[str, Column]:
        """The columns; row batches of dicts are converted (once)."""
        if self._columns is None:
            rows = self._rows or []
            names = list(rows[0].keys()) if rows and isinstance(rows[0], dict) else []
            if not names and rows:
                raise TypeError("only batches of dict records can be read as columns")
            return {name: np.array([r[name] for r in rows]) for name in names}
        return self._columns

    @property
    def rows(self) -> list[Any]:
        """The records as Python objects (columnar batches become dicts)."""
        if self._rows is None:
            return list(self.iter_rows())
        return self._rows

    def iter_rows(self) -> Iterator[Any]:
        """The records one at a time, as :attr:`rows` lists them: a columnar batch's dicts
        are made as they are asked for (each can be freed before the next is made)."""
        if self._rows is not None:
            return iter(self._rows)
        cols = self._columns or {}
        names = tuple(cols)
        as_lists = [cols[n].tolist() for n in names]
        if names and all(type(name) is str for name in names):
            return map(_row_maker(names), *as_lists)
        return (dict(zip(names, values, strict=True)) for values in zip(*as_lists, strict=True))

    def column(self, name: str) -> Column:
        """One field of every record as an array (a :class:`DictColumn` stays encoded)."""
        if self._columns is not None:
            try:
                return self._columns[name]
            except KeyError:
                raise KeyError(
                    f"records have no field {name!r} (fields: {sorted(self._columns)})"
                ) from None
        try:
            return np.array([r[name] for r in self._rows or []])
        except (KeyError, TypeError, IndexError) as err:
            raise KeyError(f"records have no field {name!r}") from err

    def to_arrow(self) -> Any:
        """The records as a ``pyarrow.Table``: a :class:`DictColumn` as a dictionary array
        (not decoded), numbers without a copy where the dtype allows, a row batch of dicts
        through its fields (:func:`sparkpoint.arrow_batches.batch_to_arrow`)."""
        from sparkpoint.arrow_batches import batch_to_arrow

        return batch_to_arrow(self)

    @classmethod
    def from_arrow(cls, data: Any) -> Batch:
        """A columnar batch of a ``pyarrow.Table`` or ``RecordBatch``: dictionary arrays as
        :class:`DictColumn`, numbers without a copy where possible, strings as ``str`` arrays;
        nulls refused (:func:`sparkpoint.arrow_batches.batch_from_arrow`)."""
        from sparkpoint.arrow_batches import batch_from_arrow

        return batch_from_arrow(data)

    def select(self, fields: frozenset[str]) -> Batch:
        """Only the columns named in ``fields``, in this batch's order: what an exchange ships
        to an operator that reads no other field (column pruning). This batch itself when it
        is row-wise, has no other column, or lacks one of ``fields`` (the reader's error then
        lists every field the records have)."""
        cols = self._columns
        if cols is None or not fields <= cols.keys() or len(cols) == len(fields):
            return self
        return Batch(columns={name: col for name, col in cols.items() if name in fields})

    def take(self, indices: np.ndarray | Sequence[int]) -> Batch:
        """The records at ``indices``, in that order."""
        if self._columns is not None:
            return Batch(columns={k: v[indices] for k, v in self._columns.items()})
        rows = self._rows or []
        return Batch(rows=[rows[i] for i in indices])

    def __len__(self) -> int:
        if self._columns is not None:
            return len(next(iter(self._columns.values()))) if self._columns else 0
        return len(self._rows or [])

    @property
    def nbytes(self) -> int:
        """Approximate size in memory (exact for numeric columns)."""
        if self._columns is not None:
            return int(sum(col.nbytes for col in self._columns.values()))
        rows = self._rows or []
        if not rows:
            return 0
        # Sample-based estimate: rows of one batch have one shape.
        sample = rows[: min(len(rows), 16)]
        per_row = sum(len(repr(r)) for r in sample) / len(sample)
        return int(per_row * len(rows))

    def __repr__(self) -> str:
        form = f"columns={sorted(self._columns)}" if self._columns is not None else "rows"
        return f"Batch({len(self)} records, {form})"
