"""The cache never holds an answer older than a watch's latest look, on any replica (invariant 17), on the paths
beside a public resource told on a listen stream (test_replica_coherence.py): a list kind, a private context's
resource, and a change told to a 2025-11-25 session.

Each test makes sure another replica, one with no stream and so no watch of its own, holds the old answer in its
cache (it answered a read from it), changes the upstream, waits for a client to be told, and reads there: only the
change heard over Redis can have dropped that entry. Real redis-server, two `mcp-sidecar run` processes, the SDK
shop upstream with a minute's ttlMs on reads and lists.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.cluster import RedisServer, Replica, sidecar_replicas
from tests.kit import WAIT_S, ListenStream, eventually, read_resource, rpc, text_of
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"
READ_TTL_MS = 60_000
"""The upstream's ttlMs for reads and lists: only a change heard can refresh a cached answer."""
CACHED = {"polling": {"min_interval_ms": 100, "default_interval_ms": 300, "max_interval_ms": 300}}
"""Polls every 300 ms while the upstream's ttlMs (a minute) keeps each replica's cached answer."""


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    """The shop upstream, its reads and its lists cached a minute."""
    async with await start_upstream("modern", read_ttl_ms=READ_TTL_MS, list_ttl_ms=READ_TTL_MS) as up:
        yield up


@pytest.fixture
async def replicas(tmp_path: Path, shop: Upstream, redis: RedisServer) -> AsyncIterator[list[Replica]]:
    async with sidecar_replicas(tmp_path, shop.url, redis.url, 2, **CACHED) as started:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        yield session


async def _cached(replica: Replica, read: Callable[[], Awaitable[Any]]) -> Any:
    """`read` on `replica` until one is answered from its cache (its bucket heard from before the request, the
    entry is kept): that answer."""
    answers: list[Any] = []

    async def hit() -> bool:
        before = (await replica.metrics()).total("mcp_sidecar_cache_hits_total")
        answers.append(await read())
        return (await replica.metrics()).total("mcp_sidecar_cache_hits_total") > before

    await eventually(hit, WAIT_S, what=f"{replica.name} answers from its cache")
    return answers[-1]


async def _tool_names(http: aiohttp.ClientSession, url: str) -> set[str]:
    status, message = await rpc(http, url, "tools/list")
    assert status == 200 and "result" in message, message
    return {tool["name"] for tool in message["result"]["tools"]}


@pytest.mark.invariant(17)
async def test_after_a_tools_list_change_is_told_on_one_replica_another_serves_the_new_list(
    shop: Upstream, replicas: list[Replica], http: aiohttp.ClientSession
) -> None:
    watcher, other = replicas
    stream = ListenStream(http, watcher.url, "tools", toolsListChanged=True)
    await stream.open()
    try:
        before = await _cached(other, lambda: _tool_names(http, other.url))
        assert "fresh" not in before
        await shop.add("tool", "fresh")
        assert (await stream.next())["method"] == "notifications/tools/list_changed"
        assert await _tool_names(http, other.url) == before | {"fresh"}
    finally:
        await stream.close()


@pytest.mark.invariant(17)
async def test_after_a_private_change_is_told_on_one_replica_another_serves_that_context_the_new_value(
    shop: Upstream, replicas: list[Replica], http: aiohttp.ClientSession
) -> None:
    watcher, other = replicas
    stream = ListenStream(http, watcher.url, "bob", [PROFILE], authorization="Bearer bob")
    await stream.open()
    try:
        cached = await _cached(other, lambda: read_resource(http, other.url, PROFILE, token="bob"))
        assert text_of(cached) == "profile of bob v1"
        await shop.bump_profile("bob")
        await stream.wait_update(PROFILE)
        assert text_of(await read_resource(http, other.url, PROFILE, token="bob")) == "profile of bob v2"
    finally:
        await stream.close()


@pytest.mark.invariant(17)
async def test_after_a_2025_session_on_one_replica_is_told_another_serves_the_new_value(
    shop: Upstream, replicas: list[Replica], http: aiohttp.ClientSession
) -> None:
    watcher, other = replicas
    told: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/updated":
            await told.put(message.params.uri)

    async with Client(watcher.url, mode="legacy", cache=None, message_handler=on_message) as session:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)  # the SDK's nudge towards listen
            await session.subscribe_resource(PRICE)
        cached = await _cached(other, lambda: read_resource(http, other.url, PRICE))
        assert text_of(cached) == "price=100"
        await shop.set_price(140)
        assert await asyncio.wait_for(told.get(), WAIT_S) == PRICE
        assert text_of(await read_resource(http, other.url, PRICE)) == "price=140"
