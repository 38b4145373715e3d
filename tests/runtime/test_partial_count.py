"""Map-side partial aggregation of ``count`` (``emit="epoch"``): a sending task ships one row
per distinct key and its count instead of the records, when the keys repeat; the keyed subtask
counts the weights. What it commits must not change: the exactly-once suite runs the PV job
with ``--emit epoch`` (7 apps: partial counts) through failures and restores."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sparkpoint.functions import WEIGHT, CountOperator, records_of
from sparkpoint.records import Batch, DictColumn
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range
from sparkpoint.testing import line_counts
from sparkpoint.watermarks import Watermark

from .pv_harness import IN_PROCESS, latest_pv, run_pv, true_counts


def _count(emit: str = "epoch") -> tuple[CountOperator, HashMapKeyedStateBackend]:
    op = CountOperator("c", "k", output="n", emit=emit)
    backend = HashMapKeyedStateBackend(128, key_group_range(0, 1, 128))
    op.open(backend)
    return op, backend


def _dict_column(rng: np.random.Generator, records: int, keys: int) -> DictColumn:
    values = np.array([f"key-{i}" for i in range(keys)])
    return DictColumn(rng.integers(0, keys, records).astype(np.int32), values)


@pytest.mark.parametrize("plain", [False, True], ids=["dictionary", "plain-array"])
def test_a_partial_is_one_row_per_key_with_its_count(plain: bool) -> None:
    rng = np.random.default_rng(1)
    column = _dict_column(rng, 5000, 40)
    keys = column.decode() if plain else column
    partial = _count()[0].partial(Batch.of_columns(k=keys, other=np.arange(5000)))
    assert partial is not None and set(partial.columns) == {"k", WEIGHT}
    keys_out = np.asarray(partial.column("k")).tolist()
    got = dict(zip(keys_out, partial.column(WEIGHT).tolist(), strict=True))
    assert got == dict(Counter(column.decode().tolist()))
    assert records_of(partial) == 5000 and records_of(Watermark(3)) == 0


def test_records_are_shipped_as_they_are_when_a_partial_would_not_pay() -> None:
    rng = np.random.default_rng(2)
    op, _ = _count()
    few_repeats = Batch.of_columns(k=_dict_column(rng, 5000, 4000))
    assert op.partial(few_repeats) is None  # a dictionary of 4000 keys for 5000 records
    distinct = Batch.of_columns(k=np.array([f"k{i}" for i in range(5000)]))
    assert op.partial(distinct) is None  # a sample of the keys barely repeats
    assert op.partial(Batch.of_columns(k=np.array(["a"] * 100))) is None  # too few records
    assert op.partial(Batch.of_rows([{"k": "a"}] * 5000)) is None  # rows, not columns
    every, _ = _count("every")
    assert every.partial(Batch.of_columns(k=np.array(["a"] * 5000))) is None  # per record


def test_partials_and_records_count_alike() -> None:
    """A keyed subtask that gets partials from one channel and records from another ends
    with the counts of all the records, emitted once per key at the flush."""
    rng = np.random.default_rng(3)
    op, backend = _count()
    whole: Counter[str] = Counter()
    for step in range(6):
        column = _dict_column(rng, 3000, 30 if step % 2 else 3000)
        whole.update(column.decode().tolist())
        batch = Batch.of_columns(k=column)
        partial = op.partial(batch)
        assert (partial is None) == (step % 2 == 0)
        op.process(batch if partial is None else partial, backend)
    out = op.flush_updates(backend)
    flushed = zip(np.asarray(out.column("k")).tolist(), out.column("n").tolist(), strict=True)
    assert dict(flushed) == whole
    assert backend.table("count") == dict(whole)


@pytest.mark.parametrize("apps", [7, 20_000], ids=["partial-counts", "records"])
def test_the_pv_job_commits_the_true_counts_after_a_failure(tmp_path: Path, apps: int) -> None:
    """Partial counts (7 apps) or records (20,000 apps: keys barely repeat in a chunk) cross
    the exchange; either way, after a failure mid-epoch and a restore, every app's last
    committed count is its number of events, and the keyed subtasks counted every record."""
    from sparkpoint.testing import FailureInjection

    failure = FailureInjection("keyed", subtask=1, records=700, at_epoch=3)
    result, out = run_pv(
        IN_PROCESS,
        tmp_path,
        f"partial-{apps}",
        failure=failure,
        emit="epoch",
        apps=apps,
        events=40_000,
        epoch_records=5_000,
    )
    assert result.restores and latest_pv(line_counts(out)) == true_counts(40_000, apps)
