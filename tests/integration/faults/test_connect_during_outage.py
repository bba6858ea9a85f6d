"""A client that arrives while the upstream cannot be reached: it connects with the last discovery its context
was given (marked as cached), listens, and is told once the upstream is back, so it reads what changed meanwhile.
A context that never discovered gets the error, as does any client of a sidecar that never reached its upstream.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated

from tests.kit import eventually, readyz, rpc, serve_sidecar
from tests.peers import start_upstream
from tests.procs import free_port

PRICE = "catalog://price"
CACHED = "io.github.mcp-sidecar/cached"
POLLING = {"min_interval_ms": 100, "default_interval_ms": 300, "backoff_initial_ms": 100, "backoff_max_ms": 500}


async def _down(http: aiohttp.ClientSession, base_url: str) -> bool:
    """/readyz says not ready: the sidecar knows the upstream cannot be reached."""
    return (await readyz(http, base_url))[0] == 503


@pytest.mark.invariant(23)
async def test_a_new_sdk_client_connects_and_listens_during_an_outage_and_is_told_of_a_change_once_it_is_back(
    http: aiohttp.ClientSession,
) -> None:
    async with await start_upstream("modern") as up, serve_sidecar(up.url, polling=POLLING) as sidecar:
        status, live = await rpc(http, sidecar.url, "server/discover")
        assert status == 200 and CACHED not in live["result"]["_meta"], live
        await up.set_price(150)

        await up.kill()  # back later on the same port, with its price as it starts: 100

        await eventually(lambda: _down(http, sidecar.base_url), what="/readyz says not ready")
        status, cached = await rpc(http, sidecar.url, "server/discover")
        assert status == 200, cached
        assert cached["result"]["_meta"].pop(CACHED) is True
        assert cached["result"] == live["result"], "the last discovery, with the sidecar's own capabilities"

        async with Client(sidecar.url, cache=None) as client:
            async with client.listen(resource_subscriptions=[PRICE]) as subscription:
                assert subscription.honored.resource_subscriptions == [PRICE]
                await up.start()
                async with asyncio.timeout(15):
                    event = await anext(e async for e in subscription if isinstance(e, ResourceUpdated))
                assert event.uri == PRICE
                result = await client.read_resource(PRICE)
                assert result.contents[0].text == "price=100"  # type: ignore[union-attr]


async def test_during_an_outage_a_context_that_never_discovered_gets_the_error(http: aiohttp.ClientSession) -> None:
    async with await start_upstream("modern") as up, serve_sidecar(up.url, polling=POLLING) as sidecar:
        bearer = {"Authorization": "Bearer alice"}
        status, _ = await rpc(http, sidecar.url, "server/discover", extra_headers=bearer)
        assert status == 200
        await up.kill()
        await eventually(lambda: _down(http, sidecar.base_url), what="/readyz says not ready")
        status, answer = await rpc(http, sidecar.url, "server/discover", extra_headers=bearer)
        assert status == 200 and answer["result"]["_meta"][CACHED] is True, answer

        # Another credential's context was never given a discovery: what alice was told is not bob's.
        status, answer = await rpc(http, sidecar.url, "server/discover", extra_headers={"Authorization": "Bearer bob"})
        assert status == 502 and answer["error"]["message"] == "the upstream is unavailable", answer


async def test_a_sidecar_that_never_reached_its_upstream_answers_discover_with_the_error(
    http: aiohttp.ClientSession,
) -> None:
    async with serve_sidecar(f"http://127.0.0.1:{free_port()}/mcp") as sidecar:
        status, answer = await rpc(http, sidecar.url, "server/discover")
        assert status == 502 and answer["error"]["message"] == "the upstream is unavailable", answer
        status, answer = await rpc(
            http, sidecar.url, "subscriptions/listen", {"notifications": {"resourceSubscriptions": [PRICE]}}
        )
        assert status == 502 and "error" in answer, answer
