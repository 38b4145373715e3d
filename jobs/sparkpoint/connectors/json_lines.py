"""JSON lines of a columnar batch assembled in numpy, when every field's text is plain ASCII.

A line is the same template for every record, ``{"app_id": <text>, "pv": <text>}``, with one
text per column: an integer's digits, ``true``/``false``, or a string in quotes. When every
string is ASCII with nothing to escape, each column's texts fit one fixed-width bytes array
with a length per record, so the lines are laid out as one byte matrix (the template's
constant pieces and each column's texts side by side, one row per record) and the bytes of
the output are that matrix's cells that hold a character, row after row. No Python object
is made per record. Anything else (floats, objects, strings to escape) is left to the
caller, which writes the same text record by record.
"""

from __future__ import annotations

import json

import numpy as np

from sparkpoint.records import Batch, Column, DictColumn

# Texts of one column: a uint8 row per record, and the columns [start, end) of each row
# that hold the text.
_Texts = tuple[np.ndarray, np.ndarray, np.ndarray]

# Characters that json.dumps writes as they are (ensure_ascii): printable ASCII but " and \.
_PLAIN_LOW, _PLAIN_HIGH = 0x20, 0x7E
_QUOTE, _BACKSLASH = 0x22, 0x5C


def _texts(column: Column) -> _Texts | None:
    """The JSON text of every record of ``column`` (see :data:`_Texts`), or None when one
    is not plain ASCII."""
    if isinstance(column, DictColumn):
        found = _plain_texts(column.values)
        if found is None:
            return None
        cells, start, end = found
        codes = column.codes
        return cells[codes], start[codes], end[codes]
    return _plain_texts(column)


def _plain_texts(values: np.ndarray) -> _Texts | None:
    kind = values.dtype.kind
    if kind in "iu":
        return _int_texts(values)
    if kind == "b":
        words = np.where(values, b"true", b"false").astype("S5")
        cells = words.view(np.uint8).reshape(len(values), 5)
        return cells, np.zeros(len(values), dtype=np.int64), np.where(values, 4, 5)
    if kind != "U":
        return None
    width = values.dtype.itemsize // 4
    points = np.ascontiguousarray(values).view(np.uint32).reshape(len(values), width)
    lengths = np.strings.str_len(values).astype(np.int64)
    inside = np.arange(width) < lengths[:, None]
    plain = (points >= _PLAIN_LOW) & (points <= _PLAIN_HIGH)
    plain &= (points != _QUOTE) & (points != _BACKSLASH)
    if not (plain | ~inside).all():
        return None
    cells = np.zeros((len(values), width + 2), dtype=np.uint8)
    cells[:, 1 : width + 1] = points
    cells[:, 0] = _QUOTE
    cells[np.arange(len(values)), lengths + 1] = _QUOTE
    return cells, np.zeros(len(values), dtype=np.int64), lengths + 2


def _int_texts(values: np.ndarray) -> _Texts:
    """Decimal digits (and a minus sign) of integers, right-aligned, a digit position at a
    time for every record: as many numpy steps as the longest number has digits."""
    negative = values < 0 if values.dtype.kind == "i" else np.zeros(len(values), dtype=bool)
    magnitude = values.astype(np.uint64)
    magnitude = np.where(negative, np.uint64(0) - magnitude, magnitude)
    digits = np.searchsorted(_POWERS, magnitude, side="right").astype(np.int64) + 1
    width = int(digits.max()) + 1
    cells = np.empty((len(values), width), dtype=np.uint8)
    for place in range(1, width):  # the units digit in the last column
        cells[:, width - place] = magnitude % np.uint64(10)
        magnitude //= np.uint64(10)
    cells += ord("0")
    start = width - digits - negative
    cells[np.flatnonzero(negative), start[negative]] = ord("-")
    return cells, start, np.full(len(values), width)


# 10**1 .. 10**19: a magnitude has one digit more than the powers it reaches.
_POWERS = np.array([10**k for k in range(1, 20)], dtype=np.uint64)


def ascii_json_lines(batch: Batch) -> str | None:
    """``format_json_lines`` of a columnar batch whose field texts are all plain ASCII
    (integers, bools, strings with nothing to escape, field names alike); None otherwise."""
    records = len(batch)
    names = [json.dumps(name) for name in batch.columns]
    if not records or not all(name.isascii() for name in names):
        return None
    pieces: list[bytes | _Texts] = []  # the template's constant text between the fields
    for i, (name, column) in enumerate(zip(names, batch.columns.values(), strict=True)):
        texts = _texts(column)
        if texts is None:
            return None
        pieces += [(("{" if i == 0 else ", ") + name + ": ").encode("ascii"), texts]
    pieces.append(b"}\n")
    widths = [len(piece) if isinstance(piece, bytes) else piece[0].shape[1] for piece in pieces]
    matrix = np.empty((records, sum(widths)), dtype=np.uint8)
    used = np.empty(matrix.shape, dtype=bool)
    offset = 0
    for piece, width in zip(pieces, widths, strict=True):
        part = slice(offset, offset + width)
        if isinstance(piece, bytes):
            matrix[:, part] = np.frombuffer(piece, dtype=np.uint8)
            used[:, part] = True
        else:
            cells, start, end = piece
            matrix[:, part] = cells
            columns = np.arange(width)
            np.logical_and(columns >= start[:, None], columns < end[:, None], out=used[:, part])
        offset += width
    return matrix[used].tobytes().decode("ascii")


__all__ = ["ascii_json_lines"]
