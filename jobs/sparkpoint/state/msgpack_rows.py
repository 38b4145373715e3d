"""The blocks of a canonical snapshot body assembled with numpy: the same bytes as
``msgpack.packb(rows, use_bin_type=True)`` gives for each block of rows
``(state index, key bytes, value bytes or None)``, without a Python object per row.

A block is a msgpack array of rows; a row an array of three: a positive fixint (the state's
index, under 128), a bin (the key) and a bin or nil (the value). Each of these has a header
whose width follows the length (fixarray / array 16 / array 32; bin 8 / 16 / 32), so every
row's length and offset are known before a byte is written: the headers are set by index,
and the keys' and values' bytes copied in one scatter each.
"""

from __future__ import annotations

import numpy as np

__all__ = ["concatenated", "pack_blocks"]

_MAX_FIXINT = 127
_SCATTER_BYTES = 4 << 20


def pack_blocks(
    cuts: list[int],
    state_of: np.ndarray,
    key_data: bytes,
    value_data: bytes,
    lengths: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> list[bytes] | None:
    """The msgpack bytes of each block: block i holds rows ``[cuts[i], cuts[i+1])``
    (``cuts`` starts at 0 and ends at the number of rows); row r is ``state_of[r]``, the r-th
    key and the r-th value, whose bytes follow each other in ``key_data`` and ``value_data``
    (a None value has none). ``lengths`` gives, in row order, each key's length, each
    value's (0 for None) and whether the value is None. None when a state index does not fit
    a fixint (the caller packs those with msgpack)."""
    klen, vlen, nil = lengths
    if not len(klen) or int(state_of.max()) > _MAX_FIXINT or int(state_of.min()) < 0:
        return None
    khead = _bin_header_width(klen)
    vhead = np.where(nil, 1, _bin_header_width(vlen))
    counts: np.ndarray = np.diff(np.asarray(cuts, dtype=np.int64))
    ahead = np.where(counts < 16, 1, np.where(counts < 1 << 16, 3, 5))
    row_len = 2 + khead + klen + vhead + vlen
    # Offsets: every row after its block's header and the rows before it.
    block_of = np.repeat(np.arange(len(counts)), counts)
    row_start = np.concatenate(([0], np.cumsum(row_len)[:-1])) + np.cumsum(ahead)[block_of]
    block_start = row_start[np.asarray(cuts[:-1], dtype=np.int64)] - ahead
    total = int(row_start[-1] + row_len[-1])
    buf = np.zeros(total, dtype=np.uint8)
    _put_header(buf, block_start, counts, ahead, (0x90, 0xDC, 0xDD), fix_limit=16)
    buf[row_start] = 0x93
    buf[row_start + 1] = state_of.astype(np.uint8)
    _put_header(buf, row_start + 2, klen, khead, (None, 0xC4, 0xC5, 0xC6))
    key_start = row_start + 2 + khead
    _scatter(buf, key_start, klen, key_data)
    value_head = key_start + klen
    buf[value_head[nil]] = 0xC0
    some = ~nil
    _put_header(buf, value_head[some], vlen[some], vhead[some], (None, 0xC4, 0xC5, 0xC6))
    _scatter(buf, value_head + vhead, vlen, value_data)
    ends = [*block_start[1:].tolist(), total]
    data = buf.tobytes()
    return [data[a:b] for a, b in zip(block_start.tolist(), ends, strict=True)]


def _bin_header_width(lengths: np.ndarray) -> np.ndarray:
    """Bytes of a bin header: 2 (bin 8), 3 (bin 16) or 5 (bin 32)."""
    return np.where(lengths < 1 << 8, 2, np.where(lengths < 1 << 16, 3, 5))


def _put_header(
    buf: np.ndarray,
    at: np.ndarray,
    lengths: np.ndarray,
    widths: np.ndarray,
    markers: tuple[int | None, ...],
    fix_limit: int = 0,
) -> None:
    """Write length headers at ``at``: a fix form (``markers[0] | length``, one byte) below
    ``fix_limit``, else the marker of each width (2: one length byte, 3: two, 5: four)
    followed by the big-endian length. ``markers``: fix, then 8-, 16- and 32-bit (an array
    header has no 8-bit form: ``(fix, 16, 32)``)."""
    if fix_limit:
        fix, sixteen, thirty_two = markers
        eight = None
    else:
        fix, eight, sixteen, thirty_two = markers
    for width in (1, 2, 3, 5):
        chosen = widths == width
        if not chosen.any():
            continue
        where, length = at[chosen], lengths[chosen]
        if width == 1:
            assert fix is not None
            buf[where] = fix | length
            continue
        buf[where] = {2: eight, 3: sixteen, 5: thirty_two}[width]
        for byte in range(width - 1):
            shift = 8 * (width - 2 - byte)
            buf[where + 1 + byte] = (length >> shift) & 0xFF


def _scatter(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, data: bytes) -> None:
    """Copy ``data`` (the pieces, concatenated) so that piece i starts at ``starts[i]``, about
    :data:`_SCATTER_BYTES` at a time (the index array costs 8 bytes per byte copied)."""
    if not data:
        return
    source = np.frombuffer(data, dtype=np.uint8)
    ends = np.cumsum(lengths)
    first = ends - lengths
    a = 0
    while a < len(lengths):
        b = max(int(np.searchsorted(ends, first[a] + _SCATTER_BYTES, side="right")), a + 1)
        lo, hi = int(first[a]), int(ends[b - 1])
        shift = np.repeat(starts[a:b] - first[a:b], lengths[a:b])
        buf[shift + np.arange(lo, hi, dtype=np.int64)] = source[lo:hi]
        a = b


def concatenated(fixed: np.ndarray, lengths: np.ndarray) -> bytes:
    """The first ``lengths[i]`` bytes of each element of a fixed-width ``S`` array, one after
    the other (the array's buffer keeps trailing NUL bytes that its elements drop)."""
    width = fixed.dtype.itemsize
    if width == 0 or not len(fixed):
        return b""
    if bool((lengths == width).all()):
        return fixed.tobytes()
    raw = np.ascontiguousarray(fixed).view(np.uint8).reshape(len(fixed), width)
    return raw[np.arange(width) < lengths[:, None]].tobytes()
