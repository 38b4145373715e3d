"""Alignment buffers past their limit: what the barrier handler holds back goes through a
spill file on local disk and comes back in order."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from sparkpoint.checkpointing.barriers import Aligned
from sparkpoint.checkpointing.spill import SpillFile

from .test_barriers import EXACTLY_ONCE, random_run


@pytest.mark.parametrize("limit", [0, 25, 10**9], ids=["all-spilled", "some-spilled", "none"])
@pytest.mark.parametrize("skip", [False, True], ids=["all-barriers", "skipped-barriers"])
def test_a_spilled_alignment_buffer_releases_what_the_memory_one_releases(limit, skip, tmp_path):
    """Past ``buffer_limit`` the held elements go to the spill file; what comes out (elements,
    their order, alignments, aborts and their stats but spilled_bytes) is the same."""
    spills = 0
    for seed in range(200):
        _, _, in_memory = random_run(random.Random(seed), EXACTLY_ONCE, skip)
        spill = SpillFile(str(tmp_path / "spill"))
        _, _, spilled = random_run(
            random.Random(seed), EXACTLY_ONCE, skip, buffer_limit=limit, spill=spill
        )
        for item in (i for i in spilled if isinstance(i, Aligned)):
            assert item.stats.spilled_bytes <= item.stats.buffered_bytes
            if limit == 0:
                assert item.stats.spilled_bytes == item.stats.buffered_bytes
            spills += item.stats.spilled_bytes > 0
        same = [
            replace(i, stats=replace(i.stats, spilled_bytes=0)) if isinstance(i, Aligned) else i
            for i in spilled
        ]
        assert same == in_memory, f"seed {seed}"
        assert spill.held == 0  # every spilled element was read back
        spill.close()
    if limit == 10**9:
        assert spills == 0
    else:  # the property was tested on real spills
        assert spills > (100 if limit == 0 else 20)


def test_spill_file_reads_back_in_any_order_and_empties_itself(tmp_path: Path):
    spill = SpillFile(str(tmp_path / "deep" / "dir"))
    assert not (tmp_path / "deep").exists()  # nothing made before the first element
    handles = [spill.put({"n": i, "pad": "x" * i}) for i in range(5)]
    assert spill.held == 5 and spill.bytes_written == sum(h.length for h in handles)
    assert spill.take(handles[3]) == {"n": 3, "pad": "xxx"}
    assert [spill.take(h)["n"] for h in (handles[0], handles[4], handles[1])] == [0, 4, 1]
    assert spill.take(handles[2]) == {"n": 2, "pad": "xx"} and spill.held == 0
    again = spill.put("next alignment")
    assert again.offset == 0  # emptied once everything was read back
    assert spill.take(again) == "next alignment"
    assert list((tmp_path / "deep" / "dir").iterdir()) == []  # an anonymous file
    spill.close()
