"""The registry of watches, driven through its own surface: a real `WatchRegistry` on the in-memory bus and the
hand-moved clock, reading a scripted upstream. What streams and clients would notice: what a subscription's first
read costs and shows before its ack, a change told once, lingering and coming back, private against public
watches, missing resources per context, forwarded reads and writes as evidence, refusals, and shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import cast

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent, WatchKey, WatchState
from sidecar.config import PollingConfig
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS_IDENTITY, PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import tracing
from sidecar.protocol.errors import TooManyRequests, UpstreamHTTPError, UpstreamUnavailable
from sidecar.upstream.answers import UpstreamInfo
from sidecar.upstream.base import Upstream
from sidecar.watch.fingerprint import ABSENT, fingerprint_contents
from sidecar.watch.registry import WatchRegistry
from tests.unit.watch.manual_clock import ManualClock, settle
from tests.unit.watch.scripted_upstream import URL, ScriptedUpstream, contents

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


def _world(
    config: PollingConfig = CONFIG,
    *,
    capacity: int = 8,
    per_client: int = 4,
    bus: MemoryBus | None = None,
    coordinator: Coordinator | None = None,
) -> World:
    clock = ManualClock()
    upstream = ScriptedUpstream()
    bus = bus or MemoryBus()
    metrics = Metrics()
    fair_share = FairShare(capacity=capacity, per_client=per_client, max_queued_per_client=8, metrics=metrics)
    registry = WatchRegistry(
        cast(Upstream, upstream), config, bus, metrics, fair_share, coordinator=coordinator, clock=clock
    )
    world = World(clock, upstream, bus, metrics, fair_share, registry)
    bus.subscribe(world.events.append)
    registry.on_auth_failure(lambda key, context: world.refusals.append((key, context)))
    return world


def _failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


@pytest.fixture
async def world(caplog: pytest.LogCaptureFixture) -> AsyncIterator[World]:
    world = _world()
    yield world
    await world.registry.aclose()
    records = [*caplog.get_records("call"), *caplog.records]
    failures = [record.getMessage() for record in records if record.levelno >= logging.WARNING]
    assert failures == [], "nothing the engine did failed (a crashed poll, a failed task) unless asked to"


# -- a subscription's first read -----------------------------------------------------------------------------


@pytest.mark.invariant(6)
async def test_the_first_read_is_published_as_a_baseline_before_acquire_returns(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    key = WatchKey("resource", DOC, "alice")
    assert handle.key == key and handle.context == "alice"
    assert world.upstream.calls == [("resources/read", DOC, "alice")]
    assert [(e.key, e.fingerprint, e.generation, e.baseline) for e in world.events] == [(key, fp(DOC, "v1"), 0, True)]
    assert world.watches() == {key: 1}
    assert world.gauge("mcp_sidecar_watches", kind="resource") == 1
    assert world.gauge("mcp_sidecar_watched_contexts") == 1
    await world.clock.advance(4.99)
    assert len(world.upstream.calls) == 1, "the first poll waits a whole interval after the first read"
    await world.clock.advance(0.01)
    assert world.upstream.reads(DOC) == ["alice", "alice"], "polled with the subscriber's own credential"
    assert world.changes() == [], "the first poll of unchanged content tells nothing"


@pytest.mark.invariant(9)
async def test_a_change_is_told_once_and_then_polled_at_the_interval(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    await world.clock.advance(5.0)
    key = WatchKey("resource", DOC, "alice")
    assert world.changes() == [(key, fp(DOC, "v2"))]
    assert [e.generation for e in world.events if not e.baseline] == [1]
    await world.clock.advance(10.0)
    assert world.changes() == [(key, fp(DOC, "v2"))]
    assert len(world.upstream.reads(DOC)) == 4


async def test_a_public_result_is_one_watch_that_each_context_joins_after_its_own_read(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    alice = await world.registry.acquire("resource", DOC, ALICE)
    bob = await world.registry.acquire("resource", DOC, BOB)
    assert alice is not None and bob is not None
    key = WatchKey("resource", DOC, PUBLIC)
    assert alice.key == bob.key == key
    assert (alice.context, bob.context) == ("alice", "bob")
    assert world.upstream.reads(DOC) == ["alice", "bob"], "bob proves access with a read of his own"
    assert world.watches() == {key: 2}
    assert [e.key for e in world.events if e.baseline] == [key], "one first look is published"
    assert world.gauge("mcp_sidecar_watches", kind="resource") == 1
    assert world.gauge("mcp_sidecar_watched_contexts") == 1
    again = await world.registry.acquire("resource", DOC, BOB)
    assert again is not None and again.key == key
    assert world.upstream.reads(DOC) == ["alice", "bob", "bob"], "a verified context joins with a sync read"
    assert world.watches() == {key: 3}


@pytest.mark.invariant(10)
async def test_a_private_result_is_watched_per_context_with_its_own_credential(world: World) -> None:
    world.upstream.private[(DOC, "alice")] = contents(DOC, "alice's")
    world.upstream.private[(DOC, "bob")] = contents(DOC, "bob's")
    alice = await world.registry.acquire("resource", DOC, ALICE)
    bob = await world.registry.acquire("resource", DOC, BOB)
    assert alice is not None and bob is not None
    assert alice.key == WatchKey("resource", DOC, "alice")
    assert bob.key == WatchKey("resource", DOC, "bob")
    assert world.gauge("mcp_sidecar_watches", kind="resource") == 2
    assert world.gauge("mcp_sidecar_watched_contexts") == 2
    world.upstream.calls.clear()
    world.upstream.private[(DOC, "bob")] = contents(DOC, "bob's, edited")
    await world.clock.advance(5.0)
    assert sorted(world.upstream.reads(DOC)) == ["alice", "bob"]
    assert world.changes() == [(WatchKey("resource", DOC, "bob"), fp(DOC, "bob's, edited"))]


async def test_a_public_watch_is_polled_anonymously_when_it_can_and_else_with_a_holders_credential(
    world: World,
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    alice = await world.registry.acquire("resource", DOC, ALICE)
    anon = await world.registry.acquire("resource", DOC, ANON)
    bob = await world.registry.acquire("resource", DOC, BOB)
    assert alice is not None and anon is not None and bob is not None
    world.upstream.calls.clear()
    await world.clock.advance(5.0)
    assert world.upstream.reads(DOC) == ["anon"]
    anon.release()
    alice.release()
    await world.clock.advance(5.0)
    assert world.upstream.reads(DOC) == ["anon", "bob"], "the credentials of contexts that left are not used"


async def test_concurrent_first_interests_share_one_read_per_context(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.gate = asyncio.Event()
    laptop = Identity("alice", ALICE.headers, client="alice-phone")
    first = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    second = asyncio.create_task(world.registry.acquire("resource", DOC, laptop))
    other = asyncio.create_task(world.registry.acquire("resource", DOC, BOB))
    await settle()
    assert sorted(world.upstream.reads(DOC)) == ["alice", "bob"]
    world.upstream.gate.set()
    handles = await asyncio.gather(first, second, other)
    assert [h.key.context if h else None for h in handles] == ["alice", "alice", "bob"]
    assert world.watches() == {WatchKey("resource", DOC, "alice"): 2, WatchKey("resource", DOC, "bob"): 1}
    assert len(world.upstream.calls) == 2


async def test_one_caller_giving_up_does_not_cancel_the_read_others_wait_for(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.gate = asyncio.Event()
    quitter = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    stayer = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    await settle()
    quitter.cancel()
    await settle()
    world.upstream.gate.set()
    handle = await stayer
    assert handle is not None
    assert quitter.cancelled()
    assert world.watches() == {handle.key: 1}
    assert len(world.upstream.calls) == 1


@pytest.mark.invariant(16)
async def test_joining_a_live_watch_waits_for_a_look_that_starts_after_it_asked(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    world.upstream.gate = asyncio.Event()
    joiners = [asyncio.create_task(world.registry.acquire("resource", DOC, ALICE)) for _ in range(3)]
    await settle()
    assert world.upstream.reads(DOC) == ["alice", "alice"], "everyone joining meanwhile shares one look"
    assert not any(joiner.done() for joiner in joiners)
    world.upstream.gate.set()
    handles = await asyncio.gather(*joiners)
    assert all(handle is not None for handle in handles)
    key = WatchKey("resource", DOC, "alice")
    assert world.changes() == [(key, fp(DOC, "v2"))], "the change the look saw is told before the ack"
    assert world.watches() == {key: 4}


async def test_a_joiner_whose_look_finds_the_resource_gone_gets_nothing_and_holds_nothing(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    first = await world.registry.acquire("resource", DOC, ALICE)
    assert first is not None
    del world.upstream.resources[DOC]
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    key = WatchKey("resource", DOC, "alice")
    assert world.changes() == [(key, ABSENT)], "the streams already watching it are told it is gone"
    assert world.watches() == {key: 1}
    first.release()
    await world.clock.advance(8.0)
    assert world.watches() == {}


async def test_the_ack_is_refused_when_the_upstream_cannot_answer_the_first_read(world: World) -> None:
    world.upstream.failure = UpstreamUnavailable(URL, "connection refused")
    with pytest.raises(UpstreamUnavailable):
        await world.registry.acquire("resource", DOC, ALICE)
    assert world.watches() == {}
    world.upstream.failure = None
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None, "a failure is not remembered"


async def test_a_list_is_watched_like_a_resource(world: World) -> None:
    world.upstream.pages["tools/list"] = [{"tools": [{"name": "a"}]}]
    handle = await world.registry.acquire("tools_list", None, ANON)
    assert handle is not None
    assert handle.key == WatchKey("tools_list", None, "anon")
    assert world.gauge("mcp_sidecar_watches", kind="tools_list") == 1
    world.upstream.pages["tools/list"] = [{"tools": [{"name": "a"}, {"name": "b"}]}]
    await world.clock.advance(5.0)
    assert [key for key, _ in world.changes()] == [handle.key]


# -- missing resources ---------------------------------------------------------------------------------------


async def test_a_missing_resource_is_not_read_again_so_soon_by_the_same_context(world: World) -> None:
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    assert world.upstream.reads(DOC) == ["alice"]
    assert world.watches() == {}
    assert await world.registry.acquire("resource", DOC, BOB) is None
    assert world.upstream.reads(DOC) == ["alice", "bob"], "missing for one context says nothing of another's"
    assert await world.registry.acquire("resource", OTHER, ALICE) is None
    assert world.upstream.reads(OTHER) == ["alice"]


async def test_a_missing_resource_is_read_again_by_the_same_context_once_an_interval_has_passed(
    world: World,
) -> None:
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    world.upstream.resources[DOC] = contents(DOC, "v1")
    moment = 1 / 1024  # under the 5 ms a thousandth of the interval is, and exact in binary
    await world.clock.advance(5.0 - moment)
    assert await world.registry.acquire("resource", DOC, ALICE) is None, "remembered missing for one interval"
    assert world.upstream.reads(DOC) == ["alice"]
    await world.clock.advance(moment)
    assert await world.registry.acquire("resource", DOC, ALICE) is not None, "and read again once it passed"
    assert world.upstream.reads(DOC) == ["alice", "alice"]


async def test_a_missing_resource_is_read_again_once_a_forwarded_read_of_that_context_finds_it(
    world: World,
) -> None:
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    assert await world.registry.acquire("resource", DOC, BOB) is None
    world.upstream.resources[DOC] = contents(DOC, "v1")
    answer = {"result": contents(DOC, "v1")}
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, answer, world.registry.ticket())
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert await world.registry.acquire("resource", DOC, BOB) is None, "bob's record stands"
    assert world.upstream.reads(DOC) == ["alice", "bob", "alice"]


async def test_missing_resources_are_read_again_after_the_resource_list_changes(world: World) -> None:
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    lists = WatchKey("resources_list", None, PUBLIC)
    world.bus.deliver(ChangeEvent(lists, "fp-elsewhere", 0, 0.0, baseline=True))
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    assert world.upstream.reads(DOC) == ["alice"], "another replica's first look changes nothing"
    world.bus.deliver(ChangeEvent(WatchKey("tools_list", None, PUBLIC), "fp-tools", 1, 0.0))
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    assert world.upstream.reads(DOC) == ["alice"], "a tool list change says nothing of resources"
    world.bus.deliver(ChangeEvent(lists, "fp-new", 1, 0.0))
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert world.upstream.reads(DOC) == ["alice", "alice"]


# -- lingering ----------------------------------------------------------------------------------------------


async def test_the_last_release_lingers_unpolled_then_ends(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    await world.clock.advance(1.0)
    handle.release()
    handle.release()
    assert world.watches() == {handle.key: 0}
    await world.clock.advance(8 - JUST)
    assert world.upstream.reads(DOC) == ["alice"], "no stream holds it: no credential to poll with"
    assert world.watches() == {handle.key: 0}
    await world.clock.advance(JUST)
    assert world.watches() == {}
    assert world.gauge("mcp_sidecar_watches", kind="resource") == 0
    assert world.gauge("mcp_sidecar_watched_contexts") == 0
    again = await world.registry.acquire("resource", DOC, ALICE)
    assert again is not None
    assert [e.baseline for e in world.events] == [True, True], "an ended watch starts anew, with a first look"


async def test_a_client_coming_back_while_it_lingers_takes_it_up_again(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    handle.release()
    await world.clock.advance(7.0)
    again = await world.registry.acquire("resource", DOC, ALICE)
    assert again is not None
    assert [e.baseline for e in world.events] == [True], "taken up again, not started anew"
    assert world.upstream.reads(DOC) == ["alice", "alice"], "with a look that starts after it asked"
    await world.clock.advance(2.0)
    assert world.watches() == {handle.key: 1}, "its linger was called off"
    world.upstream.resources[DOC] = contents(DOC, "v2")
    await world.clock.advance(5.0)
    assert world.changes() == [(handle.key, fp(DOC, "v2"))]


async def test_a_release_while_another_stream_holds_the_watch_keeps_it_live(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    first = await world.registry.acquire("resource", DOC, ALICE)
    second = await world.registry.acquire("resource", DOC, ALICE)
    assert first is not None and second is not None
    first.release()
    first.release()
    assert world.watches() == {first.key: 1}
    world.upstream.calls.clear()
    await world.clock.advance(20.0)
    assert world.upstream.reads(DOC) == ["alice"] * 4
    assert world.watches() == {first.key: 1}


async def _a_first_read_whose_only_caller_gave_up(world: World) -> None:
    """Alice's first read of DOC, cancelled while the upstream holds it, then answered."""
    world.upstream.gate = asyncio.Event()
    quitter = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    await settle()
    quitter.cancel()
    world.upstream.gate.set()
    await settle()


async def test_a_linger_of_zero_ends_the_watch_with_its_last_stream_and_a_first_read_nobody_waits_for() -> None:
    world = _world(CONFIG.model_copy(update={"linger_ms": 0}))
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    handle.release()
    await world.clock.advance(0.0)
    assert world.watches() == {}, "a linger of 0 ends it at once"
    # A first look whose only caller gave up: nobody is left to take it (callers hold it as they are answered).
    await _a_first_read_whose_only_caller_gave_up(world)
    assert world.watches() == {handle.key: 0}
    await world.clock.advance(0.0)
    assert world.watches() == {}
    await world.registry.aclose()


async def test_a_first_read_nobody_waits_for_any_more_leaves_a_watch_that_lingers(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    await _a_first_read_whose_only_caller_gave_up(world)
    key = WatchKey("resource", DOC, "alice")
    assert world.watches() == {key: 0}
    await world.clock.advance(7.99)
    assert world.watches() == {key: 0}
    await world.clock.advance(0.01)
    assert world.watches() == {}


async def test_a_caller_of_a_first_read_holds_its_watch_as_it_is_answered() -> None:
    bus = GatedBus()
    world = _world(CONFIG.model_copy(update={"linger_ms": 0}), bus=bus)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    late = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    await bus.published.wait()  # its first look is published: the caller resumes a loop turn or two later
    key = WatchKey("resource", DOC, "alice")
    assert world.watches() == {key: 1}, "held already: a stalled loop cannot end it before the caller resumes"
    assert world.clock.pending() == 1, "no linger timer, only its first poll"
    handle = await late
    assert handle is not None and handle.key == key
    assert world.upstream.reads(DOC) == ["alice"], "one first read"
    assert [e.baseline for e in world.events] == [True]
    await world.clock.advance(5.0)
    assert world.upstream.reads(DOC) == ["alice"] * 2, "and it polls"
    await world.registry.aclose()


# -- what forwarded requests teach -----------------------------------------------------------------------------


async def test_a_forwarded_read_showing_new_content_is_told_without_a_poll(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    ticket = world.registry.ticket()
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, ticket)
    await settle()
    assert world.changes() == [(handle.key, fp(DOC, "v2"))]
    assert world.upstream.reads(DOC) == ["alice"]
    # Bob's private read of the same URI, and a read of a URI nobody watches, concern no watch of alice's.
    world.registry.after_forward(
        "resources/read", {"uri": DOC}, BOB, {"result": contents(DOC, "bob's")}, world.registry.ticket()
    )
    world.registry.after_forward(
        "resources/read", {"uri": OTHER}, ALICE, {"result": contents(OTHER, "x")}, world.registry.ticket()
    )
    await settle()
    assert world.changes() == [(handle.key, fp(DOC, "v2"))]


@pytest.mark.invariant(7)
async def test_a_forwarded_read_older_than_the_last_look_applied_changes_nothing(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    stale = world.registry.ticket()
    await world.clock.advance(5.0)  # a poll that started later is applied first
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "old")}, stale)
    await settle()
    assert world.changes() == []


async def test_a_forwarded_public_read_is_evidence_for_the_public_watch(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None and handle.key.context == PUBLIC
    result = contents(DOC, "v2", cacheScope="public")
    world.registry.after_forward("resources/read", {"uri": DOC}, BOB, {"result": result}, world.registry.ticket())
    await settle()
    assert world.changes() == [(handle.key, fp(DOC, "v2"))]


async def test_a_forwarded_read_that_cannot_be_fingerprinted_teaches_nothing(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    deep: object = "leaf"
    for _ in range(300):  # orjson writes 254 levels at most
        deep = [deep]
    answer = {"result": {"contents": deep}}
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, answer, world.registry.ticket())
    await settle()
    assert world.changes() == []


@pytest.mark.parametrize("code", [-32602, -32002])
async def test_a_forwarded_not_found_tells_that_contexts_own_watch_the_resource_is_gone(
    world: World, code: int
) -> None:
    world.upstream.private[(DOC, "alice")] = contents(DOC, "alice's")
    world.upstream.private[(DOC, "bob")] = contents(DOC, "bob's")
    alice = await world.registry.acquire("resource", DOC, ALICE)
    bob = await world.registry.acquire("resource", DOC, BOB)
    assert alice is not None and bob is not None
    error = {"error": {"code": code, "message": "Resource not found"}}
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, error, world.registry.ticket())
    await settle()
    assert world.changes() == [(alice.key, ABSENT)], "bob's watch is not told: hidden from alice is not gone"
    assert world.upstream.reads(DOC) == ["alice", "bob"], "told without a poll"


async def test_a_forwarded_not_found_leaves_a_public_watch_alone(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    error = {"error": {"code": -32002, "message": "Resource not found"}}
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, error, world.registry.ticket())
    await settle()
    assert world.changes() == []


@pytest.mark.parametrize(
    ("method", "params", "answer"),
    [
        ("resources/read", {"uri": DOC}, {"error": {"code": -32603, "message": "Internal error"}}),
        ("resources/read", {"uri": DOC}, {"error": "not an object"}),
        ("resources/read", {"uri": 7}, {"error": {"code": -32002, "message": "Resource not found"}}),
        ("resources/read", {}, {"result": contents(DOC, "v2")}),
        ("tools/list", {"uri": DOC}, {"error": {"code": -32002, "message": "Resource not found"}}),
        ("prompts/get", {"uri": DOC}, {"result": contents(DOC, "v2")}),
    ],
)
async def test_other_forwarded_answers_teach_the_watch_nothing(
    world: World, method: str, params: dict[str, object], answer: dict[str, object]
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    world.registry.after_forward(method, params, ALICE, answer, world.registry.ticket())
    await world.clock.advance(1.0)
    assert world.changes() == []
    assert world.upstream.reads(DOC) == ["alice"], "no write either: nothing polls sooner"


async def test_a_write_makes_the_public_watches_and_the_writers_own_poll_soon(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    world.upstream.private[(OTHER, "alice")] = contents(OTHER, "alice's")
    world.upstream.private[(OTHER, "bob")] = contents(OTHER, "bob's")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", DOC, identity) is not None
        assert await world.registry.acquire("resource", OTHER, identity) is not None
    world.upstream.calls.clear()
    await world.clock.advance(1.0)
    world.registry.after_forward("tools/call", {"name": "edit"}, ALICE, {"result": {}}, world.registry.ticket())
    await world.clock.advance(0)
    looked = [("resources/read", DOC, "alice"), ("resources/read", OTHER, "alice")]
    assert sorted(world.upstream.calls) == looked, "a lone write: at once, only the public and the writer's own"
    world.upstream.calls.clear()
    world.registry.after_forward("tools/call", {"name": "edit"}, ALICE, {"result": {}}, world.registry.ticket())
    world.registry.after_forward("tools/call", {"name": "edit"}, ALICE, {"result": {}}, world.registry.ticket())
    await world.clock.advance(0.09)
    assert world.upstream.calls == [], "writes within the debounce wait for its end"
    await world.clock.advance(0.5)
    assert sorted(world.upstream.calls) == looked, "and are one more look each"


# -- refusals, recovery, other replicas ----------------------------------------------------------------------------


async def test_a_refused_forwarded_read_ends_that_contexts_subscriptions_and_it_must_read_again(
    world: World,
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    world.upstream.private[(OTHER, "bob")] = contents(OTHER, "bob's")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert await world.registry.acquire("resource", DOC, BOB) is not None
    assert await world.registry.acquire("resource", OTHER, BOB) is not None
    world.registry.refused("resources/read", {"uri": DOC}, BOB)
    world.registry.refused("resources/read", {"uri": OTHER}, BOB)
    world.registry.refused("tools/call", {"uri": DOC}, BOB)
    world.registry.refused("resources/read", {"uri": 7}, BOB)
    assert world.refusals == [
        (WatchKey("resource", DOC, PUBLIC), "bob"),
        (WatchKey("resource", OTHER, "bob"), "bob"),
    ]
    world.upstream.calls.clear()
    assert await world.registry.acquire("resource", DOC, BOB) is not None
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert world.upstream.reads(DOC) == ["bob", "alice"]
    assert [e.baseline for e in world.events].count(True) == 2, "bob's read joins the public watch again"


async def test_a_refused_poll_of_a_public_watch_concerns_only_the_context_it_was_polled_as(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    world.upstream.private[(OTHER, "bob")] = contents(OTHER, "bob's")
    assert await world.registry.acquire("resource", DOC, BOB) is not None
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert await world.registry.acquire("resource", OTHER, BOB) is not None
    world.upstream.failure = UpstreamHTTPError(URL, 401, "Unauthorized")
    await world.clock.advance(5.0)
    assert sorted(world.refusals, key=str) == sorted(
        [(WatchKey("resource", DOC, PUBLIC), "bob"), (WatchKey("resource", OTHER, "bob"), "bob")], key=str
    )
    world.upstream.failure = None
    world.upstream.calls.clear()
    assert await world.registry.acquire("resource", DOC, BOB) is not None
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert world.upstream.reads(DOC) == ["bob", "alice"], "bob proves access again; alice joins with a sync"


async def test_a_poll_refused_after_its_watch_ended_ends_no_contexts_subscriptions(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    world.upstream.gate = asyncio.Event()
    await world.clock.advance(5.0)
    assert world.upstream.reads(DOC) == ["alice", "alice"], "a poll in flight, held by the upstream"
    handle.release()
    world.upstream.failure = UpstreamHTTPError(URL, 401, "Unauthorized")
    world.upstream.gate.set()  # the refusal is on its way back...
    world.clock.fire_next()  # ...when the linger ends the watch: the poll outlives it
    await settle()
    assert world.watches() == {}
    assert world.refusals == [], "a refusal for a watch that is gone concerns nobody"
    assert _failures(caplog) == [], "nor is it a crash"


async def test_every_failing_watch_reads_again_as_soon_as_the_upstream_is_back(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    world.upstream.failure = UpstreamUnavailable(URL, "connection refused")
    await world.clock.advance(5.0)
    world.upstream.failure = None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    assert world.upstream.on_recovered is not None
    world.upstream.on_recovered()
    await world.clock.advance(0.3)
    assert len(world.upstream.reads(DOC)) == 3, "not after its backoff: now"
    assert world.changes() == [(WatchKey("resource", DOC, "alice"), fp(DOC, "v2"))]


async def test_a_change_another_replica_told_is_not_told_again_by_this_ones_poll(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    world.bus.deliver(ChangeEvent(handle.key, fp(DOC, "v2"), 1, 0.0))
    await world.clock.advance(5.0)
    assert world.changes() == [(handle.key, fp(DOC, "v2"))]


async def test_another_replicas_first_look_is_not_adopted(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    world.bus.deliver(ChangeEvent(handle.key, fp(DOC, "v2"), 0, 0.0, baseline=True))
    await world.clock.advance(5.0)
    assert world.changes() == [(handle.key, fp(DOC, "v2"))], "this replica's poll tells the change"


async def test_the_cache_is_told_every_look_a_watch_applies(world: World) -> None:
    seen: list[tuple[WatchKey, str]] = []
    world.registry.on_observation(lambda key, fingerprint, _: seen.append((key, fingerprint)))
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    await world.clock.advance(5.0)
    assert seen == [(handle.key, fp(DOC, "v1"))] * 2


async def test_a_failing_publish_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    world = _world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None

    def broken(event: ChangeEvent) -> None:
        raise RuntimeError("the bus is broken")

    async def publish(event: ChangeEvent) -> None:
        broken(event)

    world.bus.publish = publish  # type: ignore[method-assign]
    world.registry.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, world.registry.ticket()
    )
    with caplog.at_level(logging.ERROR, logger="sidecar.watch.registry"):
        await settle()
    [record] = [r for r in caplog.records if r.name == "sidecar.watch.registry"]
    assert record.getMessage() == "a registry task failed"
    assert record.exc_info is not None, "with the failure's traceback"
    assert isinstance(record.exc_info[1], RuntimeError) and str(record.exc_info[1]) == "the bus is broken"


# -- a client's rate of first reads -------------------------------------------------------------------------------


async def test_first_reads_over_a_clients_rate_wait_their_turn_in_its_own_fair_share() -> None:
    world = _world(CONFIG.model_copy(update={"max_baselines_per_s": 1.0}), capacity=2, per_client=1)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.resources[OTHER] = contents(OTHER, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None, "within the rate: at once"
    await world.fair_share.acquire(ALICE.client, within_s=60, limit="test")  # alice's forwarded request
    paced = [asyncio.create_task(world.registry.acquire("resource", OTHER, ALICE)) for _ in range(2)]
    await settle()
    assert world.upstream.reads(OTHER) == [], "over the rate: behind alice's own request (a slot is free)"
    phone = await world.registry.acquire("resource", OTHER, ALICE_PHONE)
    assert phone is not None, "her phone, within its own rate, does not wait on her laptop's turn"
    assert world.upstream.reads(OTHER) == ["alice"]
    world.fair_share.release(ALICE.client)
    handles = await asyncio.gather(*paced)
    assert all(handle is not None for handle in handles)
    assert world.upstream.reads(OTHER) == ["alice", "alice"], "the laptop's two first reads were one"
    assert world.watches()[WatchKey("resource", OTHER, "alice")] == 3
    await world.registry.aclose()


async def test_a_first_read_that_waits_too_long_for_its_turn_is_refused() -> None:
    config = CONFIG.model_copy(update={"max_baselines_per_s": 1.0, "baseline_wait_s": 0.001})
    world = _world(config, capacity=2, per_client=1)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    await world.fair_share.acquire(ALICE.client, within_s=60, limit="test")
    with pytest.raises(TooManyRequests):
        await world.registry.acquire("resource", OTHER, ALICE)
    assert world.upstream.reads(OTHER) == []
    assert world.gauge("mcp_sidecar_limit_rejections_total", limit="baseline_wait") == 1
    world.fair_share.release(ALICE.client)
    await world.registry.aclose()


async def test_a_joiners_look_over_the_rate_waits_its_turn_too() -> None:
    world = _world(CONFIG.model_copy(update={"max_baselines_per_s": 1.0}), capacity=2, per_client=1)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    await world.fair_share.acquire(ALICE.client, within_s=60, limit="test")
    paced = [asyncio.create_task(world.registry.acquire("resource", DOC, ALICE)) for _ in range(2)]
    await settle()
    assert world.upstream.reads(DOC) == ["alice"]
    assert await world.registry.acquire("resource", DOC, ALICE_PHONE) is not None, "not behind the laptop's turn"
    assert world.upstream.reads(DOC) == ["alice", "alice"]
    world.fair_share.release(ALICE.client)
    assert all(await asyncio.gather(*paced))
    assert world.upstream.reads(DOC) == ["alice", "alice", "alice"], "the laptop's two joins shared one look"
    await world.registry.aclose()


# -- shutdown ---------------------------------------------------------------------------------------------------


async def test_shutdown_stops_every_watch_and_cancels_first_reads_in_flight() -> None:
    world = _world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.resources[OTHER] = contents(OTHER, "v1")
    live = await world.registry.acquire("resource", DOC, ALICE)
    lingering = await world.registry.acquire("resource", OTHER, BOB)
    assert live is not None and lingering is not None
    lingering.release()
    world.registry.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.ticket())
    world.upstream.gate = asyncio.Event()
    starting = asyncio.create_task(world.registry.acquire("resource", "file:///new", ALICE))
    joining = asyncio.create_task(world.registry.acquire("resource", DOC, BOB))
    await settle()
    await world.registry.aclose()
    assert world.watches() == {}
    with pytest.raises(asyncio.CancelledError):
        await starting
    with pytest.raises(asyncio.CancelledError):
        await joining
    world.upstream.gate = None
    world.upstream.calls.clear()
    world.bus.deliver(ChangeEvent(WatchKey("resources_list", None, PUBLIC), "fp", 1, 0.0))
    await world.clock.advance(60.0)
    assert world.upstream.calls == [], "nothing polls after shutdown, hinted or not"
    live.release()


async def test_shutdown_leaves_nothing_scheduled_and_finishes_what_it_had_started(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = _world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.resources[OTHER] = contents(OTHER, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    lingering = await world.registry.acquire("resource", OTHER, ALICE)
    assert lingering is not None
    lingering.release()
    world.registry.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.ticket())
    world.registry.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, world.registry.ticket()
    )
    world.upstream.gate = asyncio.Event()
    starting = asyncio.create_task(world.registry.acquire("resource", "file:///new", BOB))
    await settle()
    await world.registry.aclose()
    assert world.changes() == [(WatchKey("resource", DOC, "alice"), fp(DOC, "v2"))], "told before it returned"
    assert world.clock.pending() == 0, "no poll, linger or debounce is left to fire"
    with pytest.raises(asyncio.CancelledError):
        await starting
    await settle()
    assert _failures(caplog) == []


async def test_shutdown_does_not_fail_for_a_publish_that_failed(caplog: pytest.LogCaptureFixture) -> None:
    world = _world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None

    async def publish(event: ChangeEvent) -> None:
        raise RuntimeError("the bus is broken")

    world.bus.publish = publish  # type: ignore[method-assign]
    world.registry.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, world.registry.ticket()
    )
    await world.registry.aclose()
    assert world.clock.pending() == 0


# -- more than one context at once ----------------------------------------------------------------------------


async def test_contexts_joining_a_public_watch_at_once_share_a_look_once_each_proved_access(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", DOC, identity) is not None
    world.upstream.calls.clear()
    world.upstream.gate = asyncio.Event()
    joiners = [asyncio.create_task(world.registry.acquire("resource", DOC, i)) for i in (ALICE, BOB, CAROL, ANON)]
    await settle()
    assert sorted(world.upstream.reads(DOC)) == ["alice", "anon", "carol"], (
        "alice and bob share one look; carol and anon, not verified yet, each read for themselves"
    )
    world.upstream.gate.set()
    assert all(await asyncio.gather(*joiners))
    assert world.watches() == {WatchKey("resource", DOC, PUBLIC): 6}


async def _each_proves_access_with_its_own_read(world: World) -> None:
    """Alice and Bob join the public watch of DOC at once: each is read with its own credential, none shares."""
    world.upstream.calls.clear()
    world.upstream.gate = asyncio.Event()
    joiners = [asyncio.create_task(world.registry.acquire("resource", DOC, i)) for i in (ALICE, BOB)]
    await settle()
    assert sorted(world.upstream.reads(DOC)) == ["alice", "bob"]
    world.upstream.gate.set()
    assert all(await asyncio.gather(*joiners))


async def test_a_context_refused_must_prove_access_again_before_sharing_a_look(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", DOC, identity) is not None
    world.registry.refused("resources/read", {"uri": DOC}, BOB)
    await _each_proves_access_with_its_own_read(world)


async def test_a_context_whose_poll_was_refused_must_prove_access_again(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    for identity in (BOB, ALICE):
        assert await world.registry.acquire("resource", DOC, identity) is not None
    world.upstream.failure = UpstreamHTTPError(URL, 403, "Forbidden")
    await world.clock.advance(5.0)
    assert world.refusals == [(WatchKey("resource", DOC, PUBLIC), "bob")]
    world.upstream.failure = None
    await _each_proves_access_with_its_own_read(world)


# -- a watch's first moments --------------------------------------------------------------------------------------


async def test_a_first_read_of_a_watch_lingering_longer_restarts_its_linger(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    alice = await world.registry.acquire("resource", DOC, ALICE)
    assert alice is not None
    alice.release()
    await world.clock.advance(7.0)
    world.upstream.gate = asyncio.Event()
    bob = asyncio.create_task(world.registry.acquire("resource", DOC, BOB))
    await settle()
    bob.cancel()
    world.upstream.gate.set()
    await settle()
    await world.clock.advance(8 - JUST)
    assert world.watches() == {alice.key: 0}
    await world.clock.advance(JUST)
    assert world.watches() == {}


async def test_a_watch_joined_while_its_first_look_is_published_ends_after_its_last_stream() -> None:
    bus = GatedBus()
    world = _world(bus=bus)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    bus.gate = asyncio.Event()
    first = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    await settle()
    joiner = await world.registry.acquire("resource", DOC, ALICE_PHONE)
    assert joiner is not None, "the watch is there while its first look is published: joined with a look"
    first.cancel()
    bus.gate.set()
    await settle()
    assert world.watches() == {joiner.key: 1}
    await world.clock.advance(20.0)
    assert world.watches() == {joiner.key: 1}, "held: it does not end"
    assert len(world.upstream.reads(DOC)) == 2 + 4, "and it polls"
    joiner.release()
    await world.clock.advance(8.0)
    assert world.watches() == {}
    await world.registry.aclose()


async def test_the_first_look_is_stamped_with_the_time_it_was_seen(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    [event] = world.events
    assert isinstance(event.detected_at, float) and event.detected_at > 0


async def test_the_cache_is_told_each_look_with_its_ticket(world: World) -> None:
    tickets: list[int] = []
    world.registry.on_observation(lambda key, fingerprint, ticket: tickets.append(ticket))
    world.upstream.resources[DOC] = contents(DOC, "v1")
    before = world.registry.ticket()
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    await world.clock.advance(10.0)
    assert len(tickets) == 3
    assert before < tickets[0] < tickets[1] < tickets[2] < world.registry.ticket()


async def test_starting_and_ending_a_watch_are_logged_without_its_uri(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    with caplog.at_level(logging.DEBUG, logger="sidecar.watch.registry"):
        handle = await world.registry.acquire("resource", DOC, ALICE)
        assert handle is not None
        handle.release()
        await world.clock.advance(8.0)
    lines = [
        (r.getMessage(), getattr(r, "watch", None), getattr(r, "kind", None))
        for r in caplog.records
        if r.name == "sidecar.watch.registry"
    ]
    assert lines == [
        ("watch started", handle.key.short_hash, "resource"),
        ("watch stopped", handle.key.short_hash, "resource"),
    ]


# -- other replicas ------------------------------------------------------------------------------------------------


async def test_the_lease_is_tracked_while_streams_hold_a_watch_and_polls_need_it() -> None:
    coordinator = Coordinator()
    world = _world(coordinator=coordinator)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    first = await world.registry.acquire("resource", DOC, ALICE)
    assert first is not None
    assert coordinator.tracked == [first.key], "tracked with its first stream"
    second = await world.registry.acquire("resource", DOC, ALICE)
    assert second is not None
    assert coordinator.tracked == [first.key], "and only then"
    coordinator.lease = False
    world.upstream.calls.clear()
    await world.clock.advance(10.0)
    assert world.upstream.calls == [], "another replica holds the lease: it polls"
    first.release()
    assert coordinator.untracked == []
    second.release()
    assert coordinator.untracked == [first.key]
    await world.registry.aclose()


async def test_another_replicas_writes_hint_the_watches_they_concern() -> None:
    coordinator = Coordinator()
    world = _world(coordinator=coordinator)
    world.upstream.private[(DOC, "alice")] = contents(DOC, "alice's")
    world.upstream.private[(DOC, "bob")] = contents(DOC, "bob's")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", DOC, identity) is not None
    world.upstream.calls.clear()
    assert coordinator.others_wrote is not None
    coordinator.others_wrote(frozenset({"bob"}))
    await world.clock.advance(0.5)
    assert world.upstream.calls == [("resources/read", DOC, "bob")]
    world.registry.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.ticket())
    await world.clock.advance(0.5)
    assert coordinator.announced == [frozenset({"alice"})], "this replica's writes are told to the others"
    await world.registry.aclose()


async def test_hinted_polls_over_the_hint_budget_are_deferred() -> None:
    world = _world(CONFIG.model_copy(update={"max_hinted_polls_per_s": 1.0}))
    uris = [f"file:///{n}" for n in range(4)]
    for uri in uris:
        world.upstream.resources[uri] = contents(uri, "v1", cacheScope="public")
        assert await world.registry.acquire("resource", uri, ALICE) is not None
    world.upstream.calls.clear()
    world.registry.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.ticket())
    await world.clock.advance(0.5)
    assert len(world.upstream.calls) == 1, "a burst of per_s, the rest one a second"
    await world.clock.advance(2.0)
    assert len(world.upstream.calls) == 3
    await world.clock.advance(1.0)
    assert len(world.upstream.calls) == 4
    await world.registry.aclose()


async def test_a_hinted_poll_links_the_writes_that_may_concern_it(world: World, spans: InMemorySpanExporter) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    world.upstream.private[(OTHER, "alice")] = contents(OTHER, "alice's")
    world.upstream.private[(OTHER, "bob")] = contents(OTHER, "bob's")
    world.upstream.private[(OTHER, "carol")] = contents(OTHER, "carol's")
    for identity in (ALICE, BOB, CAROL):
        assert await world.registry.acquire("resource", DOC, identity) is not None
        assert await world.registry.acquire("resource", OTHER, identity) is not None
    writes = {}
    for identity in (ALICE, BOB):
        with tracing().request("tools/call", {}, None) as span:  # the server span of that client's write
            world.registry.after_forward("tools/call", {}, identity, {"result": {}}, world.registry.ticket())
            writes[identity.context] = span.get_span_context()
    world.registry.after_forward("tools/call", {}, CAROL, {"result": {}}, world.registry.ticket())  # untraced
    await world.clock.advance(0.5)
    links = {
        span.attributes["mcp_sidecar.watch"]: [link.context for link in span.links]
        for span in spans.get_finished_spans()
        if span.name == "poll" and span.attributes is not None
    }
    assert links == {
        WatchKey("resource", DOC, PUBLIC).short_hash: [writes["alice"], writes["bob"]],
        WatchKey("resource", OTHER, "alice").short_hash: [writes["alice"]],
        WatchKey("resource", OTHER, "bob").short_hash: [writes["bob"]],
        WatchKey("resource", OTHER, "carol").short_hash: [],
    }


async def test_shutdown_waits_for_a_publish_in_flight_and_does_not_fail_for_one_that_fails() -> None:
    bus = GatedBus()
    world = _world(bus=bus)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    gate = bus.gate = asyncio.Event()
    world.registry.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, world.registry.ticket()
    )

    async def publish(event: ChangeEvent) -> None:
        await gate.wait()  # in flight too when shutdown begins, and failing once let through
        raise RuntimeError("the bus is broken")

    world.bus.publish = publish  # type: ignore[method-assign]
    world.registry.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v3")}, world.registry.ticket()
    )
    closing = asyncio.create_task(world.registry.aclose())
    await settle()
    assert not closing.done(), "a publish is in flight"
    bus.gate.set()
    await closing
    assert world.changes() == [(WatchKey("resource", DOC, "alice"), fp(DOC, "v2"))]


async def test_a_watch_the_upstream_can_push_is_subscribed_upstream_while_held_and_polls_on_its_notice(
    world: World,
) -> None:
    world.upstream.info = UpstreamInfo("legacy", {"resources": {"subscribe": True}}, None, None)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    await world.upstream.asked["resources/subscribe"].wait()
    assert ("resources/subscribe", DOC, "alice") in world.upstream.calls
    await settle()
    assert world.gauge("mcp_sidecar_native_watches") == 1
    assert world.gauge("mcp_sidecar_native_streams") == 1
    world.upstream.calls.clear()
    world.upstream.resources[DOC] = contents(DOC, "v2")
    world.upstream.pushed.put_nowait({"method": "notifications/resources/updated", "params": {"uri": DOC}})
    await settle()
    await world.clock.advance(0.5)
    assert world.upstream.reads(DOC) == ["alice"], "polled on the upstream's notice, not a whole interval later"
    assert world.changes() == [(handle.key, fp(DOC, "v2"))]
    world.upstream.resources[OTHER] = contents(OTHER, "v1")
    other = await world.registry.acquire("resource", OTHER, ALICE)
    assert other is not None
    await world.clock.advance(0.05)  # the notification stream's pause before it asks again, on the engine's clock
    assert ("resources/subscribe", OTHER, "alice") in world.upstream.calls
    assert world.gauge("mcp_sidecar_native_watches") == 2
    other.release()
    handle.release()
    await settle()
    assert world.gauge("mcp_sidecar_native_streams") == 0, "the credential leaves with its last stream"
    await world.clock.advance(8.0)
    assert world.watches() == {}
    assert world.gauge("mcp_sidecar_native_watches") == 0
