"""The shop-server peers behave as the sidecar tests assume (SDK client straight at the upstream)."""

from __future__ import annotations

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from tests.peers import Upstream, start_upstream


async def _read_text(url: str, uri: str, authorization: str | None = None) -> str:
    headers = {"Authorization": authorization} if authorization else {}
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http), cache=None) as client,
    ):
        result = await client.read_resource(uri)
    text: str = result.contents[0].text  # type: ignore[union-attr]
    return text


async def test_modern_speaks_2026_serves_reads_and_rejects_listen() -> None:
    async with await start_upstream("modern") as up, Client(up.url, cache=None) as client:
        assert client.protocol_version == "2026-07-28"
        result = await client.read_resource("catalog://price")
        assert result.contents[0].text == "price=100"  # type: ignore[union-attr]
        assert (result.ttl_ms, result.cache_scope) == (1000, "public")
        with pytest.raises(MCPError) as info:
            async with client.listen(resource_subscriptions=["catalog://price"]):
                pass
        assert info.value.error.code == -32601


async def test_legacy_falls_back_to_2025_and_still_serves_reads() -> None:
    async with await start_upstream("legacy") as up, Client(up.url, cache=None) as client:
        assert client.protocol_version == "2025-11-25"
        result = await client.read_resource("catalog://items/a1")
        assert result.contents[0].text == "item a1 costs 100"  # type: ignore[union-attr]
        log = await up.log()
    assert [e["method"] for e in log[:2]] == ["server/discover", "initialize"]
    assert log[-1]["session"] is not None and log[-1]["protocol_version"] == "2025-11-25"


@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_unknown_and_failing_resources_are_errors(era: str) -> None:
    async with await start_upstream(era) as up, Client(up.url, cache=None) as client:  # type: ignore[arg-type]
        for uri, code in [("catalog://nope", -32602), ("catalog://forbidden", -32603)]:
            with pytest.raises(MCPError) as info:
                await client.read_resource(uri)
            assert info.value.error.code == code


async def test_admin_set_changes_the_read_and_the_log_counts_it() -> None:
    async with await start_upstream("modern") as up:
        assert await _read_text(up.url, "catalog://price") == "price=100"
        await up.set_price(140)
        assert await _read_text(up.url, "catalog://price") == "price=140"
        assert await up.count("resources/read", "catalog://price") == 2
        await up.reset_log()
        assert await up.log() == []


async def test_log_records_authorization_and_profile_differs_per_token() -> None:
    async with await start_upstream("legacy") as up:
        assert await _read_text(up.url, "catalog://profile", "Bearer alice") == "profile of alice v1"
        assert await _read_text(up.url, "catalog://profile", "Bearer bob") == "profile of bob v1"
        assert await up.bump_profile("alice") == "profile of alice v2"
        assert await _read_text(up.url, "catalog://profile", "Bearer alice") == "profile of alice v2"
        reads = [e for e in await up.log() if e["method"] == "resources/read"]
    assert [e["authorization"] for e in reads] == ["Bearer alice", "Bearer bob", "Bearer alice"]


async def test_runtime_additions_are_listed() -> None:
    async with await start_upstream("modern") as up, Client(up.url, cache=None) as client:
        await up.add("resource", "x")
        await up.add("template", "y")
        await up.add("tool", "z")
        assert "catalog://extra/x" in {r.uri for r in (await client.list_resources()).resources}
        templates = (await client.list_resource_templates()).resource_templates
        assert "catalog://t/y/{id}" in {t.uri_template for t in templates}
        assert "z" in {t.name for t in (await client.list_tools()).tools}
        assert (await client.read_resource("catalog://t/y/7")).contents[0].text == "t y 7"  # type: ignore[union-attr]


async def test_kill_then_restart_on_the_same_port() -> None:
    up: Upstream
    async with await start_upstream("modern") as up:
        port = up.port
        await up.set_price(150)
        await up.kill()
        assert not up.running
        with pytest.raises(ExceptionGroup) as refused:  # the SDK client wraps transport errors
            await _read_text(up.url, "catalog://price")
        assert refused.group_contains(httpx2.ConnectError)
        await up.restart()
        assert up.port == port
        assert await _read_text(up.url, "catalog://price") == "price=100"  # state is fresh
    assert not up.running
