"""A connect job for the co-process tests: orders and user profiles connected and keyed by
user, each order enriched with its user's region (buffered in keyed state until the profile
arrives), then counted per region; and its plain-Python oracle."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from sparkpoint.connectors.sinks import FileSink
from sparkpoint.functions import KeyedContext, KeyedCoProcessFunction
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.state.descriptors import ListStateDescriptor, ValueStateDescriptor
from sparkpoint.testing import ListSource

USERS = 2_000
REGIONS = 3


def orders(n: int) -> tuple[dict[str, Any], ...]:
    return tuple({"user": (i * 7919) % USERS, "amount": i % 10} for i in range(n))


def profiles() -> tuple[dict[str, Any], ...]:
    """One profile per user, users in a scrambled order."""
    return tuple({"id": (i * 37) % USERS, "region": f"r{i % REGIONS}"} for i in range(USERS))


class Enrich(KeyedCoProcessFunction):
    """Orders wait in keyed state until their user's profile came; then each goes out once
    with the user's region."""

    def open(self, ctx: KeyedContext) -> None:
        self.region = ctx.get_state(ValueStateDescriptor("region", None))
        self.waiting = ctx.get_state(ListStateDescriptor("waiting"))

    def process_element1(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        region = self.region.value()
        if region is None:
            self.waiting.update([*self.waiting.get(), value["amount"]])
            return
        yield {"region": region, "amount": value["amount"]}

    def process_element2(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        self.region.update(value["region"])
        for amount in self.waiting.get():
            yield {"region": value["region"], "amount": amount}
        self.waiting.update([])


def build(env: StreamExecutionEnvironment, n_orders: int, out: str) -> None:
    """orders (3 splits) + profiles (2 splits) -> connect, key by user -> Enrich (stage 1)
    -> key by region -> count (stage 2) -> file sink."""
    order_stream = env.from_source(ListSource(orders(n_orders), splits=3), uid="orders")
    profile_stream = env.from_source(ListSource(profiles(), splits=2), uid="profiles")
    (
        order_stream.connect(profile_stream)
        .key_by("user", "id")
        .process(Enrich(), uid="enrich")
        .key_by("region")
        .count(uid="per-region", output="orders")
        .sink_to(FileSink(out), uid="sink")
    )


def oracle(n_orders: int) -> Counter[str]:
    region = {p["id"]: p["region"] for p in profiles()}
    per_region = Counter(region[o["user"]] for o in orders(n_orders))
    return Counter(
        f'{{"region": "{r}", "orders": {k}}}'
        for r, m in per_region.items()
        for k in range(1, m + 1)
    )
