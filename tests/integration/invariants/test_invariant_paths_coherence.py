"""The cache never holds an answer older than a watch's latest look (invariant 17), on each path it governs in one
process: list kinds as well as resources, a private context as well as the public one, a joiner's look as well as a
first subscriber's, and a 2025-11-25 session's subscribe and notification as well as a listen stream's.

Each test caches an answer for a minute (the SDK shop upstream's `ttlMs`), changes the upstream behind the sidecar's
back, lets a watch look, and reads again: only the look's effect on the cache can make that read fresh.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.kit import TOOLS_CHANGED, ListenStream, read_resource, rpc, serve_sidecar, text_of
from tests.kit.polling import FAST
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"
MINUTE_MS = 60_000
SLOW = {"default_interval_ms": MINUTE_MS, "max_interval_ms": MINUTE_MS, "min_interval_ms": 50, "linger_ms": MINUTE_MS}
"""Nobody's poll comes in time: only a first look or a joiner's look can make a read fresh."""


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=MINUTE_MS, list_ttl_ms=MINUTE_MS) as up:
        yield up


async def _tool_names(http: aiohttp.ClientSession, url: str) -> set[str]:
    status, message = await rpc(http, url, "tools/list")
    assert status == 200 and "result" in message, message
    return {tool["name"] for tool in message["result"]["tools"]}


async def _text(http: aiohttp.ClientSession, url: str, uri: str, token: str | None = None) -> str:
    return text_of(await read_resource(http, url, uri, token=token))


# -- list kinds ----------------------------------------------------------------------------------------------------


@pytest.mark.invariant(17)
async def test_after_a_tools_list_changed_notification_the_cached_tools_list_is_gone(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=FAST) as sidecar:
        stream = ListenStream(http, sidecar.url, "tools", toolsListChanged=True)
        ack = await stream.open()
        try:
            assert ack["params"]["notifications"] == {"toolsListChanged": True}
            before = await _tool_names(http, sidecar.url)  # cached for a minute
            assert "fresh" not in before
            await shop.add("tool", "fresh")
            told = await stream.next()
            assert told["method"] == TOOLS_CHANGED
            assert await _tool_names(http, sidecar.url) == before | {"fresh"}
        finally:
            await stream.close()


@pytest.mark.invariant(17)
async def test_a_new_tools_listener_reads_the_list_its_first_look_saw_not_the_cached_one(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=SLOW) as sidecar:
        before = await _tool_names(http, sidecar.url)  # cached for a minute; nobody watches the list yet
        await shop.add("tool", "fresh")
        stream = ListenStream(http, sidecar.url, "tools", toolsListChanged=True)
        await stream.open()  # its first look sees the new tool
        try:
            assert await _tool_names(http, sidecar.url) == before | {"fresh"}
        finally:
            await stream.close()


# -- a private context beside another ------------------------------------------------------------------------------


@pytest.mark.invariant(17)
async def test_a_change_to_a_second_contexts_private_resource_drops_that_contexts_cached_answer(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=FAST) as sidecar:
        alice = ListenStream(http, sidecar.url, "alice", [PROFILE], authorization="Bearer alice")
        bob = ListenStream(http, sidecar.url, "bob", [PROFILE], authorization="Bearer bob")
        await alice.open()
        await bob.open()
        try:
            assert await _text(http, sidecar.url, PROFILE, "alice") == "profile of alice v1"
            assert await _text(http, sidecar.url, PROFILE, "bob") == "profile of bob v1"  # each cached a minute
            assert await shop.bump_profile("bob") == "profile of bob v2"
            await bob.wait_update(PROFILE)
            assert await _text(http, sidecar.url, PROFILE, "bob") == "profile of bob v2"
            assert await _text(http, sidecar.url, PROFILE, "alice") == "profile of alice v1"
            assert alice.updates() == []
        finally:
            await alice.close()
            await bob.close()


@pytest.mark.invariant(17)
async def test_a_second_context_that_listens_reads_what_its_own_first_look_saw(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=SLOW) as sidecar:
        alice = ListenStream(http, sidecar.url, "alice", [PROFILE], authorization="Bearer alice")
        await alice.open()  # the first context's watch of the profile
        try:
            assert await _text(http, sidecar.url, PROFILE, "bob") == "profile of bob v1"  # cached a minute
            await shop.bump_profile("bob")
            bob = ListenStream(http, sidecar.url, "bob", [PROFILE], authorization="Bearer bob")
            await bob.open()  # a second context's first look sees v2
            try:
                assert await _text(http, sidecar.url, PROFILE, "bob") == "profile of bob v2"
            finally:
                await bob.close()
        finally:
            await alice.close()


# -- a joiner's look -----------------------------------------------------------------------------------------------


@pytest.mark.invariant(17)
async def test_a_joiners_look_that_finds_a_change_drops_the_answer_cached_for_a_client_who_never_listened(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=SLOW) as sidecar:
        keeper = ListenStream(http, sidecar.url, "keeper", [PRICE])
        await keeper.open()  # keeps the watch alive, polled once a minute
        try:
            assert await _text(http, sidecar.url, PRICE) == "price=100"  # cached a minute
            await shop.set_price(140)
            joiner = ListenStream(http, sidecar.url, "joiner", [PRICE])
            await joiner.open()  # its look finds 140
            try:
                assert await _text(http, sidecar.url, PRICE) == "price=140"  # nobody reads the old answer...
                await keeper.wait_update(PRICE)  # ...and the keeper is told of it
            finally:
                await joiner.close()
        finally:
            await keeper.close()


# -- 2025-11-25 sessions -------------------------------------------------------------------------------------------


class _Updates:
    """The URIs of `notifications/resources/updated` a 2025-11-25 SDK client received on its GET stream."""

    def __init__(self) -> None:
        self.uris: asyncio.Queue[str] = asyncio.Queue()

    async def __call__(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/updated":
            await self.uris.put(message.params.uri)


@pytest.mark.invariant(17)
async def test_a_2025_subscribe_whose_first_look_sees_a_change_drops_the_answer_modern_readers_had_cached(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=SLOW) as sidecar:
        assert await _text(http, sidecar.url, PRICE) == "price=100"  # cached a minute; nobody watches
        await shop.set_price(140)
        async with Client(sidecar.url, mode="legacy", cache=None, message_handler=_Updates()) as session:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)  # the SDK's nudge towards listen
                await session.subscribe_resource(PRICE)  # its first look sees 140
            assert await _text(http, sidecar.url, PRICE) == "price=140"


@pytest.mark.invariant(17)
async def test_after_a_2025_session_is_told_of_a_change_no_reader_gets_the_old_answer(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    updates = _Updates()
    async with (
        serve_sidecar(shop.url, polling=FAST) as sidecar,
        Client(sidecar.url, mode="legacy", cache=None, message_handler=updates) as session,
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await session.subscribe_resource(PRICE)
        assert await _text(http, sidecar.url, PRICE) == "price=100"  # a modern reader's answer, cached a minute
        await shop.set_price(140)
        assert await asyncio.wait_for(updates.uris.get(), 15) == PRICE
        assert await _text(http, sidecar.url, PRICE) == "price=140"
        legacy_read = await session.read_resource(PRICE)
        assert legacy_read.contents[0].text == "price=140"  # type: ignore[union-attr]
