"""How keyed state is written to bytes: named value serializers and the key codec.

Flink's ``TypeSerializer``: every state descriptor declares how its values become bytes, and
the snapshot records the serializer's *name* beside the state so that a restore uses the same
one (or refuses with the name). The serializers are:

- ``pickle`` — any Python object (the default, as Flink falls back to Kryo for types it does
  not know); a checkpoint or savepoint of pickled values is only as portable as the classes
  they reference, and unpickling runs code: read snapshots only from storage you trust;
- ``json`` — JSON values (None, bool, int, float, str, lists, dicts with str keys);
- ``int64`` — integers in [-2^63, 2^63), 8 bytes little endian;
- ``float64`` — floats, 8 bytes;
- ``utf8`` — str;
- ``bytes`` — bytes as is.

Keys (the record's key, and the user keys of a map state) go through :func:`encode_key`, a
deterministic encoding in which keys that compare equal as dict keys (``1``, ``1.0`` and
``True``) encode to the same bytes, so a RocksDB lookup finds what a dict lookup finds; ints,
strings, bytes and tuples of them sort by value within their type.
"""

from __future__ import annotations

import abc
import json
import math
import pickle
import struct
from typing import Any

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError


class TypeSerializer(abc.ABC):
    """Turns the values of a state into bytes and back; ``name`` is kept in snapshots."""

    name: str

    @abc.abstractmethod
    def serialize(self, value: Any) -> bytes: ...

    @abc.abstractmethod
    def deserialize(self, data: bytes) -> Any: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PickleSerializer(TypeSerializer):
    name = "pickle"

    def serialize(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=5)

    def deserialize(self, data: bytes) -> Any:
        return pickle.loads(data)


class JsonSerializer(TypeSerializer):
    name = "json"

    def serialize(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), allow_nan=True).encode()

    def deserialize(self, data: bytes) -> Any:
        return json.loads(data)


class Int64Serializer(TypeSerializer):
    name = "int64"

    def serialize(self, value: Any) -> bytes:
        return struct.pack("<q", value)

    def deserialize(self, data: bytes) -> Any:
        return struct.unpack("<q", data)[0]


class Float64Serializer(TypeSerializer):
    name = "float64"

    def serialize(self, value: Any) -> bytes:
        return struct.pack("<d", value)

    def deserialize(self, data: bytes) -> Any:
        return struct.unpack("<d", data)[0]


class Utf8Serializer(TypeSerializer):
    name = "utf8"

    def serialize(self, value: Any) -> bytes:
        return value.encode()

    def deserialize(self, data: bytes) -> Any:
        return bytes(data).decode()


class BytesSerializer(TypeSerializer):
    name = "bytes"

    def serialize(self, value: Any) -> bytes:
        return bytes(value)

    def deserialize(self, data: bytes) -> Any:
        return bytes(data)


PICKLE = PickleSerializer()
SERIALIZERS: dict[str, TypeSerializer] = {
    s.name: s
    for s in (
        PICKLE,
        JsonSerializer(),
        Int64Serializer(),
        Float64Serializer(),
        Utf8Serializer(),
        BytesSerializer(),
    )
}


def serializer_named(name: str, where: str = "a snapshot") -> TypeSerializer:
    """The serializer called ``name``; ``where`` names what asked, for the error.

    Raises:
        CorruptSnapshotError: no serializer has that name.
    """
    try:
        return SERIALIZERS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(SERIALIZERS))
        raise CorruptSnapshotError(
            f"{where} names state serializer {name!r}, which this version of Sparkpoint does "
            f"not have (known: {known})"
        ) from None


def serializer_of(descriptor: Any) -> TypeSerializer:
    """The serializer a state descriptor declares (``pickle`` when it declares none).

    Raises:
        ConfigurationError: the descriptor names an unknown serializer.
    """
    chosen = getattr(descriptor, "serializer", None)
    if chosen is None:
        return PICKLE
    if isinstance(chosen, TypeSerializer):
        return chosen
    if isinstance(chosen, str) and chosen in SERIALIZERS:
        return SERIALIZERS[chosen]
    known = ", ".join(sorted(SERIALIZERS))
    raise ConfigurationError(
        f"state {descriptor.name!r} declares serializer {chosen!r}; use one of {known} "
        "or a TypeSerializer"
    )


# ----------------------------------------------------------------------------- keys

_NONE, _FALSE_TRUE_INT, _FLOAT, _STR, _BYTES, _TUPLE, _PICKLED = (
    bytes([tag]) for tag in (0, 1, 2, 3, 4, 5, 0x7F)
)


_SHORT = 0x7E  # magnitudes up to this many bytes have their length in the first byte


def _int_bytes(value: int) -> bytes:
    """Sortable encoding of any int: a sign-and-length byte, then the big-endian magnitude
    (negative ints inverted); magnitudes over 126 bytes have the byte 0xFF (0x00 when
    negative) and a 4-byte length first."""
    mag = abs(value)
    body = mag.to_bytes((mag.bit_length() + 7) // 8 or 1, "big")
    if value >= 0:
        if len(body) <= _SHORT:
            return bytes([0x80 + len(body)]) + body
        return b"\xff" + struct.pack(">I", len(body)) + body
    inverted = bytes(255 - b for b in body)
    if len(body) <= _SHORT:
        return bytes([0x7F - len(body)]) + inverted
    return b"\x00" + struct.pack(">I", 0xFFFFFFFF - len(body)) + inverted


def encode_key(key: Any) -> bytes:
    """A deterministic encoding of ``key`` (see the module docstring).

    Raises:
        ConfigurationError: a key that can be neither encoded nor pickled.
    """
    if key is None:
        return _NONE
    if isinstance(key, bool | int):
        return _FALSE_TRUE_INT + _int_bytes(int(key))
    if isinstance(key, float):
        if math.isfinite(key) and key.is_integer():
            return _FALSE_TRUE_INT + _int_bytes(int(key))
        return _FLOAT + struct.pack(">d", key)
    if isinstance(key, str):
        return _STR + key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return _BYTES + key
    if isinstance(key, tuple):
        parts = [encode_key(item) for item in key]
        return _TUPLE + b"".join(struct.pack(">I", len(part)) + part for part in parts)
    if hasattr(key, "item") and callable(key.item):  # a numpy scalar
        return encode_key(key.item())
    try:
        return _PICKLED + pickle.dumps(key, protocol=5)
    except Exception as err:
        raise ConfigurationError(f"key {key!r} cannot be encoded for keyed state: {err}") from err


def decode_key(data: bytes) -> Any:
    """The key :func:`encode_key` encoded.

    Raises:
        CorruptSnapshotError: bytes that no key encodes to.
    """
    data = bytes(data)
    tag, body = data[:1], data[1:]
    try:
        if tag == _NONE:
            return None
        if tag == _FALSE_TRUE_INT:
            head = body[0]
            if head == 0xFF:
                return int.from_bytes(body[5:], "big")
            if head == 0x00:
                return -int.from_bytes(bytes(255 - b for b in body[5:]), "big")
            length = head - 0x80 if head >= 0x80 else 0x7F - head
            mag = body[1 : 1 + length]
            if head >= 0x80:
                return int.from_bytes(mag, "big")
            return -int.from_bytes(bytes(255 - b for b in mag), "big")
        if tag == _FLOAT:
            return struct.unpack(">d", body)[0]
        if tag == _STR:
            return body.decode("utf-8", "surrogatepass")
        if tag == _BYTES:
            return body
        if tag == _TUPLE:
            items, pos = [], 0
            while pos < len(body):
                (n,) = struct.unpack_from(">I", body, pos)
                items.append(decode_key(body[pos + 4 : pos + 4 + n]))
                pos += 4 + n
            return tuple(items)
        if tag == _PICKLED:
            return pickle.loads(body)
    except CorruptSnapshotError:
        raise
    except Exception as err:
        raise CorruptSnapshotError(f"a stored key cannot be decoded: {err!r}") from err
    raise CorruptSnapshotError(f"a stored key starts with unknown tag {tag!r}")


# ----------------------------------------------------------------------------- values by kind


def _frame(parts: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(part)) + part for part in parts)


def _unframe(data: bytes) -> list[bytes]:
    parts, pos, view = [], 0, memoryview(data)
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptSnapshotError("a stored state value is truncated")
        (n,) = struct.unpack_from("<I", view, pos)
        if pos + 4 + n > len(view):
            raise CorruptSnapshotError("a stored state value is truncated")
        parts.append(bytes(view[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    return parts


def encode_value(kind: str, serializer: TypeSerializer, value: Any) -> bytes:
    """The bytes of one key's value of a ``kind`` state: the serialized value; for a list
    state each element serialized; for a map state each user key (:func:`encode_key`) and
    its serialized value; elements length-prefixed (4 bytes little endian)."""
    if kind == "value":
        return serializer.serialize(value)
    if kind == "list":
        return _frame([serializer.serialize(v) for v in value])
    parts: list[bytes] = []
    for user_key, user_value in value.items():
        parts.append(encode_key(user_key))
        parts.append(serializer.serialize(user_value))
    return _frame(parts)


def decode_value(kind: str, serializer: TypeSerializer, data: bytes) -> Any:
    """The value :func:`encode_value` encoded.

    Raises:
        CorruptSnapshotError: bytes that do not decode (the serializer's error included).
    """
    try:
        if kind == "value":
            return serializer.deserialize(data)
        parts = _unframe(data)
        if kind == "list":
            return [serializer.deserialize(p) for p in parts]
        if len(parts) % 2:
            raise CorruptSnapshotError("a stored map state value has a key without a value")
        return {
            decode_key(parts[i]): serializer.deserialize(parts[i + 1])
            for i in range(0, len(parts), 2)
        }
    except CorruptSnapshotError:
        raise
    except Exception as err:
        raise CorruptSnapshotError(
            f"a stored {kind} state value does not decode with serializer "
            f"{serializer.name!r}: {err!r}"
        ) from err
