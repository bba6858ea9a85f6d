"""The registry driven through its own surface, at its edges: shutdown, the coordinator (the lease, other replicas'
changes and writes), the read budget's gauge, traced writes, and the upstream's own notifications. A real
`WatchRegistry` on the in-memory bus and the hand-moved clock, reading a scripted upstream (the rules these carry
out, the hint budget's among them, are the engine's playbooks: test_engine_*.py)."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.identity import PUBLIC
from sidecar.observability.tracing import tracing
from sidecar.upstream.answers import UpstreamInfo
from tests.kit import eventually
from tests.unit.watch.registry_world import (
    ALICE,
    BOB,
    CAROL,
    CONFIG,
    DOC,
    OTHER,
    Coordinator,
    GatedBus,
    World,
    failures,
    fp,
    make_world,
)
from tests.unit.watch.scripted_upstream import contents


async def test_shutdown_stops_every_watch_finishes_what_it_started_and_cancels_first_reads_in_flight(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = make_world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.resources[OTHER] = contents(OTHER, "v1")
    live = await world.registry.acquire("resource", DOC, ALICE)
    lingering = await world.registry.acquire("resource", OTHER, BOB)
    assert live is not None and lingering is not None
    lingering.release()
    world.registry.hearing.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.hearing.ticket())
    world.registry.hearing.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, world.registry.hearing.ticket()
    )
    world.upstream.gate = asyncio.Event()
    starting = asyncio.create_task(world.registry.acquire("resource", "file:///new", ALICE))
    joining = asyncio.create_task(world.registry.acquire("resource", DOC, BOB))
    await eventually(lambda: world.upstream.reads("file:///new") == ["alice"] and len(world.upstream.reads(DOC)) == 2)
    await world.registry.aclose()
    assert world.watches() == {}
    assert world.registry.looks_in_flight == 0, "nothing it started is left running"
    assert world.changes() == [(WatchKey("resource", DOC, "alice"), fp(DOC, "v2"))], "told before it returned"
    assert world.clock.pending() == 0, "no poll, linger or debounce is left to fire"
    with pytest.raises(asyncio.CancelledError):
        await starting
    with pytest.raises(asyncio.CancelledError):
        await joining
    assert failures(caplog) == []
    world.upstream.gate = None
    world.upstream.calls.clear()
    world.bus.deliver(ChangeEvent(WatchKey("resources_list", None, PUBLIC), "fp", 1, 0.0))
    assert world.clock.advance(60.0) == 0, "nothing is left to poll after shutdown, hinted or not"
    assert world.upstream.calls == [], "nothing polls after shutdown, hinted or not"
    live.release()


@pytest.mark.invariant(21)
async def test_a_replica_spends_its_share_of_the_fleets_read_budget() -> None:
    world = make_world(CONFIG.model_copy(update={"max_reads_per_s": 60}), replicas=lambda: 3)
    for uri in (DOC, OTHER):
        world.upstream.resources[uri] = contents(uri, "v1")
        assert await world.registry.acquire("resource", uri, ALICE) is not None
    await world.step(5.0, looks=1)  # both due now: the second waits for its slot of the budget, 1/20 s on
    assert world.gauge("mcp_sidecar_read_budget_per_second") == 20, "60 a second over 3 live replicas"
    await world.step(0.05, looks=1)
    assert world.upstream.reads(OTHER) == ["alice", "alice"]
    assert world.gauge("mcp_sidecar_queue_wait_seconds_count", limit="read_budget") == 1, "the wait it reports"
    assert world.gauge("mcp_sidecar_queue_wait_seconds_sum", limit="read_budget") == pytest.approx(0.05)
    await world.registry.aclose()


async def test_shutdown_waits_for_a_publish_in_flight_and_does_not_fail_for_one_that_fails() -> None:
    bus = GatedBus()
    world = make_world(bus=bus)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    gate = bus.gate = asyncio.Event()
    world.registry.hearing.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, world.registry.hearing.ticket()
    )

    async def publish(event: ChangeEvent) -> None:
        await gate.wait()  # in flight too when shutdown begins, and failing once let through
        raise RuntimeError("the bus is broken")

    world.bus.publish = publish  # type: ignore[method-assign]
    world.registry.hearing.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v3")}, world.registry.hearing.ticket()
    )
    closing = asyncio.create_task(world.registry.aclose())
    await eventually(lambda: world.clock.pending() == 0)  # every timer called off: it waits for what it started
    assert not closing.done(), "a publish is in flight"
    bus.gate.set()
    await closing
    assert world.changes() == [(WatchKey("resource", DOC, "alice"), fp(DOC, "v2"))]


async def test_a_watch_is_tracked_while_held_takes_what_other_replicas_told_as_its_own_and_polls_with_the_lease() -> (
    None
):
    coordinator = Coordinator()
    world = make_world(coordinator=coordinator)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    first = await world.registry.acquire("resource", DOC, ALICE)
    assert first is not None
    assert coordinator.tracked == [first.key], "tracked with its first stream"
    second = await world.registry.acquire("resource", DOC, ALICE)
    assert second is not None
    assert coordinator.tracked == [first.key], "and only then"
    assert coordinator.adopt is not None
    # Another replica told v2 (its message carried it to this replica's streams): this watch takes it.
    coordinator.adopt(ChangeEvent(first.key, fp(DOC, "v2"), 3, 0.0))
    assert world.changes() == [], "adopted, not published here"
    world.upstream.resources[DOC] = contents(DOC, "v2")
    await world.step(5.0, looks=1)
    assert world.changes() == [], "its own look at v2 is no change: it has it"
    # A change heard on the bus (told there by another replica) is taken as its own too.
    world.upstream.resources[DOC] = contents(DOC, "v3")
    world.bus.deliver(ChangeEvent(first.key, fp(DOC, "v3"), 4, 0.0))
    await world.step(5.0, looks=1)
    assert world.changes() == [(first.key, fp(DOC, "v3"))], "the other replica's, not told again by this one's poll"
    world.upstream.resources[DOC] = contents(DOC, "v4")
    await world.step(5.0, looks=1)
    assert world.changes() == [(first.key, fp(DOC, "v3")), (first.key, fp(DOC, "v4"))]
    coordinator.lease = False
    world.upstream.calls.clear()
    for _ in range(2):
        await world.step(5.0, looks=1)  # a poll comes due, and asks for the lease
    assert world.upstream.calls == [], "another replica holds the lease: it polls"
    first.release()
    assert coordinator.untracked == []
    second.release()
    assert coordinator.untracked == [first.key]
    await world.registry.aclose()
    assert coordinator.adopt is None, "closed: it hears no more"


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
            world.registry.hearing.after_forward(
                "tools/call", {}, identity, {"result": {}}, world.registry.hearing.ticket()
            )
            writes[identity.context] = span.get_span_context()
    world.registry.hearing.after_forward(
        "tools/call", {}, CAROL, {"result": {}}, world.registry.hearing.ticket()
    )  # untraced
    await world.step(0.5, looks=4)
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


async def test_a_watch_the_upstream_can_push_is_subscribed_upstream_while_held_and_polls_on_its_notice(
    world: World,
) -> None:
    world.upstream.info = UpstreamInfo("legacy", {"resources": {"subscribe": True}}, None, None)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    await world.upstream.asked["resources/subscribe"].wait()
    assert ("resources/subscribe", DOC, "alice") in world.upstream.calls
    await eventually(lambda: world.gauge("mcp_sidecar_native_watches") == 1)
    assert world.gauge("mcp_sidecar_native_watches") == 1
    assert world.gauge("mcp_sidecar_native_streams") == 1
    world.upstream.calls.clear()
    world.upstream.resources[DOC] = contents(DOC, "v2")
    world.upstream.pushed.put_nowait({"method": "notifications/resources/updated", "params": {"uri": DOC}})
    heard = {"method": "notifications/resources/updated"}
    await eventually(lambda: world.gauge("mcp_sidecar_upstream_notifications_total", **heard) == 1)
    await world.step(0.5, looks=1)
    assert world.upstream.reads(DOC) == ["alice"], "polled on the upstream's notice, not a whole interval later"
    assert world.changes() == [(handle.key, fp(DOC, "v2"))]
    world.upstream.resources[OTHER] = contents(OTHER, "v1")
    other = await world.registry.acquire("resource", OTHER, ALICE)
    assert other is not None
    pause_s = 0.05  # the notification stream's pause before it asks again, on the engine's clock
    await eventually(
        lambda: any(when <= world.clock.now() + pause_s for when in world.clock.due()),
        what="the notification stream pauses before it asks again",
    )
    world.clock.advance(pause_s)
    subscribed = ("resources/subscribe", OTHER, "alice")
    await eventually(lambda: subscribed in world.upstream.calls, what="the upstream asked to push OTHER's changes")
    await eventually(lambda: world.gauge("mcp_sidecar_native_watches") == 2, what="both watches pushed")
    other.release()
    handle.release()
    await eventually(lambda: world.gauge("mcp_sidecar_native_streams") == 0)
    assert world.gauge("mcp_sidecar_native_streams") == 0, "the credential leaves with its last stream"
    world.clock.advance(8.0)  # the linger's end
    await eventually(lambda: world.watches() == {}, what="the linger ends both watches")
    assert world.gauge("mcp_sidecar_native_watches") == 0


async def test_writes_here_and_on_other_replicas_hint_the_watches_they_concern_and_the_others_are_told() -> None:
    coordinator = Coordinator()
    world = make_world(coordinator=coordinator)
    world.upstream.private[(DOC, "alice")] = contents(DOC, "alice's")
    world.upstream.private[(DOC, "bob")] = contents(DOC, "bob's")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", DOC, identity) is not None
    world.upstream.calls.clear()
    assert coordinator.others_wrote is not None
    coordinator.others_wrote(frozenset({"bob"}))
    await world.step(0.5, looks=1)
    assert world.upstream.calls == [("resources/read", DOC, "bob")], "another replica's write: bob's watch only"
    world.registry.hearing.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.hearing.ticket())
    await world.step(0.5, looks=1)
    await eventually(lambda: coordinator.announced != [], what="the announcement of alice's write")
    assert coordinator.announced == [frozenset({"alice"})], "this replica's writes are told to the others"
    assert world.clock.advance(1.0) == 0
    world.upstream.calls.clear()
    world.registry.hearing.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.hearing.ticket())
    armed = world.clock.armed
    assert world.clock.advance(0) == 1, "alice's own watch looks at once, bob's does not"
    await eventually(lambda: world.clock.armed == armed + 1, what="the hinted look ended and armed the next")
    assert world.upstream.calls == [("resources/read", DOC, "alice")]
    await eventually(lambda: len(coordinator.announced) == 2, what="the other replicas told who wrote")
    assert coordinator.announced == [frozenset({"alice"})] * 2
    world.upstream.calls.clear()
    for _ in range(2):
        world.registry.hearing.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.hearing.ticket())
    assert world.clock.advance(0.09) == 0
    assert world.upstream.calls == [], "writes within the debounce wait for its end"
    await world.step(0.5, looks=1)
    assert world.upstream.calls == [("resources/read", DOC, "alice")], "and are one more look"
    await world.registry.aclose()
