"""The exchange's format: pickled batches (what tasks ship today) against Arrow IPC, in one run.

    .venv/bin/python tests/benchmarks/bench_exchange_format.py [--repeats 7]

A keyed stage's input crosses Spark's shuffle as Python objects that PySpark pickles
(``pickle.HIGHEST_PROTOCOL``) on the sending worker and unpickles on the receiving one. This
measures that round trip (bytes out of the sender, bytes into a batch the operators can use)
for the batches the PV job ships, against two Arrow IPC encodings of the same batches:

- ``arrow utf8``: Arrow's own string type (a dictionary array of ``utf8`` values), as another
  Arrow reader would expect; the values are converted from and back to numpy ``U`` arrays.
- ``arrow fixed``: ``fixed_size_binary`` values taken from and given back to numpy's ``S``
  arrays without a copy (the "zero-copy where the data allow" form).

Both ends count: the operators work on numpy arrays, so an Arrow batch is made from them and
turned back into them. Medians of ``--repeats`` rounds; writes
``tests/benchmarks/results/exchange_format.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "jobs"))
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_pv import write_results  # noqa: E402

from sparkpoint.connectors.sources import _named  # noqa: E402
from sparkpoint.records import Batch, DictColumn, ascii_bytes, str_of_ascii  # noqa: E402


def cases(rng: np.random.Generator) -> dict[str, Batch]:
    """The batches one source task ships to one keyed subtask in the PV job."""
    million = rng.integers(0, 1_000_000, 130_000)
    present, codes = np.unique(million, return_inverse=True)
    few = rng.integers(0, 40, 130_000)
    return {
        # 1 M apps: the pruned key column, about one distinct key per record.
        "1 M keys, key column (130 k records)": Batch.of_columns(
            app_id=DictColumn(codes.reshape(-1).astype(np.int32), _named(present))
        ),
        # 40 apps with per-record output: nothing pre-aggregated, every field read.
        "40 keys, three columns (130 k records)": Batch.of_columns(
            app_id=DictColumn(few.astype(np.int32), _named(np.arange(40))),
            event_id=np.arange(130_000, dtype=np.int64),
            event_time=np.arange(130_000, dtype=np.int64) + 1_700_000_000_000,
        ),
        # 40 apps, --emit epoch: the map-side partial counts.
        "40 keys, partial counts (40 records)": Batch.of_columns(
            app_id=_named(np.arange(40)), __weight__=np.full(40, 3250, dtype=np.int64)
        ),
    }


# ----------------------------------------------------------------------------- Arrow


def _to_arrow(values: np.ndarray, fixed: bool) -> pa.Array:
    if values.dtype.kind in "iuf":
        return pa.array(values)  # a view of the numpy buffer
    narrow = ascii_bytes(values)
    if fixed and narrow is not None:
        width = narrow.dtype.itemsize
        return pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(width), len(narrow), [None, pa.py_buffer(narrow)]
        )
    return pa.array(values.tolist(), type=pa.utf8())


def _from_arrow(array: pa.Array) -> np.ndarray:
    if pa.types.is_fixed_size_binary(array.type):
        width = array.type.byte_width
        raw = np.frombuffer(array.buffers()[1], dtype=f"S{width}", count=len(array))
        return str_of_ascii(raw)
    if pa.types.is_string(array.type):
        return np.array(array.to_pylist(), dtype=str)
    return array.to_numpy()


def arrow_encode(batch: Batch, fixed: bool) -> bytes:
    arrays, names = [], []
    for name, column in batch.columns.items():
        if isinstance(column, DictColumn):
            arrays.append(
                pa.DictionaryArray.from_arrays(
                    pa.array(column.codes), _to_arrow(column.values, fixed)
                )
            )
        else:
            arrays.append(_to_arrow(np.asarray(column), fixed))
        names.append(name)
    record = pa.RecordBatch.from_arrays(arrays, names=names)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, record.schema) as writer:
        writer.write_batch(record)
    return sink.getvalue().to_pybytes()  # PySpark's serializer hands the JVM bytes


def arrow_decode(raw: bytes) -> Batch:
    record = pa.ipc.open_stream(raw).read_next_batch()
    columns: dict[str, Any] = {}
    for name, array in zip(record.schema.names, record.columns, strict=True):
        if isinstance(array, pa.DictionaryArray):
            codes = array.indices.to_numpy()
            columns[name] = DictColumn(codes, _from_arrow(array.dictionary))
        else:
            columns[name] = _from_arrow(array)
    return Batch.of_columns(**columns)


# ----------------------------------------------------------------------------- timing


FORMATS: dict[str, tuple[Callable[[Batch], bytes], Callable[[bytes], Batch]]] = {
    "pickle (today)": (
        lambda b: pickle.dumps(b, protocol=pickle.HIGHEST_PROTOCOL),
        pickle.loads,
    ),
    "arrow utf8": (lambda b: arrow_encode(b, fixed=False), arrow_decode),
    "arrow fixed": (lambda b: arrow_encode(b, fixed=True), arrow_decode),
}


def same(a: Batch, b: Batch) -> bool:
    """Whether two batches hold the same records (a decoded batch must equal its original)."""
    if list(a.columns) != list(b.columns):
        return False
    for name in a.columns:
        x, y = a.columns[name], b.columns[name]
        x = x.values[x.codes] if isinstance(x, DictColumn) else np.asarray(x)
        y = y.values[y.codes] if isinstance(y, DictColumn) else np.asarray(y)
        if not np.array_equal(x, y):
            return False
    return True


def measure(batch: Batch, repeats: int) -> dict[str, dict[str, float]]:
    rounds: dict[str, list[tuple[float, float]]] = {f: [] for f in FORMATS}
    sizes: dict[str, int] = {}
    for _ in range(repeats):
        for name, (encode, decode) in FORMATS.items():  # interleaved: noise hits all alike
            started = time.perf_counter()
            raw = encode(batch)
            encoded = time.perf_counter()
            back = decode(raw)
            decoded = time.perf_counter()
            assert same(batch, back), name
            rounds[name].append((encoded - started, decoded - encoded))
            sizes[name] = len(raw)
    return {
        name: {
            "encode_ms": 1000 * statistics.median(e for e, _ in r),
            "decode_ms": 1000 * statistics.median(d for _, d in r),
            "total_ms": 1000 * statistics.median(e + d for e, d in r),
            "bytes": sizes[name],
        }
        for name, r in rounds.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    results = {
        label: measure(b, args.repeats) for label, b in cases(np.random.default_rng(7)).items()
    }
    rows = [
        "| batch | format | bytes | encode | decode | round trip | / pickle |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, by_format in results.items():
        base = by_format["pickle (today)"]["total_ms"]
        for name, r in by_format.items():
            rows.append(
                f"| {label} | {name} | {r['bytes']:,} | {r['encode_ms']:.3f} ms "
                f"| {r['decode_ms']:.3f} ms | {r['total_ms']:.3f} ms "
                f"| {r['total_ms'] / base:.2f} |"
            )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    header = (
        f"The exchange's format, one batch encoded by its sender and decoded by its receiver, "
        f"median of {args.repeats} interleaved rounds; pyarrow {pa.__version__}, numpy "
        f"{np.__version__}, Python {platform.python_version()}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')}, commit {commit}\n\n"
        f"`.venv/bin/python tests/benchmarks/bench_exchange_format.py --repeats {args.repeats}`"
    )
    write_results("exchange_format", header + "\n\n" + "\n".join(rows), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
