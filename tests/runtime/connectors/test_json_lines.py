"""JSON lines laid out in numpy are the lines json.dumps writes record by record."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.connectors.json_lines import ascii_json_lines
from sparkpoint.connectors.sinks import format_json_lines
from sparkpoint.records import Batch, DictColumn

_INTS = st.integers(-(2**63), 2**63 - 1)
_TEXT = st.text(st.characters(max_codepoint=0x7F) | st.sampled_from(['"', "\\", "\x00", "é"]))


def _by_record(columns: dict[str, list]) -> str:
    names = list(columns)
    rows = zip(*columns.values(), strict=True)
    return "".join(json.dumps(dict(zip(names, row, strict=True))) + "\n" for row in rows)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.tuples(_INTS, st.booleans(), _TEXT, st.integers(0, 2**64 - 1)), min_size=1),
    encoded=st.booleans(),
)
def test_lines_are_json_dumps_of_each_record(rows: list[tuple], encoded: bool) -> None:
    ints, flags, texts, big = (list(column) for column in zip(*rows, strict=True))
    strings = np.array(texts, dtype=str)
    keys = DictColumn.encode(strings) if encoded else strings
    batch = Batch.of_columns(
        **{"n": np.array(ints, dtype=np.int64), "ok": np.array(flags), 'k"ey': keys},
        u=np.array(big, dtype=np.uint64),
    )
    expected = _by_record({"n": ints, "ok": flags, 'k"ey': strings.tolist(), "u": big})
    assert format_json_lines(batch) == expected
    laid_out = ascii_json_lines(batch)
    # As the column holds them: a U array drops a text's trailing NULs.
    held = strings.tolist()
    plain = all(t.isascii() and t.isprintable() and '"' not in t and "\\" not in t for t in held)
    assert (laid_out is not None) == plain
    if laid_out is not None:
        assert laid_out == expected


def test_what_is_not_plain_ascii_is_left_to_the_record_by_record_path() -> None:
    """Floats, strings to escape and empty batches; a field name is escaped as json.dumps does."""
    assert ascii_json_lines(Batch.of_columns(x=np.array([1.5, 2.0]))) is None
    assert ascii_json_lines(Batch.of_columns(x=np.array(["a", "b\n"]))) is None
    assert ascii_json_lines(Batch.of_columns(**{"é{}": np.array([1])})) == '{"\\u00e9{}": 1}\n'
    assert ascii_json_lines(Batch.of_columns(x=np.array([], dtype=np.int64))) is None
