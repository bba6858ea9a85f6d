"""Tests for the 2025-11-25-only demo upstream server, driven over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from sidecar.demo import upstream as upstream_module
from sidecar.demo.upstream import DemoUpstream
from tests.kit import eventually

SESSION = "Mcp-Session-Id"
BASIC = "catalog://plans/basic"


@pytest.fixture
async def upstream() -> AsyncIterator[DemoUpstream]:
    server = DemoUpstream(change_every_s=0)
    await server.start()
    yield server
    await server.aclose()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _initialize(http: aiohttp.ClientSession, url: str, version: str = "2025-11-25") -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    async with http.post(url, json=body) as resp:
        assert resp.status == 200
        session_id = resp.headers[SESSION]
    headers = {SESSION: session_id, "MCP-Protocol-Version": "2025-11-25"}
    async with http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers) as resp:
        assert resp.status == 202
        assert await resp.read() == b""
    return session_id


async def _call(
    http: aiohttp.ClientSession, url: str, session_id: str | None, method: str, params: Any = None
) -> tuple[int, dict[str, Any]]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": method}
    if params is not None:
        body["params"] = params
    headers = {"MCP-Protocol-Version": "2025-11-25"}
    if session_id is not None:
        headers[SESSION] = session_id
    async with http.post(url, json=body, headers=headers) as resp:
        assert resp.content_type == "application/json"
        return resp.status, await resp.json()


async def _basic_price_text(http: aiohttp.ClientSession, upstream: DemoUpstream, session_id: str) -> str:
    status, body = await _call(http, upstream.url, session_id, "resources/read", {"uri": BASIC})
    assert status == 200
    text: str = body["result"]["contents"][0]["text"]
    return text


def test_module_exports_only_the_server_class() -> None:
    assert upstream_module.__all__ == ["DemoUpstream"]


async def test_url_points_at_the_mcp_path_on_loopback(upstream: DemoUpstream) -> None:
    assert upstream.url.startswith("http://127.0.0.1:")
    assert upstream.url.endswith("/mcp")
    assert int(upstream.url.split(":")[2].split("/")[0]) > 0


async def test_initialize_answers_legacy_shape_with_a_session_id(
    upstream: DemoUpstream, http: aiohttp.ClientSession
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
    async with http.post(upstream.url, json=body) as resp:
        assert resp.status == 200
        assert resp.headers[SESSION]
        payload = await resp.json()
    assert payload == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"resources": {}, "tools": {}, "prompts": {}, "completions": {}},
            "serverInfo": {"name": "demo-catalog", "version": "1.0.0"},
        },
    }


async def test_initialize_with_an_unknown_version_answers_the_latest_legacy_one(
    upstream: DemoUpstream, http: aiohttp.ClientSession
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "1999-01-01"}}
    async with http.post(upstream.url, json=body) as resp:
        assert (await resp.json())["result"]["protocolVersion"] == "2025-11-25"


async def test_a_session_can_ping_list_and_read_after_initialize(
    upstream: DemoUpstream, http: aiohttp.ClientSession
) -> None:
    sid = await _initialize(http, upstream.url)
    assert await _call(http, upstream.url, sid, "ping") == (200, {"jsonrpc": "2.0", "id": 7, "result": {}})
    _, listed = await _call(http, upstream.url, sid, "resources/list")
    uris = [r["uri"] for r in listed["result"]["resources"]]
    assert uris == [BASIC, "catalog://plans/pro"]
    assert listed["result"]["resources"][0]["mimeType"] == "text/plain"
    _, templates = await _call(http, upstream.url, sid, "resources/templates/list")
    assert templates["result"]["resourceTemplates"][0]["uriTemplate"] == "catalog://plans/{plan}"
    _, read = await _call(http, upstream.url, sid, "resources/read", {"uri": BASIC})
    assert read["result"] == {"contents": [{"uri": BASIC, "mimeType": "text/plain", "text": "price=100"}]}
    assert not {"resultType", "ttlMs", "cacheScope"} & read["result"].keys()


async def test_set_price_is_visible_on_the_next_read(upstream: DemoUpstream, http: aiohttp.ClientSession) -> None:
    sid = await _initialize(http, upstream.url)
    upstream.set_price("basic", 123)
    assert await _basic_price_text(http, upstream, sid) == "price=123"


def test_set_price_rejects_an_unknown_plan() -> None:
    with pytest.raises(KeyError, match="gold"):
        DemoUpstream().set_price("gold", 1)


async def test_ticker_changes_the_basic_price_and_logs_it(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=upstream_module.__name__)
    server = DemoUpstream(change_every_s=0.05)
    await server.start()
    try:
        sid = await _initialize(http, server.url)
        text = "price=100"

        async def moved() -> bool:
            nonlocal text
            text = await _basic_price_text(http, server, sid)
            return text != "price=100"

        await eventually(moved, 5, 0.01, what="the demo's price moves on its own")
    finally:
        await server.aclose()
    assert int(text.removeprefix("price=")) > 100
    assert any(f"demo upstream: {BASIC} price=" in r.getMessage() for r in caplog.records)


async def test_unknown_resource_is_legacy_not_found_with_uri(
    upstream: DemoUpstream, http: aiohttp.ClientSession
) -> None:
    sid = await _initialize(http, upstream.url)
    _, body = await _call(http, upstream.url, sid, "resources/read", {"uri": "catalog://plans/gold"})
    assert body["error"] == {"code": -32002, "message": "Resource not found", "data": {"uri": "catalog://plans/gold"}}


async def test_tools_prompts_and_completion_answer_legacy_shapes(
    upstream: DemoUpstream, http: aiohttp.ClientSession
) -> None:
    sid = await _initialize(http, upstream.url)
    _, tools = await _call(http, upstream.url, sid, "tools/list")
    assert tools["result"]["tools"][0]["inputSchema"]["properties"]["seats"] == {"type": "integer", "minimum": 1}
    quote = {"name": "quote", "arguments": {"plan": "basic", "seats": 3}}
    _, called = await _call(http, upstream.url, sid, "tools/call", quote)
    assert called["result"] == {"content": [{"type": "text", "text": "basic x 3 seats = 300"}], "isError": False}
    _, unknown_tool = await _call(http, upstream.url, sid, "tools/call", {"name": "nope"})
    assert unknown_tool["error"]["code"] == -32602
    _, prompts = await _call(http, upstream.url, sid, "prompts/list")
    assert prompts["result"]["prompts"][0]["name"] == "compare_plans"
    _, prompt = await _call(http, upstream.url, sid, "prompts/get", {"name": "compare_plans"})
    assert "basic (price=100)" in prompt["result"]["messages"][0]["content"]["text"]
    ref = {"type": "ref/prompt", "name": "compare_plans"}
    _, done = await _call(
        http, upstream.url, sid, "completion/complete", {"ref": ref, "argument": {"name": "plan", "value": ""}}
    )
    assert done["result"] == {"completion": {"values": ["basic", "pro"], "total": 2, "hasMore": False}}


async def test_unknown_method_and_subscribe_are_method_not_found(
    upstream: DemoUpstream, http: aiohttp.ClientSession
) -> None:
    sid = await _initialize(http, upstream.url)
    for method in ("nope/nope", "resources/subscribe"):
        status, body = await _call(http, upstream.url, sid, method, {"uri": BASIC})
        assert (status, body["error"]["code"]) == (200, -32601)


async def test_request_without_a_session_is_400_and_with_an_unknown_one_404(
    upstream: DemoUpstream, http: aiohttp.ClientSession
) -> None:
    status, body = await _call(http, upstream.url, None, "resources/list")
    assert status == 400
    assert body["jsonrpc"] == "2.0" and "error" in body
    status, body = await _call(http, upstream.url, "no-such-session", "resources/list")
    assert status == 404
    assert "error" in body


async def test_delete_ends_the_session(upstream: DemoUpstream, http: aiohttp.ClientSession) -> None:
    sid = await _initialize(http, upstream.url)
    async with http.delete(upstream.url, headers={SESSION: sid}) as resp:
        assert resp.status == 200
    status, _ = await _call(http, upstream.url, sid, "ping")
    assert status == 404


async def test_modern_protocol_header_is_rejected_so_a_probe_falls_back(
    upstream: DemoUpstream, http: aiohttp.ClientSession
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}
    async with http.post(upstream.url, json=body, headers={"MCP-Protocol-Version": "2026-07-28"}) as resp:
        assert resp.status == 400
        assert await resp.json() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": "Bad Request: Unsupported protocol version: 2026-07-28"},
        }


async def test_malformed_json_is_a_400_parse_error(upstream: DemoUpstream, http: aiohttp.ClientSession) -> None:
    async with http.post(upstream.url, data=b"{not json", headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == -32700


async def test_get_is_method_not_allowed(upstream: DemoUpstream, http: aiohttp.ClientSession) -> None:
    async with http.get(upstream.url, headers={"Accept": "text/event-stream"}) as resp:
        assert resp.status == 405


def _tickers() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == "demo-upstream-ticker" and not task.done()]


async def _refused(url: str, http: aiohttp.ClientSession) -> bool:
    try:
        async with http.post(url, json={}):
            return False
    except aiohttp.ClientConnectionError:
        return True


async def test_aclose_stops_the_ticker_and_the_server_and_is_idempotent(http: aiohttp.ClientSession) -> None:
    server = DemoUpstream(change_every_s=0.01)
    await server.start()
    url = server.url
    assert len(_tickers()) == 1 and not await _refused(url, http)
    await server.aclose()
    assert _tickers() == [] and await _refused(url, http)
    await server.aclose()  # a second close is a no-op, not an error
    assert _tickers() == [] and await _refused(url, http)
    await server.start()  # and the server can start again
    try:
        assert len(_tickers()) == 1 and not await _refused(server.url, http)
    finally:
        await server.aclose()
