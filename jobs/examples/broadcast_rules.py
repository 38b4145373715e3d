"""Rates per category, broadcast to every subtask, applied to events keyed by user.

Events ``(event_id, user, category, amount)`` come from one source, keyed by user; rules
``(category, rate)`` from a second, small one, broadcast (each category's rule once, the
categories in a scrambled order). Each event goes out once as ``(event_id, user, amount *
rate)``: at once when its category's rule is in the broadcast state, otherwise it waits in its
user's keyed list state and goes out when the rule comes (``apply_to_keyed_state`` visits every
user's waiting events). So the committed output does not depend on how rules and events
interleave, and it equals :func:`oracle`:

    sparkpoint run jobs/examples/broadcast_rules.py --standalone --checkpoint-interval 1 \
        --checkpoint-dir file:///tmp/chk --events 100000 --categories 500 --output /tmp/rated

The rules are broadcast state (one copy per subtask, in every checkpoint); the waiting events
are keyed state. A failure restores both, and every event is still written exactly once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from sparkpoint import (
    FileSink,
    KeyedBroadcastContext,
    KeyedBroadcastProcessFunction,
    KeyedReadOnlyContext,
    ListState,
    ListStateDescriptor,
    MapStateDescriptor,
    StreamExecutionEnvironment,
)
from sparkpoint.testing import ListSource

Event = tuple[int, int, int, int]  # (event_id, user, category, amount)
Rule = tuple[int, float]  # (category, rate)

RULES = MapStateDescriptor("rules")  # category -> rate, broadcast
WAITING = ListStateDescriptor("waiting")  # a user's events whose rule has not come yet


def events(n: int, users: int, categories: int) -> tuple[Event, ...]:
    return tuple((i, (i * 7919) % users, (i * 104_729) % categories, 1 + i % 100) for i in range(n))


def rules(categories: int) -> tuple[Rule, ...]:
    """One rule per category, in a scrambled order; rates are exact in binary (0.5 to 1.25)."""
    order = sorted(range(categories), key=lambda c: (c * 7_777) % categories)
    return tuple((c, 0.5 + (c % 4) * 0.25) for c in order)


def user_of(event: Event) -> int:
    return event[1]


class ApplyRules(KeyedBroadcastProcessFunction):
    """Rates each event by its category's rule, holding it until the rule is known."""

    def open(self, ctx: KeyedReadOnlyContext) -> None:
        self.waiting = ctx.get_state(WAITING)

    def process_element(self, value: Event, ctx: KeyedReadOnlyContext) -> Iterator[Any]:
        event_id, user, category, amount = value
        rate = ctx.get_broadcast_state(RULES).get(category)
        if rate is None:
            self.waiting.add(value)
            return
        yield (event_id, user, amount * rate)

    def process_broadcast_element(self, value: Rule, ctx: KeyedBroadcastContext) -> Iterator[Any]:
        category, rate = value
        ctx.get_broadcast_state(RULES).put(category, rate)

        def release(user: int, waiting: ListState) -> list[Any]:
            held = waiting.get()
            ready = [e for e in held if e[2] == category]
            if ready:
                waiting.update([e for e in held if e[2] != category])
            return [(e[0], user, e[3] * rate) for e in ready]

        yield from ctx.apply_to_keyed_state(WAITING, release)


def build_job(
    env: StreamExecutionEnvironment,
    n_events: int,
    users: int,
    categories: int,
    output: str,
    splits: int = 3,
) -> None:
    """events (``splits`` splits) keyed by user, connected with the rules (2 splits)
    broadcast -> ApplyRules -> file sink."""
    event_stream = env.from_source(
        ListSource(events(n_events, users, categories), splits=splits), uid="events"
    )
    rule_stream = env.from_source(ListSource(rules(categories), splits=2), uid="rules")
    (
        event_stream.key_by(user_of)
        .connect(rule_stream.broadcast(RULES))
        .process(ApplyRules(), uid="apply-rules")
        .sink_to(FileSink(output), uid="sink")
    )


def oracle(n_events: int, users: int, categories: int) -> list[tuple[int, int, float]]:
    """Every event once with its category's rate applied, sorted."""
    rate = dict(rules(categories))
    return sorted((i, u, a * rate[c]) for i, u, c, a in events(n_events, users, categories))


def build(env: StreamExecutionEnvironment, argv: Sequence[str]) -> argparse.Namespace:
    """Add the broadcast-rules job to ``env`` from the job's own arguments."""
    parser = argparse.ArgumentParser(prog="broadcast_rules")
    parser.add_argument("--events", type=int, default=100_000, help="total events (bounded)")
    parser.add_argument("--users", type=int, default=1_000, help="distinct users (the key)")
    parser.add_argument("--categories", type=int, default=500, help="categories, one rule each")
    parser.add_argument("--splits", type=int, default=3, help="splits of the event source")
    parser.add_argument("--output", required=True, help="output directory")
    args = parser.parse_args(list(argv))
    build_job(env, args.events, args.users, args.categories, args.output, args.splits)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    env = StreamExecutionEnvironment.from_args(argv)
    args = build(env, env.args)
    env.execute("broadcast-rules")
    print(f"broadcast-rules: committed output in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
