"""The registry's world for its driver tests: a real `WatchRegistry` on the in-memory bus and the hand-moved clock,
reading a scripted upstream (the engine's own rules are tested as playbooks, with no loop: test_engine_*.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import pytest

from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent, ChangeListener, WatchKey, WatchState
from sidecar.config import PollingConfig, ToolRule
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS_IDENTITY, Identity
from sidecar.observability.metrics import Metrics
from sidecar.upstream.base import Upstream
from sidecar.watch.fingerprint import fingerprint_contents
from sidecar.watch.registry import WatchRegistry
from tests.unit.watch.bounded_registry import BoundedRegistry
from tests.unit.watch.manual_clock import ManualClock
from tests.unit.watch.scripted_upstream import ScriptedUpstream, contents

__all__ = [
    "ALICE",
    "ALICE_PHONE",
    "ANON",
    "BOB",
    "CAROL",
    "CONFIG",
    "DOC",
    "JUST",
    "OTHER",
    "Coordinator",
    "GatedBus",
    "World",
    "failures",
    "fp",
    "make_world",
]

CONFIG = PollingConfig(
    default_interval_ms=5000,
    min_interval_ms=250,
    max_interval_ms=60000,
    jitter=0.0,
    backoff_initial_ms=1000,
    backoff_max_ms=8000,
    linger_ms=8000,
    revalidate_debounce_ms=100,
)
"""No jitter: a watch polls every 5 s exactly; a watch no stream holds lingers 8 s (over one interval)."""

ALICE = Identity("alice", (("authorization", "Bearer a"),), client="alice-laptop")
BOB = Identity("bob", (("authorization", "Bearer b"),), client="bob-laptop")
JUST = 1 / 128
"""A moment, exact in binary: times add up without rounding."""

ALICE_PHONE = Identity("alice", ALICE.headers, client="alice-phone")
CAROL = Identity("carol", (("authorization", "Bearer c"),), client="carol-laptop")
ANON = ANONYMOUS_IDENTITY
DOC = "file:///doc"
OTHER = "file:///other"


def fp(uri: str, text: str) -> str:
    return fingerprint_contents(contents(uri, text)["contents"])


@dataclass
class World:
    clock: ManualClock
    upstream: ScriptedUpstream
    bus: MemoryBus
    metrics: Metrics
    fair_share: FairShare
    registry: WatchRegistry
    events: list[ChangeEvent] = field(default_factory=list)
    refusals: list[tuple[WatchKey, str]] = field(default_factory=list)

    def changes(self) -> list[tuple[WatchKey, str]]:
        """The changes told so far (not the first looks)."""
        return [(event.key, event.fingerprint) for event in self.events if not event.baseline]

    def watches(self) -> dict[WatchKey, int]:
        return {watch.key: watch.refs for watch in self.registry.watches()}

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    async def step(self, seconds: float, *, looks: int) -> None:
        """Move the clock on by `seconds` and wait until the `looks` polls that fired have ended: a poll's last act
        is to arm its watch's next one, after it has published what it saw. Polls a poll arms come due on a later
        step, never this one (the clock fires only what is armed when it moves)."""
        fired = self.clock.advance(seconds)
        assert fired >= looks, f"{fired} timers came due by {self.clock.now()}, not the {looks} polls expected"
        await self.clock.until(
            lambda: self.registry.polls_in_flight == 0, f"the {looks} polls due by {self.clock.now()} ended"
        )


class GatedBus(MemoryBus):
    """The in-memory bus, whose publishing the test may hold (a slow bus)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.published = asyncio.Event()
        """Set as a publish returns to its publisher, before the publisher's next step (the test clears it to wait
        for the next one)."""

    async def publish(self, event: ChangeEvent) -> None:
        if self.gate is not None:
            await self.gate.wait()
        await super().publish(event)
        self.published.set()


class Coordinator:
    """The replicas' coordination as one replica sees it: the lease, tracked keys, other replicas' writes."""

    def __init__(self) -> None:
        self.lease = True
        self.tracked: list[WatchKey] = []
        self.untracked: list[WatchKey] = []
        self.announced: list[frozenset[str]] = []
        self.others_wrote: Callable[[frozenset[str]], None] | None = None
        self.adopt: ChangeListener | None = None
        """The registry's ear for changes another replica told that this one's streams were told otherwise."""

    def may_poll(self, key: WatchKey) -> bool:
        return self.lease

    def track(self, watch: WatchState) -> None:
        self.tracked.append(watch.key)

    def untrack(self, key: WatchKey) -> None:
        self.untracked.append(key)

    async def announce_revalidate(self, contexts: frozenset[str]) -> None:
        self.announced.append(contexts)

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        self.others_wrote = listener

    def on_adopt(self, listener: ChangeListener) -> Callable[[], None]:
        self.adopt = listener

        def remove() -> None:
            self.adopt = None

        return remove


def make_world(
    config: PollingConfig = CONFIG,
    *,
    capacity: int = 8,
    per_client: int = 4,
    bus: MemoryBus | None = None,
    coordinator: Coordinator | None = None,
    replicas: Callable[[], int] = lambda: 1,
    tool_rules: Sequence[ToolRule] = (),
) -> World:
    clock = ManualClock()
    upstream = ScriptedUpstream()
    bus = bus or MemoryBus()
    metrics = Metrics()
    fair_share = FairShare(capacity=capacity, per_client=per_client, max_queued_per_client=8, metrics=metrics)
    registry = BoundedRegistry(
        cast(Upstream, upstream),
        config,
        bus,
        metrics,
        fair_share,
        coordinator=coordinator,
        clock=clock,
        replicas=replicas,
        tool_rules=tool_rules,
    )
    world = World(clock, upstream, bus, metrics, fair_share, registry)
    bus.subscribe(world.events.append)
    registry.on_auth_failure(lambda key, context: world.refusals.append((key, context)))
    return world


def failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
