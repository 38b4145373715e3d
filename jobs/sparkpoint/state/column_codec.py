"""Whole columns of keys and values to and from their canonical bytes.

The column-wise halves of :func:`~sparkpoint.state.serializers.encode_key`,
:func:`~sparkpoint.state.serializers.encode_value` and their decoders, shared by canonical
snapshots (:mod:`sparkpoint.state.canonical_codec`), working-state deltas and the RocksDB
tables: the same bytes as the one-by-one functions, with one call per column where the
types allow.
"""

from __future__ import annotations

import operator
import pickle
import struct
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np

from sparkpoint.state.backend import DELETED
from sparkpoint.state.serializers import (
    Float64Serializer,
    Int64Serializer,
    PickleSerializer,
    TypeSerializer,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

# Serializers of 8-byte values: their struct format and numpy dtype.
_FIXED = {Int64Serializer: ("<q", "<i8"), Float64Serializer: ("<d", "<f8")}
# encode_key's tag of a str key.
_STR_TAG = 3


def encode_keys(keys: Sequence[Any]) -> list[bytes]:
    """:func:`~sparkpoint.state.serializers.encode_key` of every key (str keys at once)."""
    types = set(map(type, keys))
    if types == {str}:
        return [b"\x03" + key.encode("utf-8", "surrogatepass") for key in keys]
    if types == {bytes}:
        return [b"\x04" + key for key in keys]
    return list(map(encode_key, keys))


def encode_values(kind: str, serializer: TypeSerializer, values: Sequence[Any]) -> list[Any]:
    """:func:`~sparkpoint.state.serializers.encode_value` of every value, None for a
    ``DELETED`` one."""
    if any(map(operator.is_, values, repeat(DELETED))):
        return [None if v is DELETED else encode_value(kind, serializer, v) for v in values]
    if kind != "value":
        return [encode_value(kind, serializer, v) for v in values]
    if type(serializer) is PickleSerializer:
        return list(map(pickle.dumps, values, repeat(5)))
    fixed = _FIXED.get(type(serializer))
    if fixed is not None:
        return list(map(struct.Struct(fixed[0]).pack, values))
    return list(map(serializer.serialize, values))


def str_keys_fixed(keys: Sequence[Any]) -> np.ndarray | None:
    """:func:`encode_keys` as one fixed-width bytes array (``S``, each the tag byte and the
    key's ASCII), when every key is an ASCII str and none ends in NUL (which a numpy array
    drops); else None. The bytes of key ``i`` are its element: no element ends in NUL.
    """
    strings = ascii_strings(keys)
    return None if strings is None else tagged_str_keys(strings)


def ascii_strings(keys: Sequence[Any], array: np.ndarray | None = None) -> np.ndarray | None:
    """Keys as a ``U`` array when every one is a str, ASCII, and none ends in NUL (which the
    array would drop); else None. ``array``: the keys as a ``U`` array already."""
    if not keys or set(map(type, keys)) != {str}:
        return None
    if array is None or array.dtype.kind != "U" or len(array) != len(keys):
        array = np.array(keys, dtype=str)
    strings = array
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    if not np.array_equal(np.strings.str_len(strings), lengths):
        return None
    if int(strings.view(np.uint32).max()) >= 0x80:
        return None
    return strings


def tagged_str_keys(strings: np.ndarray) -> np.ndarray:
    """:func:`encode_keys` of the strings of an :func:`ascii_strings` array, fixed-width."""
    width = strings.dtype.itemsize // 4
    tagged = np.empty((len(strings), width + 1), dtype=np.uint8)
    tagged[:, 0] = _STR_TAG
    tagged[:, 1:] = strings.view(np.uint32).reshape(len(strings), width)
    return tagged.view(f"S{width + 1}").reshape(-1)


def decode_keys(keys: Sequence[bytes]) -> list[Any]:
    """:func:`~sparkpoint.state.serializers.decode_key` of every key (str keys at once)."""
    if set(map(operator.itemgetter(0), keys)) == {3}:
        return [key[1:].decode("utf-8", "surrogatepass") for key in keys]
    return list(map(decode_key, keys))


def decode_values(kind: str, serializer: TypeSerializer, values: Sequence[Any]) -> list[Any]:
    """:func:`~sparkpoint.state.serializers.decode_value` of every value, ``DELETED`` for
    None."""
    if None in values:
        return [DELETED if v is None else decode_value(kind, serializer, v) for v in values]
    if kind != "value":
        return [decode_value(kind, serializer, v) for v in values]
    if type(serializer) is PickleSerializer:
        return list(map(pickle.loads, values))
    fixed = _FIXED.get(type(serializer))
    if fixed is not None and set(map(len, values)) == {8}:
        return np.frombuffer(b"".join(values), dtype=fixed[1]).tolist()
    return [decode_value(kind, serializer, v) for v in values]
