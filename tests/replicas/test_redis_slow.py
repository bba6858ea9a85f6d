"""A slow Redis bus never costs a subscription: a watch that waits on Redis for its first look's publish is
being started, not idle, however short the linger.

Real redis-server, the sidecar in-process on it, the SDK shop upstream. Redis's `CLIENT PAUSE ... WRITE` holds
every write (the first look's publish is a script) for a while, as a stalled Redis would, while reads go on.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.cluster import LEASE_MS, RedisServer
from tests.kit import headers, listen_request, serve_sidecar, sse_messages
from tests.peers import start_upstream

PRICE = "catalog://price"
POLLING = {"min_interval_ms": 100, "default_interval_ms": 200, "max_interval_ms": 200, "linger_ms": 100}
STALL_MS = 3_000
"""Far longer than the linger, and than any grace a new watch could be given on top of it: before the first
look's publish returns, an idle watch would have been collected."""
WITHIN_S = 20.0


@pytest.mark.invariant(2)
@pytest.mark.invariant(6)
async def test_a_watch_waiting_on_a_stalled_redis_for_its_first_publish_is_acknowledged(redis: RedisServer) -> None:
    bus = {"backend": "redis", "redis_url": redis.url, "lease_ms": LEASE_MS}
    async with (
        await start_upstream("modern", read_ttl_ms=60_000) as shop,
        serve_sidecar(shop.url, polling=POLLING, bus=bus) as sidecar,
        aiohttp.ClientSession() as http,
        aioredis.Redis(host="127.0.0.1", port=redis.port) as admin,
    ):
        body = listen_request([PRICE], "slow")
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        await admin.execute_command("CLIENT", "PAUSE", STALL_MS, "WRITE")  # type: ignore[no-untyped-call]
        try:
            async with http.post(
                sidecar.url, json=body, headers=headers("subscriptions/listen"), timeout=timeout
            ) as resp:
                frames = sse_messages(resp)
                async with asyncio.timeout(WITHIN_S):
                    ack = await anext(frames)
                    assert ack["method"] == "notifications/subscriptions/acknowledged"
                    assert ack["params"]["notifications"].get("resourceSubscriptions") == [PRICE], ack
                    # The watch honours it: a change after the ack is told.
                    await shop.set_price(130)
                    update = await anext(frames)
                assert update["method"] == "notifications/resources/updated"
                assert update["params"]["uri"] == PRICE
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
