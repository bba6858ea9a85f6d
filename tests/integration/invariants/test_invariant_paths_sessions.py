"""The stream invariants on the 2025-11-25 path: a session minted by the sidecar, `resources/subscribe` on its POSTs,
our notifications on its GET stream. Each pin here has a twin on listen streams; these hold the same rule where a
2025-11-25 client meets it (invariants 1, 4, 6, 10 and 16).

Raw HTTP as a 2025-11-25 client sends it (the frames are compared as they arrive), the SDK shop upstream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from sidecar.app import METRICS
from tests.kit import UPDATED, ListenStream, eventually, read_resource, serve_sidecar, text_of
from tests.kit.polling import FAST, SLOW
from tests.kit.session import sessions
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"
STATIC = "catalog://extra/static"
"""Never changes: a session subscribed to it alone must never be told of the price."""


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=60_000, list_ttl_ms=60_000) as up:
        await up.add("resource", "static")
        yield up


@pytest.mark.invariant(1)
@pytest.mark.invariant(4)
async def test_a_session_is_told_only_the_uri_and_only_of_what_it_subscribed_to(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=FAST) as sidecar, sessions(http, sidecar.url, None, None) as (a, b):
        await a.subscribe(PRICE)
        await b.subscribe(STATIC)
        await shop.set_price(140)
        (told,) = await a.wait_updates(1)
        assert told == {"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PRICE}}  # a signal, never content
        # Had the first change reached b, it would sit before this one on b's stream.
        await b.subscribe(PRICE)
        await shop.set_price(150)
        await a.wait_updates(2)
        assert await b.wait_updates(1) == [{"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PRICE}}]


@pytest.mark.invariant(10)
@pytest.mark.invariant(4)
async def test_a_private_change_reaches_only_the_session_of_its_own_context(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with (
        serve_sidecar(shop.url, polling=FAST) as sidecar,
        sessions(http, sidecar.url, "alice", "bob") as (alice, bob),
    ):
        await alice.subscribe(PROFILE)
        await alice.subscribe(PRICE)
        await bob.subscribe(PROFILE)
        await shop.bump_profile("bob")
        assert await bob.wait_updates(1) == [{"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PROFILE}}]
        # Had bob's change reached alice, it would sit before the price's on her stream.
        await shop.set_price(140)
        assert [frame["params"]["uri"] for frame in await alice.wait_updates(1)] == [PRICE]
        assert bob.updates() == [{"jsonrpc": "2.0", "method": UPDATED, "params": {"uri": PROFILE}}]


@pytest.mark.invariant(6)
async def test_polls_that_see_a_sessions_baseline_tell_it_nothing_and_the_first_change_is_told(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=FAST) as sidecar, sessions(http, sidecar.url, None) as (session,):
        polled = sidecar.app[METRICS].polls.labels("resource", "ok")
        await session.subscribe(PRICE)
        seen = polled._value.get()
        await eventually(lambda: polled._value.get() >= seen + 3)  # three polls that saw the baseline
        await shop.set_price(140)
        (told,) = await session.wait_updates(1)  # a spurious update would come first
        assert told["params"] == {"uri": PRICE}
        await eventually(lambda: polled._value.get() >= seen + 6)
        assert len(session.updates()) == 1


@pytest.mark.invariant(16)
async def test_a_2025_subscribe_joining_a_live_watch_answers_after_its_look_so_every_read_is_fresh(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=SLOW) as sidecar:
        keeper = ListenStream(http, sidecar.url, "keeper", [PRICE])
        await keeper.open()  # the watch is live, polled once a minute
        try:
            assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=100"  # cached a minute
            await shop.set_price(140)
            async with sessions(http, sidecar.url, None) as (session,):
                await session.subscribe(PRICE)  # joins the watch: answered once its own look is applied
                assert text_of(await read_resource(http, sidecar.url, PRICE)) == "price=140"
                await keeper.wait_update(PRICE)  # the joiner's look found the change for everyone
        finally:
            await keeper.close()
