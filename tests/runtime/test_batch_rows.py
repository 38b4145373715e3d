"""A columnar batch's records as dicts: :attr:`Batch.rows` and :meth:`Batch.iter_rows`, which
the per-record operators (map, filter, flat_map, process) read."""

from __future__ import annotations

import numpy as np

from sparkpoint.records import Batch, DictColumn


def _dicts(columns: dict, count: int) -> list[dict]:
    return [{name: column[i] for name, column in columns.items()} for i in range(count)]


def test_rows_of_columns_are_the_records_as_dicts() -> None:
    apps = DictColumn(np.array([1, 0, 1], dtype=np.int32), np.array(["x", "y"]))
    batch = Batch.of_columns(app_id=apps, n=np.array([1, 2, 3]), ok=np.array([True, False, True]))
    expected = [
        {"app_id": "y", "n": 1, "ok": True},
        {"app_id": "x", "n": 2, "ok": False},
        {"app_id": "y", "n": 3, "ok": True},
    ]
    assert batch.rows == expected
    assert list(batch.iter_rows()) == expected
    assert all(type(row["n"]) is int for row in batch.rows)  # Python values, not numpy's


def test_field_names_that_are_not_identifiers() -> None:
    """Names are written into the compiled row maker as literals: quotes, backslashes,
    braces, spaces, non-ASCII and names of Python keywords come out as they went in."""
    names = ["a b", "it's", 'say "hi"', "back\\slash", "{x}", "lambda", "naïve", "_0", ""]
    columns = {name: np.arange(i, i + 2) for i, name in enumerate(names)}
    batch = Batch(columns=columns)
    assert batch.rows == _dicts(columns, 2)
    assert list(batch.rows[0]) == names  # in the columns' order


def test_names_that_are_not_str_and_empty_batches() -> None:
    columns = {1: np.array([5, 6]), (2, "x"): np.array(["p", "q"])}
    assert Batch(columns=columns).rows == [{1: 5, (2, "x"): "p"}, {1: 6, (2, "x"): "q"}]
    assert Batch.of_columns(a=np.array([], dtype=np.int64)).rows == []
    assert Batch(columns={}).rows == []
    rows = [{"a": 1}, "not a dict"]
    assert list(Batch.of_rows(rows).iter_rows()) == rows
