"""The registry driven through its own surface, a watch's life after its first read: its linger on the clock,
the upstream's recovery, the cache's listener, a bus that fails, and the logs (refusals reaching their listeners:
test_registry_polls, tests/integration/auth).
A real `WatchRegistry` on the in-memory bus and the hand-moved clock, reading a scripted upstream (the rules these
carry out are the engine's playbooks: test_engine_*.py)."""

from __future__ import annotations

import logging

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.protocol.errors import UpstreamUnavailable
from tests.kit import eventually
from tests.unit.watch.registry_world import (
    ALICE,
    DOC,
    OTHER,
    World,
    fp,
    make_world,
)
from tests.unit.watch.scripted_upstream import URL, contents


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


async def test_the_cache_is_told_every_look_a_watch_applies_with_its_ticket_before_any_change_is_told(
    world: World,
) -> None:
    seen: list[tuple[str, WatchKey, str]] = []
    tickets: list[int] = []

    def observed(key: WatchKey, fingerprint: str, ticket: int) -> None:
        seen.append(("observed", key, fingerprint))
        tickets.append(ticket)

    world.registry.on_observation(observed)
    world.bus.subscribe(lambda event: seen.append(("told", event.key, event.fingerprint)))
    world.upstream.resources[DOC] = contents(DOC, "v1")
    before = world.registry.hearing.ticket()
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    await world.step(5.0, looks=1)
    world.upstream.resources[DOC] = contents(DOC, "v2")
    await world.step(5.0, looks=1)
    v1, v2 = fp(DOC, "v1"), fp(DOC, "v2")
    assert seen == [
        ("observed", handle.key, v1),  # the first look, before its baseline is on the bus
        ("told", handle.key, v1),
        ("observed", handle.key, v1),
        ("observed", handle.key, v2),  # the cache drops what the look contradicts before the change is told
        ("told", handle.key, v2),
    ]
    assert before < tickets[0] < tickets[1] < tickets[2] < world.registry.hearing.ticket()


async def test_a_failing_publish_fails_a_first_looks_callers_is_logged_for_a_change_and_fails_no_shutdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = make_world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.resources[OTHER] = contents(OTHER, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None

    async def publish(event: ChangeEvent) -> None:
        raise RuntimeError("the bus is broken")

    world.bus.publish = publish  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the bus is broken"):
        await world.registry.acquire("resource", OTHER, ALICE)  # its first look's callers get the bus's error
    assert world.registry.waiting == 0
    world.registry.hearing.after_forward(
        "resources/read", {"uri": DOC}, ALICE, {"result": contents(DOC, "v2")}, world.registry.hearing.ticket()
    )
    with caplog.at_level(logging.ERROR, logger="sidecar.watch.registry"):
        await eventually(lambda: any(r.name == "sidecar.watch.registry" for r in caplog.records))
    [record] = [r for r in caplog.records if r.name == "sidecar.watch.registry"]
    assert record.getMessage() == "a registry task failed"
    assert record.exc_info is not None, "with the failure's traceback"
    assert isinstance(record.exc_info[1], RuntimeError) and str(record.exc_info[1]) == "the bus is broken"
    await world.registry.aclose()  # does not fail for the publishes that did
    assert world.clock.pending() == 0


async def test_a_watch_nobody_holds_lingers_on_the_clock_until_taken_up_again_or_ended_and_is_logged_without_its_uri(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    with caplog.at_level(logging.DEBUG, logger="sidecar.watch.registry"):
        handle = await world.registry.acquire("resource", DOC, ALICE)
        assert handle is not None
        handle.release()
        handle.release()  # twice is once
        assert world.watches() == {handle.key: 0}
        assert world.clock.due() == [5.0, 8.0], "its next poll, and the end of its linger"
        again = await world.registry.acquire("resource", DOC, ALICE)
        assert again is not None
        assert world.clock.due() == [5.0], "its next poll only: the linger's timer is called off"
        again.release()
        await world.step(5.0, looks=1)  # its poll comes due while it lingers
        assert world.upstream.reads(DOC) == ["alice", "alice"], "no stream holds it: no credential to poll with"
        world.clock.advance(3.0)
        await eventually(lambda: world.watches() == {}, what="the linger ends the watch")
    assert world.gauge("mcp_sidecar_watches", kind="resource") == 0
    assert world.gauge("mcp_sidecar_watched_contexts") == 0
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
