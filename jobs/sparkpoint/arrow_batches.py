"""Arrow interop of batches: a :class:`~sparkpoint.records.Batch` as a ``pyarrow.Table``
and back, so that a ``map_batch`` function can compute with ``pyarrow.compute``.

To Arrow (:func:`batch_to_arrow`): numeric and bool columns become Arrow arrays of the same
type (numbers without a copy when the array is contiguous; Arrow packs bools into bits, so
those are copied); ``str`` arrays become ``string`` arrays (plain ASCII laid out in numpy,
other text through Python ``str``: pyarrow's own conversion of a numpy ``str`` array ends each
text at its first NUL); a :class:`~sparkpoint.records.DictColumn` becomes a
``dictionary<int32, ...>`` array over its codes and values, never decoded; object arrays and
the fields of a row batch's dict records are converted by pyarrow's own type inference.

From Arrow (:func:`batch_from_arrow`), the columns the rest of the runtime consumes, as a
source makes them:

- integer, floating point and bool arrays -> numpy arrays of the same dtype (numbers are
  read-only views of the Arrow buffers, no copy, when the column is one chunk);
- ``string``/``large_string``/``string_view`` -> a fixed-width numpy ``str`` array (``U``):
  what the generator gives, what the exchange's string hashing, the keyed count's grouping
  and the JSON sinks' numpy paths read. Two cases keep an object array of ``str`` instead
  (which the runtime handles too, more slowly): a string that ends in NUL (a ``U`` array
  drops trailing NULs, which would change the value silently), and a column whose longest
  string would make the fixed width cost more than four times the strings as Python
  objects (one long string among many short ones);
- ``binary`` kinds -> an object array of ``bytes`` (a numpy ``S`` array drops trailing NULs);
- ``dictionary`` arrays -> a :class:`~sparkpoint.records.DictColumn` (indices as int32
  codes, the dictionary converted as above, not decoded).

Nulls are refused: a :class:`~sparkpoint.errors.ConfigurationError` names the column and
how many records are null (``pyarrow.compute.fill_null`` or a filter first). A null that
only sits in a dictionary's values and that no record uses is dropped. Other Arrow types
(timestamps, decimals, lists, structs, ...) are refused the same way: cast them first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from sparkpoint.errors import ConfigurationError
from sparkpoint.records import Batch, Column, DictColumn, ascii_bytes, object_array, str_of_ascii

__all__ = ["as_batch", "batch_from_arrow", "batch_to_arrow"]

# A str column stays a fixed-width ``U`` array unless that costs more than this many times
# the strings as Python objects (about _STR_OBJECT_BYTES plus one byte per ASCII character).
_MAX_WIDTH_COST = 4
_STR_OBJECT_BYTES = 56
_INT32_MAX = (1 << 31) - 1


def as_batch(result: Any, uid: str) -> Batch:
    """What a ``map_batch`` function returned, as a :class:`Batch`.

    Args:
        result: a Batch (returned as it is), a ``pyarrow.Table`` or a ``pyarrow.RecordBatch``
            (converted by :func:`batch_from_arrow`).
        uid: the operator, named in errors.

    Raises:
        ConfigurationError: anything else, or an Arrow column that cannot become a column of
            a Batch (the message names the operator and the column).
    """
    if isinstance(result, Batch):
        return result
    if not isinstance(result, (pa.Table, pa.RecordBatch)):
        raise ConfigurationError(
            f"map_batch {uid!r} returned a {type(result).__module__}.{type(result).__qualname__};"
            " return a sparkpoint Batch, a pyarrow.Table or a pyarrow.RecordBatch"
        )
    try:
        return batch_from_arrow(result)
    except ConfigurationError as err:
        raise ConfigurationError(f"map_batch {uid!r}: {err}") from err


# ------------------------------------------------------------------------------- to Arrow


def batch_to_arrow(batch: Batch) -> pa.Table:
    """``batch`` as a ``pyarrow.Table`` (see the module docstring for each column kind).

    Raises:
        ConfigurationError: a row batch whose records are not dicts with the same fields, or
            a column that pyarrow cannot convert (the message names the field).
    """
    if batch.is_columnar:
        columns = batch.columns
        arrays = [_column_to_arrow(name, col) for name, col in columns.items()]
        return pa.Table.from_arrays(arrays, names=list(columns))
    rows = batch.rows
    if not rows:
        return pa.table({})
    if not all(isinstance(row, dict) for row in rows):
        kind = next(type(r) for r in rows if not isinstance(r, dict))
        raise ConfigurationError(
            f"only batches of dict records convert to Arrow, not of {kind.__qualname__}: "
            "map the records to dicts first"
        )
    names = list(rows[0])
    fields = set(names)
    if any(row.keys() != fields for row in rows):
        odd = next(row for row in rows if row.keys() != fields)
        raise ConfigurationError(
            f"records of one batch have different fields: {sorted(fields)} and {sorted(odd)}"
        )
    return pa.Table.from_arrays(
        [_objects_to_arrow(name, [row[name] for row in rows]) for name in names], names=names
    )


def _column_to_arrow(name: str, col: Column) -> pa.Array:
    if isinstance(col, DictColumn):
        values = _plain_to_arrow(name, col.values)
        indices = pa.array(np.ascontiguousarray(col.codes, dtype=np.int32))
        return pa.DictionaryArray.from_arrays(indices, values, safe=False)  # checked codes
    return _plain_to_arrow(name, col)


def _plain_to_arrow(name: str, values: np.ndarray) -> pa.Array:
    if values.ndim != 1:
        raise ConfigurationError(f"field {name!r} is not one value per record: {values.shape}")
    if values.dtype.kind == "U":
        ascii_strings = _ascii_to_arrow(values)
        if ascii_strings is not None:
            return ascii_strings
    if values.dtype.kind in "USO":  # pyarrow's own U and S conversion ends a text at a NUL
        kind = {"U": pa.string(), "S": pa.binary()}.get(values.dtype.kind)
        return _objects_to_arrow(name, values.tolist(), kind)
    try:
        return pa.array(values)
    except (pa.ArrowException, ValueError, TypeError) as err:
        raise ConfigurationError(
            f"field {name!r} (dtype {values.dtype}) cannot be converted to Arrow: {err}"
        ) from err


def _objects_to_arrow(name: str, items: list[Any], kind: pa.DataType | None = None) -> pa.Array:
    """Python objects as an Arrow array of type ``kind``, or of the type pyarrow infers
    (``None`` becomes a null)."""
    try:
        return pa.array(items, type=kind)
    except (pa.ArrowException, ValueError, TypeError) as err:
        raise ConfigurationError(
            f"field {name!r} cannot be converted to Arrow (its values: "
            f"{sorted({type(v).__qualname__ for v in items})}): {err}"
        ) from err


def _ascii_to_arrow(values: np.ndarray) -> pa.Array | None:
    """A ``U`` array of ASCII text as an Arrow ``string`` array, laid out in numpy (a ``U``
    array holds a code point per 4 bytes; ASCII's UTF-8 is one byte per code point); None
    when a character is not ASCII."""
    narrow = ascii_bytes(values)
    if narrow is None:
        return None
    n, width = len(values), narrow.dtype.itemsize
    lengths = np.strings.str_len(values).astype(np.int64)
    total = int(lengths.sum())
    if total > _INT32_MAX:
        return None
    chars = narrow.view(np.uint8).reshape(n, width)
    data = chars.reshape(-1) if total == n * width else chars[np.arange(width) < lengths[:, None]]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


# ----------------------------------------------------------------------------- from Arrow


def batch_from_arrow(data: Any) -> Batch:
    """A ``pyarrow.Table`` or ``pyarrow.RecordBatch`` as a columnar :class:`Batch` (a table
    with rows but no columns: a batch of empty dicts).

    Raises:
        ConfigurationError: not a Table or RecordBatch, two columns of one name, or a column
            with nulls or of a type a Batch has no column for (the message names it).
    """
    if not isinstance(data, (pa.Table, pa.RecordBatch)):
        raise ConfigurationError(
            f"expected a pyarrow.Table or pyarrow.RecordBatch, got {type(data).__qualname__}"
        )
    names = list(data.column_names)
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigurationError(f"Arrow data has more than one column named {twice}")
    if not names:
        return Batch(rows=[{} for _ in range(data.num_rows)]) if data.num_rows else Batch(rows=[])
    columns = {name: _column_from_arrow(name, data.column(i)) for i, name in enumerate(names)}
    return Batch(columns=columns)


def _column_from_arrow(name: str, column: Any) -> Column:
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    null_count = sum(chunk.null_count for chunk in chunks)
    if null_count:
        raise ConfigurationError(
            f"column {name!r} has {null_count} null(s) in {len(column)} records, and a Batch "
            "has no nulls: fill them (pyarrow.compute.fill_null) or drop those records first"
        )
    if not chunks:
        chunks = [pa.array([], type=column.type)]
    parts = [_array_from_arrow(name, chunk) for chunk in chunks]
    return parts[0] if len(parts) == 1 else _joined(parts)


def _array_from_arrow(name: str, array: pa.Array) -> Column:
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _dictionary_from_arrow(name, array)
    return _plain_from_arrow(name, array)


def _plain_from_arrow(name: str, array: pa.Array) -> np.ndarray:
    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return array.to_numpy(zero_copy_only=False)  # a view for numbers without nulls
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _strings_from_arrow(array)
    if pa.types.is_string_view(kind):
        return _strings_from_arrow(array.cast(pa.large_string()))
    if (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or pa.types.is_binary_view(kind)
    ):
        return object_array(array.to_pylist())
    raise ConfigurationError(
        f"column {name!r} is of Arrow type {kind}, which a Batch has no column for: cast it "
        "(integers, floats, bools, strings, binary, or dictionaries of those) or drop it"
    )


def _dictionary_from_arrow(name: str, array: pa.DictionaryArray) -> DictColumn:
    codes = array.indices.to_numpy(zero_copy_only=False)
    dictionary = array.dictionary
    if dictionary.null_count:  # a null value no record uses is dropped; a used one refused
        empty = dictionary.is_null().to_numpy(zero_copy_only=False)
        used = int(np.count_nonzero(empty[codes]))
        if used:
            raise ConfigurationError(
                f"column {name!r} has {used} null(s) (in its dictionary) in {len(array)} "
                "records, and a Batch has no nulls: fill them or drop those records first"
            )
        codes = (np.cumsum(~empty) - 1)[codes]
        dictionary = dictionary.filter(pa.array(~empty))
    values = _plain_from_arrow(name, dictionary)
    return DictColumn(codes.astype(np.int32, copy=False), values)


def _strings_from_arrow(array: pa.Array) -> np.ndarray:
    """A ``string``/``large_string`` array without nulls as a ``U`` array, or an object
    array of ``str`` (see the module docstring for when)."""
    n = len(array)
    if not n:
        return np.empty(0, dtype="U1")
    offset_type = np.int64 if pa.types.is_large_string(array.type) else np.int32
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offset_type)[array.offset : array.offset + n + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(data_buf, dtype=np.uint8)[first:last] if data_buf else np.empty(0, "u1")
    lengths = np.diff(offsets).astype(np.int64)
    last_bytes = data[offsets[1:][lengths > 0] - first - 1]
    if np.any(last_bytes == 0):  # a U array would drop it
        return object_array(array.to_pylist())
    if not data.size or int(data.max()) < 0x80:  # ASCII: a character per byte
        width = max(int(lengths.max()), 1)
        if n * width * 4 > _MAX_WIDTH_COST * (data.size + _STR_OBJECT_BYTES * n):
            return object_array(array.to_pylist())
        chars = np.zeros((n, width), dtype=np.uint8)
        chars[np.arange(width) < lengths[:, None]] = data
        return str_of_ascii(chars.view(f"S{width}").reshape(-1))
    items = array.to_pylist()
    width = max(map(len, items))
    if n * width * 4 > _MAX_WIDTH_COST * (data.size + _STR_OBJECT_BYTES * n):
        return object_array(items)
    return np.array(items, dtype=f"U{width}")


def _joined(parts: Iterable[Column]) -> Column:
    """The columns of several chunks as one: dictionaries side by side (codes shifted; a
    value in two of them appears twice, which grouping merges), plain arrays concatenated
    (through object arrays when their kinds differ)."""
    columns = list(parts)
    if all(isinstance(part, DictColumn) for part in columns):
        dicts = [part for part in columns if isinstance(part, DictColumn)]
        starts = np.cumsum([0, *(len(d.values) for d in dicts[:-1])])
        codes = np.concatenate([d.codes + np.int32(s) for d, s in zip(dicts, starts, strict=True)])
        return DictColumn._of(codes.astype(np.int32), _concatenated([d.values for d in dicts]))
    return _concatenated([np.asarray(part) for part in columns])


def _concatenated(arrays: list[np.ndarray]) -> np.ndarray:
    if len({array.dtype.kind for array in arrays}) > 1:
        arrays = [array.astype(object) for array in arrays]
    return np.concatenate(arrays)
