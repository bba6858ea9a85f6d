"""2025-11-25 clients subscribe through the sidecar to an upstream that cannot, and share its watches."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import aiohttp
import pytest
from mcp import Client, MCPError
from mcp.shared.exceptions import MCPDeprecationWarning

from sidecar.app import LEGACY, REGISTRY
from tests.kit import (
    LEGACY_HEADERS,
    LEGACY_INITIALIZE,
    eventually,
    headers,
    listen_request,
    serve_sidecar,
    sse_messages,
)
from tests.peers import Upstream

FAST = {"min_interval_ms": 100, "default_interval_ms": 300, "linger_ms": 100}
PRICE = "catalog://price"

pytestmark = pytest.mark.parametrize("fast_upstream", ["modern", "legacy"], indirect=True)
"""Every test here runs against a shop server of each era."""


class _Updates:
    """Resource-updated notifications a legacy SDK client received on its GET stream."""

    def __init__(self) -> None:
        self.uris: asyncio.Queue[str] = asyncio.Queue()

    async def __call__(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/updated":
            await self.uris.put(message.params.uri)

    async def next(self) -> str:
        return await asyncio.wait_for(self.uris.get(), 15)


def _legacy(url: str, updates: _Updates) -> Client:
    return Client(url, mode="legacy", cache=None, message_handler=updates)


async def test_a_legacy_client_subscribes_and_is_told_of_an_out_of_band_change(fast_upstream: Upstream) -> None:
    updates = _Updates()
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar, _legacy(sidecar.url, updates) as client:
        assert client.protocol_version == "2025-11-25"
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.subscribe is True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)  # the SDK's nudge towards listen
            await client.subscribe_resource(PRICE)
            await fast_upstream.set_price(125)
            assert await updates.next() == PRICE
            assert (await client.read_resource(PRICE)).contents[0].text == "price=125"  # type: ignore[union-attr]
            await client.unsubscribe_resource(PRICE)


async def test_unsubscribe_stops_the_notifications(fast_upstream: Upstream) -> None:
    updates = _Updates()
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar, _legacy(sidecar.url, updates) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource(PRICE)
            await client.unsubscribe_resource(PRICE)
        # With no subscriber left the watch lingers out; a change after that reaches nobody.
        await eventually(lambda: not any(w.key.kind == "resource" for w in sidecar.app[REGISTRY].watches()))
        await fast_upstream.set_price(126)
        await client.read_resource(PRICE)  # the session is alive and served
        assert updates.uris.empty()


async def test_subscribing_to_a_missing_resource_is_resource_not_found(fast_upstream: Upstream) -> None:
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar, _legacy(sidecar.url, _Updates()) as client:
        with warnings.catch_warnings(), pytest.raises(MCPError) as refused:
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource("catalog://nope")
    assert refused.value.error.code == -32002


async def test_a_legacy_session_and_a_listen_stream_share_one_watch(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    updates = _Updates()
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar, _legacy(sidecar.url, updates) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource(PRICE)
        body = listen_request([PRICE], "L")
        async with http.post(sidecar.url, json=body, headers=headers("subscriptions/listen")) as resp:
            frames = sse_messages(resp)
            assert (await anext(frames))["params"]["notifications"]["resourceSubscriptions"] == [PRICE]
            resource_watches = [w for w in sidecar.app[REGISTRY].watches() if w.key.kind == "resource"]
            assert len(resource_watches) == 1 and resource_watches[0].refs == 2
            await fast_upstream.set_price(127)
            assert (await asyncio.wait_for(anext(frames), 15))["params"]["uri"] == PRICE
            assert await updates.next() == PRICE


async def test_a_legacy_session_gets_list_changes_on_its_get_stream(fast_upstream: Upstream) -> None:
    got = asyncio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            got.set()

    async with (
        serve_sidecar(fast_upstream.url, polling=FAST) as sidecar,
        Client(sidecar.url, mode="legacy", cache=None, message_handler=on_message) as client,
    ):
        await eventually(lambda: any(w.key.kind == "tools_list" for w in sidecar.app[REGISTRY].watches()))
        await fast_upstream.add("tool", "brand_new")
        await asyncio.wait_for(got.wait(), 15)
        assert "brand_new" in {tool.name for tool in (await client.list_tools()).tools}


async def test_an_idle_session_expires_and_its_watches_are_released(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    init, plain = LEGACY_INITIALIZE, LEGACY_HEADERS
    async with serve_sidecar(fast_upstream.url, polling=FAST, streams={"session_idle_s": 0.5}) as sidecar:
        async with http.post(sidecar.url, json=init, headers=plain) as resp:
            session = resp.headers["Mcp-Session-Id"]
        on_session = {**plain, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        subscribe = {"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": PRICE}}
        async with http.post(sidecar.url, json=subscribe, headers=on_session) as resp:
            assert (await resp.json())["result"] == {}
        assert sidecar.app[LEGACY].count == 1
        await eventually(lambda: sidecar.app[LEGACY].count == 0)
        await eventually(lambda: not any(w.key.kind == "resource" for w in sidecar.app[REGISTRY].watches()))
        async with http.post(sidecar.url, json=subscribe, headers=on_session) as resp:
            assert resp.status == 404  # the client initializes again


async def test_two_concurrent_subscribes_of_one_uri_leave_nothing_behind_after_unsubscribe(
    fast_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    init, plain = LEGACY_INITIALIZE, LEGACY_HEADERS
    async with serve_sidecar(fast_upstream.url, polling=FAST) as sidecar:
        async with http.post(sidecar.url, json=init, headers=plain) as resp:
            on_session = {
                **plain,
                "Mcp-Session-Id": resp.headers["Mcp-Session-Id"],
                "MCP-Protocol-Version": "2025-11-25",
            }

        async def call(method: str, request_id: int) -> dict[str, Any]:
            body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {"uri": PRICE}}
            async with http.post(sidecar.url, json=body, headers=on_session) as resp:
                return dict(await resp.json())

        first, second = await asyncio.gather(call("resources/subscribe", 2), call("resources/subscribe", 3))
        assert first["result"] == second["result"] == {}
        assert (await call("resources/unsubscribe", 4))["result"] == {}
        # One unsubscribe releases everything the session held on that URI: the watch lingers out.
        await eventually(lambda: not any(w.key.kind == "resource" for w in sidecar.app[REGISTRY].watches()))


async def test_a_legacy_clients_tool_call_makes_the_watches_poll_at_once(fast_upstream: Upstream) -> None:
    # A poll interval no test waits out: only revalidation after the write can deliver the change in time.
    slow = {"min_interval_ms": 100, "default_interval_ms": 60_000, "max_interval_ms": 60_000, "linger_ms": 100}
    updates = _Updates()
    async with serve_sidecar(fast_upstream.url, polling=slow) as sidecar, _legacy(sidecar.url, updates) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource(PRICE)
        await client.call_tool("set_price", {"value": 131})
        assert await asyncio.wait_for(updates.uris.get(), 5) == PRICE
        assert (await client.read_resource(PRICE)).contents[0].text == "price=131"  # type: ignore[union-attr]
