"""Exactly-once when a subtask's tasks go round several Python workers, each holding the
subtask's working state as it last saved it.

On Spark, a keyed subtask's next task runs in whichever Python worker is idle; a worker that
ran it some epochs ago continues from its own copy by applying the deltas written since
(``catch_up``), and one whose copy an injected failure made stale (a later restore rolls the
chain back) must rebuild from the files instead. Spark picks the worker, so a Spark test
cannot make this happen on purpose; here the in-process runner's one worker is made several
(:class:`_Workers`, each task of a subtask in the next one round), the PV job fails mid-epoch
and restores, and its committed output must equal a run that never failed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.state import changelog
from sparkpoint.testing import FailureInjection, line_counts

from ..pv_harness import IN_PROCESS, latest_pv, run_pv, true_counts


class _Workers(MutableMapping[str, Any]):
    """What ``changelog._LIVE`` is in each of ``count`` Python workers: a task of a subtask
    (its ``pop`` at open) goes to a worker picked at random (seeded: the same every run), as
    Spark's idle worker would be, and its save stays in that worker. Some workers sit out
    many epochs, across the restore too."""

    def __init__(self, count: int, seed: int) -> None:
        self.workers: list[dict[str, Any]] = [{} for _ in range(count)]
        self._turn: dict[str, int] = {}  # subtask's local directory -> the worker running it
        self._pick = random.Random(seed)

    def pop(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        turn = self._turn[key] = self._pick.randrange(len(self.workers))
        return self.workers[turn].pop(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.workers[self._turn.get(key, 0)][key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.workers[self._turn.get(key, 0)][key] = value

    def __delitem__(self, key: str) -> None:
        del self.workers[self._turn.get(key, 0)][key]

    def __iter__(self) -> Iterator[str]:
        return iter({key for worker in self.workers for key in worker})

    def __len__(self) -> int:
        return len(set(self))


SEED = int(os.environ.get("LAGGING_SEED", "7"))


@pytest.mark.parametrize("emit", ["every", "epoch"])
def test_workers_behind_on_a_subtask_catch_up_and_a_restore_rebuilds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emit: str
) -> None:
    events, apps = 24_000, 5_000
    job: dict[str, Any] = {"emit": emit, "events": events, "apps": apps, "epoch_records": 1_000}
    clean, clean_out = run_pv(IN_PROCESS, tmp_path, "clean", **job)

    loads: list[int] = []  # the first chain file each rebuild or catch-up applied
    real_load = changelog._load

    def load(backend: Any, store: Any, tag: str, files: list[Any], start: int) -> None:
        loads.append(start)
        real_load(backend, store, tag, files, start)

    monkeypatch.setattr(changelog, "_LIVE", _Workers(3, seed=SEED))
    monkeypatch.setattr(changelog, "_load", load)
    failure = FailureInjection("keyed", subtask=1, records=700, at_epoch=6)
    result, out = run_pv(IN_PROCESS, tmp_path, "round", failure=failure, **job)

    assert clean.restores == [] and len(result.restores) == 1
    assert any(start > 0 for start in loads), "no worker caught up on deltas"
    assert 0 in loads, "no worker rebuilt a version from its chain"
    lines, clean_lines = line_counts(out), line_counts(clean_out)
    if emit == "every":
        assert lines == clean_lines
    else:  # the flushes follow the barriers: the same final counts, none committed twice
        assert set(lines.values()) == {1}
        assert latest_pv(lines) == latest_pv(clean_lines) == true_counts(events, apps)
