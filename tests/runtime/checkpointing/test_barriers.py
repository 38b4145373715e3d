"""Tests of barrier alignment: exactly-once buffering, at-least-once tracking, aborts."""

from __future__ import annotations

import itertools
import pickle
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from sparkpoint.checkpointing.barriers import (
    Aborted,
    Aligned,
    AlignmentStats,
    BarrierHandler,
    CheckpointBarrier,
    HandlerOutput,
    Release,
    default_size_of,
)
from sparkpoint.clock import ManualClock
from sparkpoint.errors import CheckpointError, ConfigurationError
from sparkpoint.protocol import CheckpointingMode, CheckpointKind

EXACTLY_ONCE = CheckpointingMode.EXACTLY_ONCE
AT_LEAST_ONCE = CheckpointingMode.AT_LEAST_ONCE
START = 1_700_000_000_000  # ManualClock's wall start; its monotonic clock starts at 0
STEP = 10  # ms the clock advances before each element is read
B1 = CheckpointBarrier(1, timestamp=START - 5)
B2 = CheckpointBarrier(2, timestamp=START - 3)


@dataclass(frozen=True)
class Batch:
    """A data element: ``n`` records, ``nbytes`` bytes."""

    name: str
    n: int = 1
    nbytes: int = 10

    def __len__(self) -> int:
        return self.n


def make(
    mode: CheckpointingMode, channels: int, **options: Any
) -> tuple[BarrierHandler, ManualClock]:
    clock = ManualClock()
    return BarrierHandler(channels, mode, clock, **options), clock


def feed(
    handler: BarrierHandler, clock: ManualClock, inputs: Iterable[tuple[int, object]]
) -> list[list[HandlerOutput]]:
    """Process each input STEP ms after the previous one; the outputs of each call."""
    result = []
    for channel, element in inputs:
        clock.advance(STEP)
        result.append(handler.process(channel, element))
    return result


def flat(outputs: list[list[HandlerOutput]]) -> list[HandlerOutput]:
    return [item for step in outputs for item in step]


def stats(cid: int, first: int, last: int, nbytes: int, records: int, walls: dict[int, int]):
    """Stats of an alignment whose barriers were read at the given step numbers (1-based)."""
    return AlignmentStats(
        checkpoint_id=cid,
        first_barrier_ms=float(first * STEP),
        last_barrier_ms=float(last * STEP),
        duration_ms=float((last - first) * STEP),
        buffered_bytes=nbytes,
        buffered_records=records,
        barrier_wall_ms={ch: START + step * STEP for ch, step in walls.items()},
    )


# ----------------------------------------------------------------------------- two modes, one input

A1, A2, A3 = Batch("a1"), Batch("a2", n=3, nbytes=100), Batch("a3", n=1, nbytes=7)
BB1, BB2 = Batch("b1"), Batch("b2", n=2, nbytes=50)
C1, C2, C3 = Batch("c1"), Batch("c2"), Batch("c3")
INTERLEAVED = [
    (0, A1),  # 1
    (1, BB1),  # 2
    (0, B1),  # 3: channel 0 blocked (exactly-once)
    (0, A2),  # 4
    (2, C1),  # 5
    (1, B1),  # 6: channel 1 blocked
    (1, BB2),  # 7
    (0, A3),  # 8
    (2, C2),  # 9
    (2, B1),  # 10: last barrier
    (2, C3),  # 11
]


def test_exactly_once_buffers_blocked_channels_and_drains_them_after_aligned():
    handler, clock = make(EXACTLY_ONCE, 3)
    outputs = feed(handler, clock, INTERLEAVED[:8])
    assert outputs == [[Release(0, A1)], [Release(1, BB1)], [], [], [Release(2, C1)], [], [], []]
    assert handler.pending_checkpoint_id == 1
    assert handler.blocked_channels == frozenset({0, 1})
    assert handler.buffered_records == 3 + 2 + 1

    outputs = feed(handler, clock, INTERLEAVED[8:])
    assert outputs == [
        [Release(2, C2)],
        [
            Aligned(B1, stats(1, 3, 10, 100 + 50 + 7, 6, {0: 3, 1: 6, 2: 10})),
            Release(0, A2),
            Release(1, BB2),
            Release(0, A3),
        ],
        [Release(2, C3)],
    ]
    assert handler.pending_checkpoint_id is None
    assert handler.blocked_channels == frozenset()
    assert handler.buffered_records == 0
    handler.end_of_input()


def test_at_least_once_releases_everything_and_aligns_at_the_last_barrier():
    handler, clock = make(AT_LEAST_ONCE, 3)
    outputs = feed(handler, clock, INTERLEAVED)
    # A2, BB2 and A3 come after their channel's barrier but are processed before the snapshot:
    # they are in checkpoint 1's state and will be read again after a restore (duplicates).
    assert outputs == [
        [Release(0, A1)],
        [Release(1, BB1)],
        [],
        [Release(0, A2)],
        [Release(2, C1)],
        [],
        [Release(1, BB2)],
        [Release(0, A3)],
        [Release(2, C2)],
        [Aligned(B1, stats(1, 3, 10, 0, 0, {0: 3, 1: 6, 2: 10}))],
        [Release(2, C3)],
    ]
    assert handler.blocked_channels == frozenset()
    assert handler.buffered_records == 0


@pytest.mark.parametrize("mode", [EXACTLY_ONCE, AT_LEAST_ONCE])
def test_single_channel_aligns_immediately(mode):
    handler, clock = make(mode, 1)
    x, y = Batch("x"), Batch("y")
    outputs = feed(handler, clock, [(0, x), (0, B1), (0, y), (0, B2)])
    assert outputs == [
        [Release(0, x)],
        [Aligned(B1, stats(1, 2, 2, 0, 0, {0: 2}))],
        [Release(0, y)],
        [Aligned(B2, stats(2, 4, 4, 0, 0, {0: 4}))],
    ]
    assert handler.blocked_channels == frozenset()


def test_next_barrier_buffered_behind_a_blocked_channel_aligns_during_the_replay():
    handler, clock = make(EXACTLY_ONCE, 2)
    a1, a2, a3 = Batch("a1"), Batch("a2", n=2, nbytes=20), Batch("a3", n=4, nbytes=40)
    b1, b2 = Batch("b1"), Batch("b2")
    outputs = feed(
        handler,
        clock,
        [(0, a1), (0, B1), (0, a2), (0, B2), (0, a3), (1, b1), (1, B1)],
    )
    assert outputs[:6] == [[Release(0, a1)], [], [], [], [], [Release(1, b1)]]
    # Step 7: checkpoint 1 aligns; the replay releases a2, then B2 blocks channel 0 again and
    # a3 goes back into the buffer, now on behalf of checkpoint 2.
    assert outputs[6] == [
        Aligned(B1, stats(1, 2, 7, 20 + 40, 2 + 4, {0: 2, 1: 7})),
        Release(0, a2),
    ]
    assert handler.pending_checkpoint_id == 2
    assert handler.blocked_channels == frozenset({0})
    assert handler.buffered_records == 4

    outputs = feed(handler, clock, [(1, b2), (1, B2)])
    assert outputs == [
        [Release(1, b2)],
        [Aligned(B2, stats(2, 7, 9, 40, 4, {0: 7, 1: 9})), Release(0, a3)],
    ]
    assert handler.blocked_channels == frozenset()


def test_higher_barrier_on_an_unblocked_channel_aborts_the_lower_checkpoint():
    handler, clock = make(EXACTLY_ONCE, 2)
    a1, b1 = Batch("a1"), Batch("b1")
    outputs = feed(handler, clock, [(0, B1), (0, a1), (1, b1), (1, B2), (0, B2)])
    assert outputs == [
        [],
        [],
        [Release(1, b1)],
        [
            Aborted(1, "subsumed: barrier 2 arrived on channel 1 before barrier 1"),
            Release(0, a1),
        ],
        [Aligned(B2, stats(2, 4, 5, 0, 0, {1: 4, 0: 5}))],
    ]
    assert handler.pending_checkpoint_id is None
    # Barrier 1 is now older than anything started here: dropped.
    assert feed(handler, clock, [(1, B1)]) == [[]]
    assert handler.ignored_barriers == 1


def test_at_least_once_abort_and_concurrent_checkpoints():
    handler, clock = make(AT_LEAST_ONCE, 2)
    a1 = Batch("a1")
    outputs = feed(handler, clock, [(0, B1), (0, a1), (1, B2), (0, B2)])
    assert outputs == [
        [],
        [Release(0, a1)],
        [Aborted(1, "subsumed: barrier 2 arrived on channel 1 before barrier 1")],
        [Aligned(B2, stats(2, 3, 4, 0, 0, {1: 3, 0: 4}))],
    ]
    # A fast channel may deliver barrier 4 while 3 is still aligning: both are tracked.
    b3, b4 = CheckpointBarrier(3, START), CheckpointBarrier(4, START)
    outputs = feed(handler, clock, [(0, b3), (0, b4), (1, b3), (1, b4)])
    assert outputs == [
        [],
        [],
        [Aligned(b3, stats(3, 5, 7, 0, 0, {0: 5, 1: 7}))],
        [Aligned(b4, stats(4, 6, 8, 0, 0, {0: 6, 1: 8}))],
    ]


def test_duplicate_and_old_barriers_are_ignored_in_exactly_once_mode():
    handler, clock = make(EXACTLY_ONCE, 2)
    x, y = Batch("x"), Batch("y")
    b3 = CheckpointBarrier(3, START)
    outputs = feed(
        handler,
        clock,
        [
            (0, B1),
            (0, B1),  # duplicate behind a blocked channel: buffered, dropped at the replay
            (0, x),
            (1, B1),
            (1, B1),  # duplicate after completion
            (1, b3),
            (0, B2),  # lower than the alignment in progress: dropped, nothing aborted
            (0, y),
        ],
    )
    assert outputs == [
        [],
        [],
        [],
        [Aligned(B1, stats(1, 1, 4, 10, 1, {0: 1, 1: 4})), Release(0, x)],
        [],
        [],
        [],
        [Release(0, y)],
    ]
    assert handler.ignored_barriers == 3
    assert handler.pending_checkpoint_id == 3
    assert handler.blocked_channels == frozenset({1})


def test_duplicate_barrier_from_the_same_channel_is_ignored_in_at_least_once_mode():
    handler, clock = make(AT_LEAST_ONCE, 2)
    outputs = feed(handler, clock, [(0, B1), (0, B1), (1, B1), (0, B1)])
    assert outputs == [[], [], [Aligned(B1, stats(1, 1, 3, 0, 0, {0: 1, 1: 3}))], []]
    assert handler.ignored_barriers == 2


@pytest.mark.parametrize("mode", [EXACTLY_ONCE, AT_LEAST_ONCE])
def test_end_of_input_during_alignment_names_the_missing_channels(mode):
    handler, clock = make(mode, 4)
    feed(handler, clock, [(1, CheckpointBarrier(5, START)), (2, CheckpointBarrier(5, START))])
    with pytest.raises(CheckpointError, match=r"checkpoint 5: no barrier from channel\(s\) 0, 3 "):
        handler.end_of_input()


# ----------------------------------------------------------------------------- barrier orders


def three_channel_input(order: tuple[int, ...]) -> list[tuple[int, object]]:
    """Two records per channel before barrier 1 and two after; barriers arrive in ``order``."""
    pre = {ch: [Batch(f"{ch}-0"), Batch(f"{ch}-1")] for ch in range(3)}
    post = {ch: [Batch(f"{ch}-2"), Batch(f"{ch}-3")] for ch in range(3)}
    inputs: list[tuple[int, object]] = [(ch, pre[ch][i]) for i in range(2) for ch in order]
    for ch in order:
        inputs += [(ch, B1), (ch, post[ch][0])]
    inputs += [(ch, post[ch][1]) for ch in range(3)]
    return inputs


@pytest.mark.parametrize("mode", [EXACTLY_ONCE, AT_LEAST_ONCE])
@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_three_channels_in_every_barrier_order(mode, order):
    handler, clock = make(mode, 3)
    inputs = three_channel_input(order)
    out = flat(feed(handler, clock, inputs))
    handler.end_of_input()

    data = [(ch, el) for ch, el in inputs if not isinstance(el, CheckpointBarrier)]
    released = [(item.channel, item.element) for item in out if isinstance(item, Release)]
    assert sorted(released, key=repr) == sorted(data, key=repr)
    for ch in range(3):
        assert [el for c, el in released if c == ch] == [el for c, el in data if c == ch]

    aligned = [i for i, item in enumerate(out) if isinstance(item, Aligned)]
    assert len(aligned) == 1
    first, last = 7, 11  # steps of the first and the last barrier (after 6 data elements)
    buffered = 2 if mode is EXACTLY_ONCE else 0  # one record from each of the first two
    walls = {order[0]: 7, order[1]: 9, order[2]: 11}
    assert out[aligned[0]] == Aligned(B1, stats(1, first, last, 10 * buffered, buffered, walls))
    names_before = {item.element.name for item in out[: aligned[0]] if isinstance(item, Release)}
    if mode is EXACTLY_ONCE:
        assert names_before == {f"{ch}-{i}" for ch in range(3) for i in range(2)}
    else:
        assert names_before == {f"{ch}-{i}" for ch in range(3) for i in range(2)} | {
            f"{order[0]}-2",
            f"{order[1]}-2",
        }


# ----------------------------------------------------------------------------- random interleavings


def random_run(rng: random.Random, mode: CheckpointingMode, skip: bool, **options: Any):
    """Per channel: data, barrier 1, data, barrier 2, data, interleaved at random.

    With ``skip``, each channel leaves out barrier 1 with probability 1/4 (as after a barrier
    that a source never injected), which makes checkpoint 1 abort or its barriers stale.
    """
    channels = rng.randint(1, 4)
    sequences: dict[int, list[object]] = {}
    for ch in range(channels):
        seq: list[object] = []
        for segment in range(3):
            seq += [
                Batch(f"{ch}/{segment}/{i}", n=rng.randint(1, 5)) for i in range(rng.randint(0, 3))
            ]
            if segment == 0 and not (skip and rng.random() < 0.25):
                seq.append(B1)
            elif segment == 1:
                seq.append(B2)
        sequences[ch] = seq
    cursors = dict.fromkeys(sequences, 0)
    handler, clock = make(mode, channels, **options)
    out: list[HandlerOutput] = []
    while cursors:
        ch = rng.choice(sorted(cursors))
        clock.advance(rng.choice([0, 1, 5]))
        out += handler.process(ch, sequences[ch][cursors[ch]])
        cursors[ch] += 1
        if cursors[ch] == len(sequences[ch]):
            del cursors[ch]
    handler.end_of_input()
    return sequences, handler, out


@pytest.mark.parametrize("skip", [False, True], ids=["all-barriers", "skipped-barriers"])
@pytest.mark.parametrize("mode", [EXACTLY_ONCE, AT_LEAST_ONCE])
def test_random_interleavings_keep_channel_order_and_barrier_positions(mode, skip):
    runs_that_buffered = 0
    for seed in range(200):
        sequences, handler, out = random_run(random.Random(seed), mode, skip)
        where = f"seed {seed}"
        aligned = {
            item.barrier.checkpoint_id: i for i, item in enumerate(out) if isinstance(item, Aligned)
        }
        aborted = [item.checkpoint_id for item in out if isinstance(item, Aborted)]
        complete = all(B1 in seq for seq in sequences.values())
        assert list(aligned) == ([1, 2] if complete else [2]), where
        assert (aborted == []) if complete else (aborted in ([], [1])), where
        if complete:
            assert handler.ignored_barriers == 0, where
        assert handler.buffered_records == 0 and handler.blocked_channels == frozenset(), where
        assert handler.pending_checkpoint_id is None, where
        if any(item.stats.buffered_records for item in out if isinstance(item, Aligned)):
            runs_that_buffered += 1

        position = {id(item.element): i for i, item in enumerate(out) if isinstance(item, Release)}
        for ch, seq in sequences.items():
            data = [el for el in seq if not isinstance(el, CheckpointBarrier)]
            released = [
                item.element for item in out if isinstance(item, Release) and item.channel == ch
            ]
            assert released == data, where
            for el in data:
                segment = int(el.name.split("/")[1])
                for cid, at in aligned.items():
                    if segment < cid:  # el preceded barrier cid on its channel
                        assert position[id(el)] < at, (where, el, cid)
                    elif mode is EXACTLY_ONCE:  # el followed it: held back until the snapshot
                        assert position[id(el)] > at, (where, el, cid)
    if mode is EXACTLY_ONCE:
        assert runs_that_buffered > 100  # the property above was tested on real buffering
    else:
        assert runs_that_buffered == 0


def test_abort_during_a_replay_keeps_channel_order():
    handler, clock = make(EXACTLY_ONCE, 3)
    a, c = Batch("a"), Batch("c")
    b3 = CheckpointBarrier(3, START)
    outputs = feed(
        handler,
        clock,
        [(0, B1), (0, B2), (0, a), (1, B1), (1, b3), (0, c), (2, B1), (0, b3), (2, b3)],
    )
    assert outputs[:6] == [[]] * 6
    # Step 7 aligns checkpoint 1. The replay starts checkpoint 2 (channel 0 again holds a back);
    # channel 1's barrier 3 aborts it, and a is released before c, which arrived after it.
    assert outputs[6] == [
        Aligned(B1, stats(1, 1, 7, 20, 2, {0: 1, 1: 4, 2: 7})),
        Aborted(2, "subsumed: barrier 3 arrived on channel 1 before barrier 2"),
        Release(0, a),
        Release(0, c),
    ]
    # Checkpoint 3 started when the replay read channel 1's barrier, at step 7.
    assert outputs[7:] == [[], [Aligned(b3, stats(3, 7, 9, 0, 0, {1: 7, 0: 8, 2: 9}))]]


# ----------------------------------------------------------------------------- small parts


def test_barrier_pickles_small_and_round_trips():
    plain = CheckpointBarrier(123, START)
    final = CheckpointBarrier(124, START, CheckpointKind.SAVEPOINT, is_final=True)
    # The class reference is most of it: 2 ints for a plain checkpoint barrier.
    assert len(pickle.dumps(plain)) < 90
    assert len(pickle.dumps(final)) < 110
    assert pickle.loads(pickle.dumps(plain)) == plain
    restored = pickle.loads(pickle.dumps(final))
    assert restored == final
    assert restored.kind is CheckpointKind.SAVEPOINT


def test_default_size_of():
    assert default_size_of(Batch("x", nbytes=321)) == 321
    assert default_size_of(b"abcd") == 4
    assert default_size_of("héllo") == 6
    assert default_size_of([1, 2, 3]) == 0  # documented: unknown types count as 0 bytes


def test_size_of_and_count_of_are_used_for_buffered_elements():
    clock = ManualClock()
    handler = BarrierHandler(2, EXACTLY_ONCE, clock, size_of=lambda e: 1000, count_of=lambda e: 7)
    out = handler.process(0, B1) + handler.process(0, "r") + handler.process(1, B1)
    assert out == [
        Aligned(B1, AlignmentStats(1, 0.0, 0.0, 0.0, 1000, 7, {0: START, 1: START})),
        Release(0, "r"),
    ]


def test_invalid_arguments():
    with pytest.raises(ConfigurationError, match="got 0"):
        BarrierHandler(0, EXACTLY_ONCE, ManualClock())
    handler = BarrierHandler(2, EXACTLY_ONCE, ManualClock())
    with pytest.raises(ValueError, match=r"channel 2 out of range 0\.\.1"):
        handler.process(2, Batch("x"))
