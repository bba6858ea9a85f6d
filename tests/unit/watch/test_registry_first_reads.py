"""The registry driven through its own surface, a subscription's first moments: what its first read publishes before
the ack, the gauges, joiners' looks, callers that give up or are cancelled as they are answered, and a client's first
reads in its fair share. A real
`WatchRegistry` on the in-memory bus and the hand-moved clock, reading a scripted upstream; each wait names what it
waits for (the engine's rules themselves are playbooks: test_engine_*.py)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sidecar.changes import WatchKey
from sidecar.identity import Identity
from sidecar.protocol.errors import TooManyRequests, UpstreamUnavailable
from tests.kit import eventually
from tests.unit.watch.registry_world import (
    ALICE,
    ALICE_PHONE,
    ANON,
    BOB,
    CONFIG,
    DOC,
    OTHER,
    GatedBus,
    World,
    fp,
    make_world,
)
from tests.unit.watch.scripted_upstream import URL, contents


@pytest.mark.invariant(6)
async def test_the_first_read_is_published_as_a_baseline_before_acquire_returns(world: World) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1")
    handle = await world.registry.acquire("resource", DOC, ALICE)
    assert handle is not None
    key = WatchKey("resource", DOC, "alice")
    assert handle.key == key and handle.context == "alice"
    assert world.upstream.calls == [("resources/read", DOC, "alice")]
    assert [(e.key, e.fingerprint, e.generation, e.baseline) for e in world.events] == [(key, fp(DOC, "v1"), 0, True)]
    [event] = world.events
    assert isinstance(event.detected_at, float) and event.detected_at > 0, "stamped with the time it was seen"
    assert world.watches() == {key: 1}
    assert world.gauge("mcp_sidecar_watches", kind="resource") == 1
    assert world.gauge("mcp_sidecar_watched_contexts") == 1
    assert world.clock.advance(4.99) == 0
    assert len(world.upstream.calls) == 1, "the first poll waits a whole interval after the first read"
    await world.step(0.01, looks=1)
    assert world.upstream.reads(DOC) == ["alice", "alice"], "polled with the subscriber's own credential"
    assert world.changes() == [], "the first poll of unchanged content tells nothing"


async def test_a_caller_leaving_a_shared_first_read_takes_it_from_nobody_else_whether_it_fails_or_not() -> None:
    world = make_world()
    world.upstream.failure = UpstreamUnavailable(URL, "connection refused")
    leaving, staying = (asyncio.create_task(world.registry.acquire("resource", DOC, ALICE)) for _ in range(2))
    world.upstream.before_answer = leaving.cancel  # as the read's failure comes back
    with pytest.raises(asyncio.CancelledError):
        await leaving
    with pytest.raises(UpstreamUnavailable):
        await staying  # the ack is refused: the upstream could not answer the first read
    assert world.upstream.reads(DOC) == ["alice"], "one read for both"
    assert world.watches() == {} and world.registry.waiting == 0
    # A failure is not remembered; and a caller that gives up while the read is in flight leaves it to the other.
    world.upstream.before_answer = None
    world.upstream.failure = None
    world.upstream.calls.clear()
    world.upstream.asked["resources/read"].clear()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.gate = asyncio.Event()
    quitter = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    stayer = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    await world.upstream.asked["resources/read"].wait()  # both wait on the read (asked after both subscribed)
    quitter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await quitter
    world.upstream.gate.set()
    handle = await stayer
    assert handle is not None
    assert quitter.cancelled()
    assert world.watches() == {handle.key: 1}
    assert len(world.upstream.calls) == 1
    await world.registry.aclose()


async def test_the_gauges_count_watches_by_kind_and_the_contexts_watched_and_a_list_is_watched_like_a_resource(
    world: World,
) -> None:
    world.upstream.resources[DOC] = contents(DOC, "v1", cacheScope="public")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", DOC, identity) is not None
    assert world.gauge("mcp_sidecar_watches", kind="resource") == 1, "one public watch both contexts joined"
    assert world.gauge("mcp_sidecar_watched_contexts") == 1
    world.upstream.private[(OTHER, "alice")] = contents(OTHER, "alice's")
    world.upstream.private[(OTHER, "bob")] = contents(OTHER, "bob's")
    for identity in (ALICE, BOB):
        assert await world.registry.acquire("resource", OTHER, identity) is not None
    assert world.gauge("mcp_sidecar_watches", kind="resource") == 3, "and a private watch per context"
    assert world.gauge("mcp_sidecar_watched_contexts") == 3
    world.upstream.pages["tools/list"] = [{"tools": [{"name": "a"}]}]
    handle = await world.registry.acquire("tools_list", None, ANON)
    assert handle is not None
    assert handle.key == WatchKey("tools_list", None, "anon")
    assert world.gauge("mcp_sidecar_watches", kind="tools_list") == 1
    assert world.gauge("mcp_sidecar_watched_contexts") == 4
    world.upstream.pages["tools/list"] = [{"tools": [{"name": "a"}, {"name": "b"}]}]
    await world.step(5.0, looks=4)
    assert [key for key, _ in world.changes()] == [handle.key]


async def test_a_caller_of_a_first_read_holds_its_watch_as_it_is_answered() -> None:
    bus = GatedBus()
    world = make_world(CONFIG.model_copy(update={"linger_ms": 0}), bus=bus)
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
    await world.step(5.0, looks=1)
    assert world.upstream.reads(DOC) == ["alice"] * 2, "and it polls"
    await world.registry.aclose()


async def test_first_reads_over_a_clients_rate_wait_their_turn_in_its_own_fair_share() -> None:
    world = make_world(CONFIG.model_copy(update={"max_baselines_per_s": 1.0}), capacity=2, per_client=1)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    world.upstream.resources[OTHER] = contents(OTHER, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None, "within the rate: at once"
    await world.fair_share.acquire(ALICE.client, within_s=60, limit="test")  # alice's forwarded request
    paced = [asyncio.create_task(world.registry.acquire("resource", OTHER, ALICE)) for _ in range(2)]
    await eventually(lambda: world.registry.waiting == 2)  # both subscribed, and waiting
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


@pytest.mark.invariant(20)
async def test_a_paced_first_read_of_a_new_credential_waits_in_a_lane_of_its_own_within_its_address() -> None:
    """A credential the upstream has not accepted yet takes its turn among its address's requests in a lane of its
    own: a newcomer behind a busy address waits one turn of each lane, not the address's whole queue, and two
    newcomers do not share one lane."""
    world = make_world(CONFIG.model_copy(update={"max_baselines_per_s": 1.0}), capacity=2, per_client=1)
    address = "203.0.113.7"
    anonymous = Identity(ANON.context, client=address)
    dan, eve = (
        Identity(name, (("authorization", f"Bearer {name}"),), client=address, lane=name) for name in ("dan", "eve")
    )
    uris = [f"file:///{n}" for n in range(3)]
    for uri in (DOC, *uris):
        world.upstream.resources[uri] = contents(uri, "v1")
    assert await world.registry.acquire("resource", DOC, anonymous) is not None, "the address's rate is spent"
    await world.fair_share.acquire(address, within_s=60, limit="test")  # one of its requests is upstream

    def newcomers_read() -> list[str]:
        reads = [context for method, _, context in world.upstream.calls if method == "resources/read"]
        return [context for context in reads if context in ("dan", "eve")]

    served: list[tuple[str, list[str]]] = []

    async def forwarded(name: str) -> None:  # the address's own requests, waiting in its own lane
        async with world.fair_share.slot(address, within_s=60, limit="test"):
            served.append((name, newcomers_read()))

    own = [asyncio.create_task(forwarded(name)) for name in ("first", "second")]
    await eventually(lambda: world.fair_share.queued == 2)
    firsts = [
        asyncio.create_task(world.registry.acquire("resource", uri, who))
        for uri, who in zip(uris, (dan, dan, eve), strict=True)
    ]
    await eventually(lambda: world.fair_share.queued == 5, what="the newcomers' three first reads in their turn")
    world.fair_share.release(address)
    await asyncio.gather(*own)
    assert all(await asyncio.gather(*firsts))
    assert served == [("first", []), ("second", ["dan", "eve"])], "one turn each for the address's lanes, in order"
    assert newcomers_read() == ["dan", "eve", "dan"]
    await world.registry.aclose()


async def test_a_first_read_that_waits_too_long_for_its_turn_is_refused() -> None:
    config = CONFIG.model_copy(update={"max_baselines_per_s": 1.0, "baseline_wait_s": 0.001})
    world = make_world(config, capacity=2, per_client=1)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    assert await world.registry.acquire("resource", DOC, ALICE) is not None
    await world.fair_share.acquire(ALICE.client, within_s=60, limit="test")
    with pytest.raises(TooManyRequests):
        await world.registry.acquire("resource", OTHER, ALICE)
    assert world.upstream.reads(OTHER) == []
    assert world.gauge("mcp_sidecar_limit_rejections_total", limit="baseline_wait") == 1
    world.fair_share.release(ALICE.client)
    await world.registry.aclose()


async def test_a_caller_cancelled_as_it_is_answered_lets_go_of_the_watch_it_was_given() -> None:
    bus = GatedBus()
    world = make_world(bus=bus)
    world.upstream.resources[DOC] = contents(DOC, "v1")
    late = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    await bus.published.wait()  # answered in the same step as this wake-up, and resumes after it
    key = WatchKey("resource", DOC, "alice")
    assert world.watches() == {key: 1}
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    assert world.watches() == {key: 0}, "the holder it was given is released with it"
    await world.step(5.0, looks=1)  # it polls while it lingers
    assert world.upstream.reads(DOC) == ["alice"], "and not with the credential of the caller that left"
    world.clock.advance(3.0)
    await eventually(lambda: world.watches() == {}, what="and the watch lingers, then ends")
    await world.registry.aclose()


async def test_a_joiner_cancelled_in_the_step_its_look_answers_lets_go_of_the_watch_it_held() -> None:
    world = make_world()
    world.upstream.resources[DOC] = contents(DOC, "v1")
    first = await world.registry.acquire("resource", DOC, ALICE)
    assert first is not None
    key = WatchKey("resource", DOC, "alice")
    joiner = asyncio.create_task(world.registry.acquire("resource", DOC, ALICE))
    # Its look answers in the step that cancels it: the answer comes to a caller that is already leaving.
    world.upstream.before_answer = joiner.cancel
    with pytest.raises(asyncio.CancelledError):
        await joiner
    world.upstream.before_answer = None
    assert world.watches() == {key: 1}, "only the first caller holds it: the joiner's hold left with the joiner"
    first.release()
    assert world.watches() == {key: 0}, "and the first caller's release leaves no holder"
    await world.registry.aclose()
