"""Who shares a watch and who gets which notification: private contexts, public coalescing and the list kinds.

Every test drives real SDK upstreams (subprocesses) through a sidecar served in-process, with the kit's raw
listen streams (a reader task keeps every frame after the ack). Positive assertions wait on events with
bounded timeouts; a negative one ("B got nothing") first waits until the watches that could have produced the
unwanted frame have polled again, then checks nothing arrived. Costs are counted by the upstream over the time
its own clock says passed, never over a wall-clock window the test guesses.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from sidecar.app import HUB, METRICS
from sidecar.changes import WatchKind
from sidecar.config.sections import DEFAULT_JITTER
from sidecar.identity import ANONYMOUS, PUBLIC
from tests.integration.listen_watches import (
    POLLING,
    PRICE,
    PROFILE,
    TTL_MS,
    answered,
    most_in_flight,
    polled,
    reads_of,
    watch_count,
    watch_polled_twice,
    watches,
)
from tests.kit import (
    PROMPTS_CHANGED,
    RESOURCES_CHANGED,
    SUB_ID_KEY,
    TOOLS_CHANGED,
    UPDATED,
    WAIT_S,
    ListenStream,
    context_of,
    eventually,
    listening,
    read_resource,
    serve_sidecar,
    text_of,
)
from tests.peers import Upstream

pytestmark = pytest.mark.parametrize("fast_upstream", ["modern", "legacy"], indirect=True)
"""Every test here runs against a shop server of each era."""


# -- 1. private contexts ------------------------------------------------------------------------------


@pytest.mark.invariant(10)
@pytest.mark.invariant(4)
async def test_a_private_resource_changes_only_for_its_owner_and_is_polled_only_with_each_owners_token(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    async with serve_sidecar(up.url, polling=POLLING) as sidecar:
        a = ListenStream(http, sidecar.url, "a", [PROFILE], authorization="Bearer a")
        b = ListenStream(http, sidecar.url, "b", [PROFILE], authorization="Bearer b")
        try:
            acks = await asyncio.gather(a.open(), b.open())
            for ack in acks:
                assert ack["params"]["notifications"] == {"resourceSubscriptions": [PROFILE]}
            # Two authorization contexts, two watches: nobody shares a private view.
            by_context = {watch.key.context: watch for watch in watches(sidecar)}
            assert set(by_context) == {context_of(sidecar, "Bearer a"), context_of(sidecar, "Bearer b")}
            assert sidecar.app[METRICS].watched_contexts._value.get() == 2
            watch_b = by_context[context_of(sidecar, "Bearer b")]

            assert await up.bump_profile("a") == "profile of a v2"
            update = await a.next_stamped()
            assert update["method"] == UPDATED and update["params"]["uri"] == PROFILE

            # B's own watch has looked at the upstream twice since A heard of the change: B hears nothing.
            await asyncio.gather(polled(sidecar, "resource", 4), watch_polled_twice(sidecar, watch_b))
            assert b.pending() == []
            assert a.pending() == []  # one change, one notification

            assert text_of(await read_resource(http, sidecar.url, PROFILE, token="a")) == "profile of a v2"
            assert text_of(await read_resource(http, sidecar.url, PROFILE, token="b")) == "profile of b v1"

            # B leaves: its watch lingers 100 ms, then goes, and its token with it.
            await b.close()
            await eventually(lambda: watch_count(sidecar, "resource") == 1, within_s=WAIT_S)
            assert [watch.key.context for watch in watches(sidecar)] == [context_of(sidecar, "Bearer a")]
            assert sidecar.app[METRICS].watched_contexts._value.get() == 1
            after_b_left = len(await up.log())
            await polled(sidecar, "resource", 2)  # A's polls go on
            log = await up.log()
        finally:
            await a.close()
            await b.close()

    reads = reads_of(log, PROFILE)
    assert {entry["authorization"] for entry in reads} == {"Bearer a", "Bearer b"}  # never anonymous
    tokens_before = [entry["authorization"] for entry in reads_of(log[:after_b_left], PROFILE)]
    tokens_after = [entry["authorization"] for entry in reads_of(log[after_b_left:], PROFILE)]
    assert tokens_before.count("Bearer b") >= 3  # B's baseline and polls (and B's own re-read)
    assert tokens_after and set(tokens_after) == {"Bearer a"}  # B's token is not used once B has gone


# -- 2. public coalescing ---------------------------------------------------------------------------------


@pytest.mark.invariant(8)
async def test_two_hundred_anonymous_streams_on_a_public_resource_cost_one_read_per_poll(
    fast_upstream: Upstream,
) -> None:
    up = fast_upstream
    n = 200
    connector = aiohttp.TCPConnector(limit=0)  # one connection per stream; the default pool holds 100
    async with (
        serve_sidecar(up.url, polling=POLLING) as sidecar,
        aiohttp.ClientSession(connector=connector) as http,
    ):
        streams = [ListenStream(http, sidecar.url, i, [PRICE]) for i in range(n)]
        async with listening(*streams, at_once=True) as acks:
            for i, ack in enumerate(acks):
                assert ack["params"]["_meta"][SUB_ID_KEY] == i
                assert ack["params"]["notifications"] == {"resourceSubscriptions": [PRICE]}
            # One watch for all: public, or (a legacy read has no cacheScope) the anonymous context.
            assert [watch.key.context for watch in watches(sidecar)] == [PUBLIC if up.era == "modern" else ANONYMOUS]
            assert sidecar.app[HUB].stream_count == n

            # Joining cost: one first read, then each joiner's sync point (invariant 16), one read shared by every
            # joiner arriving while it is in flight. By the upstream's own times, then: never more reads of it in
            # hand at once than that shared look and the watch's own poll, however slowly the 200 joined.
            joining = await _answered_reads(up, len(reads_of(await up.log(), PRICE)))
            assert most_in_flight(joining) <= 2

            # Steady cost: one read per poll interval that passed, not one per stream, by the upstream's clock: the
            # interval is ttlMs less its jitter at the shortest, so a window of the upstream's reads spanning T
            # holds at most T / that + 1 of them.
            await polled(sidecar, "resource", 3)
            steady = reads_of(await up.log(), PRICE)[len(joining) :]
            shortest_s = TTL_MS / 1000 * (1 - DEFAULT_JITTER)
            assert len(steady) >= 3
            assert len(steady) <= (steady[-1]["at"] - steady[0]["at"]) / shortest_s + 1

            # And one poll that sees a change tells every stream.
            await up.set_price(150)
            updates = await asyncio.gather(*(stream.next_stamped() for stream in streams))
            assert all(frame["method"] == UPDATED and frame["params"]["uri"] == PRICE for frame in updates)


async def _answered_reads(up: Upstream, count: int) -> list[dict[str, Any]]:
    """The first `count` reads of PRICE, once each has been answered."""
    reads: list[dict[str, Any]] = []

    async def ready() -> bool:
        reads[:] = reads_of(await up.log(), PRICE)[:count]
        return answered(reads)

    await eventually(ready, within_s=WAIT_S)
    return reads


# -- 3. list kinds ------------------------------------------------------------------------------------------


@pytest.mark.invariant(4)
async def test_each_list_change_reaches_only_the_stream_that_asked_for_that_list(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    up = fast_upstream
    async with serve_sidecar(up.url, polling=POLLING) as sidecar:
        tools = ListenStream(http, sidecar.url, "tools", None, toolsListChanged=True)
        prompts = ListenStream(http, sidecar.url, "prompts", None, promptsListChanged=True)
        resources = ListenStream(http, sidecar.url, "resources", None, resourcesListChanged=True)
        streams = {"tools_list": tools, "prompts_list": prompts, "resources_list": resources}
        async with listening(tools, prompts, resources, at_once=True) as acks:
            assert [ack["params"]["notifications"] for ack in acks] == [
                {"toolsListChanged": True},
                {"promptsListChanged": True},
                {"resourcesListChanged": True},
            ]
            steps: list[tuple[Any, str, WatchKind, str]] = [
                ("tool", "t1", "tools_list", TOOLS_CHANGED),
                ("prompt", "p1", "prompts_list", PROMPTS_CHANGED),
                ("resource", "r1", "resources_list", RESOURCES_CHANGED),
                # A new template changes resources/templates/list, which counts as the resources list.
                ("template", "tt1", "resources_list", RESOURCES_CHANGED),
            ]
            for kind, name, changed, method in steps:
                await up.add(kind, name)
                frame = await streams[changed].next_stamped()
                assert frame["method"] == method, (kind, frame)
                assert set(frame["params"]) == {"_meta"}
                # Every other list has been polled twice since: still nothing for the other streams.
                others: list[WatchKind] = [other for other in streams if other != changed]
                await asyncio.gather(*(polled(sidecar, other, 2) for other in others))
                for stream in streams.values():
                    assert stream.pending() == [], (kind, stream.request_id)
