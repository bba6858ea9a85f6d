"""A 2025-11-25 client works through the sidecar: initialize, reads, its GET stream, its session's end.

Its requests ride an upstream session of their own and reach the upstream as they were sent; the
session id the client holds is the sidecar's. Each test runs in front of both upstreams (`upstream`
fixture): the dual-era SDK server and the handshake-only one. The SDK client is used in
`mode="legacy"`, so it opens with `initialize`.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning
from multidict import CIMultiDict

from tests.kit import LEGACY_HEADERS, LEGACY_INITIALIZE, parse_sse, serve_sidecar
from tests.peers import Upstream

LEGACY_PV = "2025-11-25"
SESSION = "Mcp-Session-Id"


class _Wire:
    """Every HTTP exchange the SDK client makes, seen from the client side."""

    def __init__(self) -> None:
        self.exchanges: list[tuple[str, int, str | None]] = []
        self.got_get = asyncio.Event()

    async def on_response(self, response: httpx2.Response) -> None:
        self.exchanges.append((response.request.method, response.status_code, response.headers.get(SESSION)))
        if response.request.method == "GET":
            self.got_get.set()


@pytest.fixture
async def wire() -> AsyncIterator[tuple[_Wire, httpx2.AsyncClient]]:
    seen = _Wire()
    async with httpx2.AsyncClient(event_hooks={"response": [seen.on_response]}) as http:
        yield seen, http


def _legacy_client(url: str, http: httpx2.AsyncClient) -> Client:
    return Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None)


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, CIMultiDict[str], list[dict[str, Any]]]:
    """One raw POST; the JSON-RPC messages of the answer, whether it came as JSON or as SSE."""
    async with session.post(url, json=body, headers={**LEGACY_HEADERS, **headers}) as resp:
        text = await resp.text()
        if resp.content_type == "text/event-stream":
            messages = parse_sse(text)
        else:
            messages = [json.loads(text)] if text else []
        return resp.status, CIMultiDict(resp.headers), messages


async def test_legacy_client_initializes_and_reads_through_the_sidecar(
    upstream: Upstream, wire: tuple[_Wire, httpx2.AsyncClient]
) -> None:
    seen, http = wire
    async with serve_sidecar(upstream.url) as sidecar, _legacy_client(sidecar.url, http) as client:
        assert client.protocol_version == LEGACY_PV
        assert client.server_info is not None and client.server_info.name == f"shop-{upstream.era}"  # the upstream's
        read = await client.read_resource("catalog://price")
        assert read.contents[0].text == "price=100"  # type: ignore[union-attr]
        item = await client.read_resource("catalog://items/a1")
        assert item.contents[0].text == "item a1 costs 100"  # type: ignore[union-attr]
        assert "echo" in {tool.name for tool in (await client.list_tools()).tools}
        called = await client.call_tool("echo", {"text": "hi"})
        assert called.content[0].text == "hi"  # type: ignore[union-attr]
        prompt = await client.get_prompt("pricing", {"sku": "a1"})
        assert prompt.messages[0].content.text == "What is the price of a1?"  # type: ignore[union-attr]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)  # the SDK's nudge towards 2026-07-28
            await client.send_ping()  # removed at 2026-07-28 (404 there), but fine in the legacy era
        # The SDK opens the session's GET stream in the background; it is served, and the session goes on.
        await asyncio.wait_for(seen.got_get.wait(), timeout=10)
        assert ("GET", 200, None) in seen.exchanges
        assert (await client.read_resource("catalog://price")).contents[0].text == "price=100"  # type: ignore[union-attr]


async def test_each_legacy_client_rides_its_own_upstream_session_and_never_sees_its_id(
    upstream: Upstream, wire: tuple[_Wire, httpx2.AsyncClient]
) -> None:
    seen, http = wire
    async with serve_sidecar(upstream.url) as sidecar:
        async with _legacy_client(sidecar.url, http) as first:
            await first.read_resource("catalog://price")
        async with _legacy_client(sidecar.url, http) as second:
            await second.list_tools()
    handed = list(dict.fromkeys(session for _, _, session in seen.exchanges if session is not None))
    assert len(handed) == 2  # one session per client, named once, at initialize
    log = await upstream.log()
    from_clients = [entry for entry in log if isinstance(entry["id"], int)]  # the sidecar's own ids are strings
    assert [entry["method"] for entry in from_clients] == ["initialize", "resources/read", "initialize", "tools/list"]
    assert [entry["id"] for entry in from_clients] == [1, 2, 1, 2]  # request ids reach the upstream untouched
    first_upstream, second_upstream = from_clients[1]["session"], from_clients[3]["session"]
    assert first_upstream and second_upstream and first_upstream != second_upstream
    assert not {first_upstream, second_upstream} & set(handed)
    assert {from_clients[1]["protocol_version"], from_clients[3]["protocol_version"]} == {LEGACY_PV}


async def test_a_deleted_legacy_session_is_gone(upstream: Upstream, http: aiohttp.ClientSession) -> None:
    read = {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "catalog://price"}}
    async with serve_sidecar(upstream.url) as sidecar:
        _, headers, _ = await _post(http, sidecar.url, LEGACY_INITIALIZE, {})
        session = {SESSION: headers[SESSION], "MCP-Protocol-Version": LEGACY_PV}
        status, _, _ = await _post(http, sidecar.url, read, session)
        assert status == 200
        async with http.delete(sidecar.url, headers=session) as resp:
            assert resp.status == 200
        status, _, messages = await _post(http, sidecar.url, read, session)
    assert status == 404  # so a legacy client knows to initialize again
    assert messages[0]["error"]["message"] == "Session not found"


async def test_legacy_answers_are_relayed_without_modern_stamping(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    read = {"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "catalog://price"}}
    answers = []
    async with serve_sidecar(upstream.url) as sidecar:
        for url in (sidecar.url, upstream.url):
            status, headers, _ = await _post(http, url, LEGACY_INITIALIZE, {})
            assert status == 200
            session = {SESSION: headers[SESSION], "MCP-Protocol-Version": LEGACY_PV}
            status, _, messages = await _post(http, url, read, session)
            assert status == 200
            answers.append(messages)
    via_sidecar, direct = answers
    assert via_sidecar == direct
    assert via_sidecar[-1]["result"]["contents"][0]["text"] == "price=100"
    assert "ttlMs" not in via_sidecar[-1]["result"]  # a legacy client gets legacy results


async def test_an_unknown_session_gets_the_upstreams_404_so_the_client_can_reinitialize(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    read = {"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": "catalog://price"}}
    async with serve_sidecar(upstream.url) as sidecar:
        status, _, messages = await _post(
            http, sidecar.url, read, {SESSION: "no-such-session", "MCP-Protocol-Version": LEGACY_PV}
        )
    assert status == 404
    assert messages[0]["error"]["message"] == "Session not found"


async def test_a_legacy_clients_answer_to_an_upstream_request_is_relayed(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    # A 2025-11-25 client answers server requests (ping, sampling, elicitation) with a POSTed
    # JSON-RPC response on its session; the upstream takes it with 202.
    async with serve_sidecar(upstream.url) as sidecar:
        status, headers, _ = await _post(http, sidecar.url, LEGACY_INITIALIZE, {})
        session = {SESSION: headers[SESSION], "MCP-Protocol-Version": LEGACY_PV}
        answer = {"jsonrpc": "2.0", "id": "server-ping-1", "result": {}}
        status, _, messages = await _post(http, sidecar.url, answer, session)
    assert (status, messages) == (202, [])


async def test_modern_and_legacy_clients_are_served_side_by_side(
    upstream: Upstream, wire: tuple[_Wire, httpx2.AsyncClient]
) -> None:
    _, http = wire
    async with (
        serve_sidecar(upstream.url) as sidecar,
        _legacy_client(sidecar.url, http) as legacy,
        Client(sidecar.url, cache=None) as modern,
    ):
        assert (legacy.protocol_version, modern.protocol_version) == (LEGACY_PV, "2026-07-28")
        await upstream.set_price(140)
        old, new = await asyncio.gather(
            legacy.read_resource("catalog://price"), modern.read_resource("catalog://price")
        )
    assert old.contents[0].text == new.contents[0].text == "price=140"  # type: ignore[union-attr]
