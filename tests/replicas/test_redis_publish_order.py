"""On the Redis bus a change reaches this replica's streams only once Redis has taken it (invariant 17): every
other replica's cache drops the stale answer on receipt, so a client told here finds none of them stale.

Real redis-server, the sidecar in-process on it, the SDK shop upstream. Redis's `CLIENT PAUSE ... WRITE` holds
the publish (a script) while reads go on, so the order is visible: while Redis holds the change, the stream
gets keep-alive comments and no update; once Redis takes it, the update follows.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import redis.asyncio as aioredis

from sidecar.app import METRICS
from tests.cluster import LEASE_MS, RedisServer
from tests.kit import eventually, headers, listen_request, serve_sidecar
from tests.peers import start_upstream

PRICE = "catalog://price"
POLLING = {"min_interval_ms": 100, "default_interval_ms": 200, "max_interval_ms": 200, "linger_ms": 100}
WITHIN_S = 15.0


@pytest.mark.invariant(17)
async def test_a_change_reaches_local_streams_only_after_redis_has_taken_it(redis: RedisServer) -> None:
    bus = {"backend": "redis", "redis_url": redis.url, "lease_ms": LEASE_MS}
    async with (
        await start_upstream("modern", read_ttl_ms=60_000) as shop,
        serve_sidecar(shop.url, polling=POLLING, bus=bus, streams={"keepalive_s": 0.1}) as sidecar,
        aiohttp.ClientSession() as http,
        aioredis.Redis(host="127.0.0.1", port=redis.port) as admin,
    ):
        metrics = sidecar.app[METRICS]
        body = listen_request([PRICE], "l")
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with http.post(sidecar.url, json=body, headers=headers("subscriptions/listen"), timeout=timeout) as resp:
            lines: list[bytes] = []
            arrived = asyncio.Event()

            async def read() -> None:
                async for line in resp.content:
                    if line.strip():
                        lines.append(line)
                        arrived.set()

            reader = asyncio.create_task(read())
            try:
                async with asyncio.timeout(WITHIN_S):
                    while not any(b"acknowledged" in line for line in lines):
                        arrived.clear()
                        await arrived.wait()
                    await eventually(lambda: metrics.leases_held._value.get() >= 1)  # this replica polls the price
                    changes = metrics.changes.labels("resource")
                    await admin.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")  # type: ignore[no-untyped-call]
                    try:
                        await shop.set_price(130)
                        await eventually(lambda: changes._value.get() >= 1)  # seen; its publish waits on Redis
                        seen = len(lines)
                        while not any(line.startswith(b":") for line in lines[seen:]):
                            arrived.clear()
                            await arrived.wait()  # a comment written after the change was seen
                        # Whatever the sidecar wrote before that comment has arrived: no update among it.
                        assert not any(b"resources/updated" in line for line in lines), lines
                    finally:
                        await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
                    while not any(b"resources/updated" in line for line in lines):
                        arrived.clear()
                        await arrived.wait()
            finally:
                reader.cancel()
