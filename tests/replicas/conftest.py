"""What the replica tests share: the SDK shop upstream that every replica of a test fronts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.cluster import RedisServer
from tests.kit import Streams
from tests.peers import Upstream, start_upstream

DEFAULT_READ_TTL_MS = 300


@pytest.fixture
async def shop(request: pytest.FixtureRequest) -> AsyncIterator[Upstream]:
    """The shop upstream; its reads' ttlMs (the poll interval) is the test module's `READ_TTL_MS`, else 300 ms."""
    read_ttl_ms = getattr(request.module, "READ_TTL_MS", DEFAULT_READ_TTL_MS)
    async with await start_upstream("modern", read_ttl_ms=read_ttl_ms) as up:
        yield up


@pytest.fixture
async def streams() -> AsyncIterator[Streams]:
    """Listen streams of `catalog://price` by default, on a client without a connection cap, all closed after."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        opened = Streams(http, ["catalog://price"])
        try:
            yield opened
        finally:
            await opened.aclose()


@pytest.fixture
async def admin(redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A plain client of the test's redis-server, answers decoded: for reading what the replicas wrote."""
    async with aioredis.Redis(host="127.0.0.1", port=redis.port, decode_responses=True) as client:
        yield client
