"""The registry driven through its own surface, a watch's life after its first read: lingering and coming back,
what forwarded reads, writes and refusals teach, the upstream's recovery, other replicas' changes, the cache and
the logs. A real `WatchRegistry` on the in-memory bus and the hand-moved clock, reading a scripted upstream."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.identity import PUBLIC
from sidecar.protocol.errors import UpstreamHTTPError, UpstreamUnavailable
from tests.kit import eventually
from tests.unit.watch.registry_world import (
    ALICE,
    BOB,
    DOC,
    JUST,
    OTHER,
    World,
    failures,
    fp,
    make_world,
)
from tests.unit.watch.scripted_upstream import URL, contents


async def test_the_last_release_lingers_unpolled_then_ends(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    assert world.clock.advance(1.0) == 0
    handle.release()
    handle.release()
    assert world.watches() == {handle.key: 0}
    await world.step(4.0, looks=1)  # its poll comes due while it lingers
    assert world.clock.advance(4 - JUST) == 0
    assert world.upstream.reads(DOC) == ["alice"], "no stream holds it: no credential to poll with"
    assert world.watches() == {handle.key: 0}
    world.clock.advance(JUST)
    await eventually(lambda: world.watches() == {}, what="the linger ends the watch")
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
    await world.step(5.0, looks=1)  # its poll comes due while it lingers
    assert world.clock.advance(2.0) == 0
    again = await world.registry.acquire("resource", DOC, ALICE)
    assert again is not None
    assert [e.baseline for e in world.events] == [True], "taken up again, not started anew"
    assert world.upstream.reads(DOC) == ["alice", "alice"], "with a look that starts after it asked"
    world.clock.advance(2.0)
    await world.step(1.0, looks=1)  # its next poll, as a live watch: the linger would have ended it at 8
    assert world.watches() == {handle.key: 1}, "its linger was called off"
    world.upstream.resources[DOC] = contents(DOC, "v2")
    await world.step(5.0, looks=1)
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
    for _ in range(4):
        await world.step(5.0, looks=1)
    assert world.upstream.reads(DOC) == ["alice"] * 4
    assert world.watches() == {first.key: 1}


async def test_a_forwarded_read_showing_new_content_is_told_without_a_poll(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    ticket = world.registry.ticket()
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, ticket)
    await eventually(lambda: world.changes() == [(handle.key, fp(DOC, "v2"))])
    assert world.upstream.reads(DOC) == ["alice"]
    # Bob's private read of the same URI, and a read of a URI nobody watches, concern no watch of alice's.
    world.registry.after_forward(
        "resources/read", {"uri": DOC}, BOB, {"result": contents(DOC, "bob's")}, world.registry.ticket()
    )
    world.registry.after_forward(
        "resources/read", {"uri": OTHER}, ALICE, {"result": contents(OTHER, "x")}, world.registry.ticket()
    )
    # Then alice's own read of v3: told after them, and the only change since (were either taken, it would show).
    world.registry.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v3")}, world.registry.ticket()
    )
    await eventually(lambda: len(world.changes()) > 1)
    assert world.changes() == [(handle.key, fp(DOC, "v2")), (handle.key, fp(DOC, "v3"))]


@pytest.mark.invariant(7)
async def test_a_forwarded_read_older_than_the_last_look_applied_changes_nothing(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    stale = world.registry.ticket()
    await world.step(5.0, looks=1)  # a poll that started later is applied first
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "old")}, stale)
    fresh = world.registry.ticket()
    world.registry.after_forward("resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, fresh)
    await eventually(lambda: world.changes() != [])
    key = WatchKey("resource", DOC, "alice")
    assert world.changes() == [(key, fp(DOC, "v2"))], "the stale read was not applied before the fresh one"


async def test_a_write_makes_the_public_watches_and_the_writers_own_poll_soon(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    world.upstream.private[(OTHER, "alice")] = contents(OTHER, "alice's")
    world.upstream.private[(OTHER, "bob")] = contents(OTHER, "bob's")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", DOC, identity) is not None
        assert await world.registry.acquire("resource", OTHER, identity) is not None
    world.upstream.calls.clear()
    assert world.clock.advance(1.0) == 0
    world.registry.after_forward("tools/call", {"name": "edit"}, ALICE, {"result": {}}, world.registry.ticket())
    await world.step(0, looks=2)
    looked = [("resources/read", DOC, "alice"), ("resources/read", OTHER, "alice")]
    assert sorted(world.upstream.calls) == looked, "a lone write: at once, only the public and the writer's own"
    world.upstream.calls.clear()
    world.registry.after_forward("tools/call", {"name": "edit"}, ALICE, {"result": {}}, world.registry.ticket())
    world.registry.after_forward("tools/call", {"name": "edit"}, ALICE, {"result": {}}, world.registry.ticket())
    assert world.clock.advance(0.09) == 0
    assert world.upstream.calls == [], "writes within the debounce wait for its end"
    await world.step(0.5, looks=2)
    assert sorted(world.upstream.calls) == looked, "and are one more look each"


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
    await world.step(5.0, looks=2)
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
    world.clock.advance(5.0)
    await eventually(lambda: len(world.upstream.calls) == 2, what="the poll asked of the upstream")
    assert world.upstream.reads(DOC) == ["alice", "alice"], "a poll in flight, held by the upstream"
    handle.release()
    world.upstream.failure = UpstreamHTTPError(URL, 401, "Unauthorized")
    world.upstream.gate.set()  # the refusal is on its way back...
    world.clock.fire_next()  # ...when the linger ends the watch: the poll outlives it
    await world.registry.aclose()  # everything it started is over
    assert world.watches() == {}
    assert world.refusals == [], "a refusal for a watch that is gone concerns nobody"
    assert failures(caplog) == [], "nor is it a crash"


async def test_every_failing_watch_reads_again_as_soon_as_the_upstream_is_back(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    world.upstream.failure = UpstreamUnavailable(URL, "connection refused")
    await world.step(5.0, looks=1)
    world.upstream.failure = None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    [recovered] = world.upstream.recovery_listeners
    recovered()
    await world.step(0.3, looks=1)
    assert len(world.upstream.reads(DOC)) == 3, "not after its backoff: now"
    assert world.changes() == [(WatchKey("resource", DOC, "alice"), fp(DOC, "v2"))]


async def test_a_change_another_replica_told_is_not_told_again_by_this_ones_poll(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    world.bus.deliver(ChangeEvent(handle.key, fp(DOC, "v2"), 1, 0.0))
    await world.step(5.0, looks=1)
    assert world.changes() == [(handle.key, fp(DOC, "v2"))]


async def test_another_replicas_first_look_is_not_adopted(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    world.upstream.resources[DOC] = contents(DOC, "v2")
    world.bus.deliver(ChangeEvent(handle.key, fp(DOC, "v2"), 0, 0.0, baseline=True))
    await world.step(5.0, looks=1)
    assert world.changes() == [(handle.key, fp(DOC, "v2"))], "this replica's poll tells the change"


async def test_the_cache_is_told_every_look_a_watch_applies(world: World) -> None:
    seen: list[tuple[WatchKey, str]] = []
    world.registry.on_observation(lambda key, fingerprint, _: seen.append((key, fingerprint)))
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    await world.step(5.0, looks=1)
    assert seen == [(handle.key, fp(DOC, "v1"))] * 2


async def test_a_failing_publish_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    world = make_world()
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
        await eventually(lambda: any(r.name == "sidecar.watch.registry" for r in caplog.records))
    [record] = [r for r in caplog.records if r.name == "sidecar.watch.registry"]
    assert record.getMessage() == "a registry task failed"
    assert record.exc_info is not None, "with the failure's traceback"
    assert isinstance(record.exc_info[1], RuntimeError) and str(record.exc_info[1]) == "the bus is broken"


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
    for _ in range(2):
        await world.step(5.0, looks=1)
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
        await world.step(5.0, looks=1)  # its poll comes due while it lingers
        world.clock.advance(3.0)
        await eventually(lambda: world.watches() == {}, what="the linger ends the watch")
    lines = [
        (r.getMessage(), getattr(r, "watch", None), getattr(r, "kind", None))
        for r in caplog.records
        if r.name == "sidecar.watch.registry"
    ]
    assert lines == [
        ("watch started", handle.key.short_hash, "resource"),
        ("watch stopped", handle.key.short_hash, "resource"),
    ]


async def test_a_missing_resource_is_read_again_by_the_same_context_once_an_interval_has_passed(world: World) -> None:
    moment = 1 / 1024  # exact in binary, and shorter than a thousandth of the interval
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    world.clock.advance(5.0 - moment)  # the default interval (CONFIG: 5 s)
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    assert world.upstream.reads(DOC) == ["alice"], "known missing: not read again so soon"
    world.clock.advance(moment)
    assert await world.registry.acquire("resource", DOC, ALICE) is None
    assert world.upstream.reads(DOC) == ["alice", "alice"], "read again once the interval has passed"
