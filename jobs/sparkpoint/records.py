"""Batches of records: the unit that moves between operators, columnar where it can be.

A :class:`Batch` holds either columns (name -> numpy array, all the same length), which the
built-in operators process without a Python call per record, or a list of rows (any Python
objects), which user functions receive one at a time. Conversions happen only where an
operator needs the other form.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


class Batch:
    """A sequence of records, columnar (``columns``) or row-wise (``rows``)."""

    __slots__ = ("_columns", "_rows")

    def __init__(
        self, *, columns: dict[str, np.ndarray] | None = None, rows: list[Any] | None = None
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
    def of_columns(cls, **columns: np.ndarray) -> Batch:
        return cls(columns=dict(columns))

    @property
    def is_columnar(self) -> bool:
        return self._columns is not None

    @property
    def columns(self) -> dict[str, np.ndarray]:
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
            cols = self._columns or {}
            names = list(cols)
            as_lists = [cols[n].tolist() for n in names]
            return [dict(zip(names, values, strict=True)) for values in zip(*as_lists, strict=True)]
        return self._rows

    def column(self, name: str) -> np.ndarray:
        """One field of every record as an array."""
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
