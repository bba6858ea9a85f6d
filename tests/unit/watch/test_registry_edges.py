"""The registry driven through its own surface, at its edges: shutdown, the lease and other replicas' writes, the
hint budget and traced writes, and the upstream's own notifications. A real `WatchRegistry` on the in-memory bus and
the hand-moved clock, reading a scripted upstream."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent, WatchKey
from sidecar.identity import PUBLIC
from sidecar.observability.tracing import tracing
from sidecar.protocol.errors import UpstreamUnavailable
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
from tests.unit.watch.scripted_upstream import URL, contents


async def test_shutdown_stops_every_watch_and_cancels_first_reads_in_flight() -> None:
    world = make_world()
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
    await eventually(lambda: world.upstream.reads("file:///new") == ["alice"] and len(world.upstream.reads(DOC)) == 2)
    await world.registry.aclose()
    assert world.watches() == {}
    with pytest.raises(asyncio.CancelledError):
        await starting
    with pytest.raises(asyncio.CancelledError):
        await joining
    world.upstream.gate = None
    world.upstream.calls.clear()
    world.bus.deliver(ChangeEvent(WatchKey("resources_list", None, PUBLIC), "fp", 1, 0.0))
    assert world.clock.advance(60.0) == 0, "nothing is left to poll after shutdown, hinted or not"
    assert world.upstream.calls == [], "nothing polls after shutdown, hinted or not"
    live.release()


async def test_shutdown_returns_once_a_first_read_in_flight_has_ended() -> None:
    world = make_world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.gate = asyncio.Event()
    starting = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    await eventually(lambda: world.upstream.reads(DOC) == ["alice"])
    await world.registry.aclose()
    assert world.registry.looks_in_flight == 0, "nothing it started is left running"
    with pytest.raises(asyncio.CancelledError):
        await starting


async def test_a_caller_cancelled_in_the_step_a_shared_first_read_fails_leaves_the_others_told() -> None:
    world = make_world()
    world.upstream.failure = UpstreamUnavailable(URL, "connection refused")
    leaving, staying = (asyncio.create_task(world.registry.acquire("resource", DOC, ALICE)) for _ in range(2))
    world.upstream.before_answer = leaving.cancel  # as the read's failure comes back
    with pytest.raises(asyncio.CancelledError):
        await leaving
    with pytest.raises(UpstreamUnavailable):
        await staying
    assert world.upstream.reads(DOC) == ["alice"], "one read for both"
    assert world.watches() == {} and world.registry.waiting == 0
    await world.registry.aclose()


@pytest.mark.invariant(21)
async def test_a_replica_spends_its_share_of_the_fleets_read_budget() -> None:
    world = make_world(CONFIG.model_copy(update={"max_reads_per_s": 60}), replicas=lambda: 3)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    await world.step(5.0, looks=1)
    assert world.gauge("mcp_sidecar_read_budget_per_second") == 20, "60 a second over 3 live replicas"
    await world.registry.aclose()


async def test_shutdown_leaves_nothing_scheduled_and_finishes_what_it_had_started(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = make_world()
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
    await eventually(lambda: world.upstream.reads("file:///new") == ["bob"])
    await world.registry.aclose()
    assert world.changes() == [(WatchKey("resource", DOC, "alice"), fp(DOC, "v2"))], "told before it returned"
    assert world.clock.pending() == 0, "no poll, linger or debounce is left to fire"
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert failures(caplog) == []


async def test_shutdown_does_not_fail_for_a_publish_that_failed(caplog: pytest.LogCaptureFixture) -> None:
    world = make_world()
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


async def test_shutdown_waits_for_a_publish_in_flight_and_does_not_fail_for_one_that_fails() -> None:
    bus = GatedBus()
    world = make_world(bus=bus)
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
    await eventually(lambda: world.clock.pending() == 0)  # every timer called off: it waits for what it started
    assert not closing.done(), "a publish is in flight"
    bus.gate.set()
    await closing
    assert world.changes() == [(WatchKey("resource", DOC, "alice"), fp(DOC, "v2"))]


async def test_the_lease_is_tracked_while_streams_hold_a_watch_and_polls_need_it() -> None:
    coordinator = Coordinator()
    world = make_world(coordinator=coordinator)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    first = await world.registry.acquire("resource", DOC, ALICE)
    assert first is not None
    assert coordinator.tracked == [first.key], "tracked with its first stream"
    second = await world.registry.acquire("resource", DOC, ALICE)
    assert second is not None
    assert coordinator.tracked == [first.key], "and only then"
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


async def test_a_change_adopted_through_the_coordinator_is_the_watchs_own_and_tells_nobody_here() -> None:
    coordinator = Coordinator()
    world = make_world(coordinator=coordinator)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    assert coordinator.adopt is not None
    # Another replica told v2 (its message carried it to this replica's streams): this watch takes it.
    coordinator.adopt(ChangeEvent(handle.key, fp(DOC, "v2"), 3, 0.0))
    assert world.changes() == [], "adopted, not published here"
    world.upstream.resources[DOC] = contents(DOC, "v2")
    await world.step(5.0, looks=1)
    assert world.changes() == [], "its own look at v2 is no change: it has it"
    world.upstream.resources[DOC] = contents(DOC, "v3")
    await world.step(5.0, looks=1)
    assert world.changes() == [(handle.key, fp(DOC, "v3"))]
    handle.release()
    await world.registry.aclose()
    assert coordinator.adopt is None, "closed: it hears no more"


async def test_another_replicas_writes_hint_the_watches_they_concern() -> None:
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
    assert world.upstream.calls == [("resources/read", DOC, "bob")]
    world.registry.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.ticket())
    await world.step(0.5, looks=1)
    await eventually(lambda: coordinator.announced != [], what="the announcement of alice's write")
    assert coordinator.announced == [frozenset({"alice"})], "this replica's writes are told to the others"
    await world.registry.aclose()


async def test_hinted_polls_over_the_hint_budget_are_deferred() -> None:
    world = make_world(CONFIG.model_copy(update={"max_hinted_polls_per_s": 1.0}))
    uris = [f"file:///{n}" for n in range(4)]
    for uri in uris:
        world.upstream.resources[uri] = contents(uri, "v1", cacheScope="public")
        assert await world.registry.acquire("resource", uri, ALICE) is not None
    world.upstream.calls.clear()
    world.registry.after_forward("tools/call", {}, ALICE, {"result": {}}, world.registry.ticket())
    await world.step(0.5, looks=1)
    assert len(world.upstream.calls) == 1, "a burst of per_s, the rest one a second"
    await world.step(2.0, looks=2)
    assert len(world.upstream.calls) == 3
    await world.step(1.0, looks=1)
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


async def test_revalidate_hints_the_writers_own_watches_and_tells_the_other_replicas_who_wrote() -> None:
    coordinator = Coordinator()
    world = make_world(coordinator=coordinator)
    world.upstream.private[(DOC, "alice")] = contents(DOC, "alice's")
    world.upstream.private[(DOC, "bob")] = contents(DOC, "bob's")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", DOC, identity) is not None
    assert world.clock.advance(1.0) == 0
    world.upstream.calls.clear()
    world.registry.revalidate(ALICE)
    armed = world.clock.armed
    assert world.clock.advance(0) == 1, "alice's own watch looks at once, bob's does not"
    await eventually(lambda: world.clock.armed == armed + 1, what="the hinted look ended and armed the next")
    assert world.upstream.calls == [("resources/read", DOC, "alice")]
    await eventually(lambda: coordinator.announced == [frozenset({"alice"})], what="the other replicas told who wrote")
    await world.registry.aclose()


async def test_a_watch_taken_up_again_while_it_lingers_has_its_linger_called_off(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    first = await world.registry.acquire("resource", DOC, ALICE)
    assert first is not None
    first.release()
    assert world.clock.due() == [5.0, 8.0], "its next poll, and the end of its linger"
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    assert world.clock.due() == [5.0], "its next poll only: the linger's timer is called off"


class _DownBus(MemoryBus):
    async def publish(self, event: ChangeEvent) -> None:
        raise ConnectionError("the bus is down")


async def test_a_first_look_whose_publish_fails_fails_its_callers_with_the_bus_error() -> None:
    world = make_world(bus=_DownBus())
    world.upstream.resources[DOC] = contents(DOC, "v1")
    with pytest.raises(ConnectionError, match="the bus is down"):
        await world.registry.acquire("resource", DOC, ALICE)
    assert world.registry.waiting == 0
    await world.registry.aclose()
