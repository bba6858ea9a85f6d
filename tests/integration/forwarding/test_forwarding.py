"""The official SDK client through the sidecar gets the upstream's answers, in either upstream era."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from mcp import Client

from tests.kit import rpc, serve_sidecar, told
from tests.peers import Upstream

_STAMPED = {"resultType", "ttlMs", "cacheScope", "_meta"}


def _plain(model: Any) -> Any:
    data = model.model_dump(mode="json", exclude_none=True, by_alias=True)
    return {k: v for k, v in data.items() if k not in _STAMPED and k not in ("ttl_ms", "cache_scope", "result_type")}


async def test_sdk_client_gets_the_upstreams_answers_through_the_sidecar(upstream: Upstream) -> None:
    async with (
        serve_sidecar(upstream.url) as sidecar,
        Client(sidecar.url, cache=None) as via,
        Client(upstream.url, cache=None) as direct,
    ):
        assert via.protocol_version == "2026-07-28"
        for call in (
            lambda c: c.list_resources(),
            lambda c: c.list_resource_templates(),
            lambda c: c.read_resource("catalog://price"),
            lambda c: c.read_resource("catalog://items/abc"),
            lambda c: c.list_tools(),
            lambda c: c.call_tool("echo", {"text": "hi"}),
            lambda c: c.list_prompts(),
            lambda c: c.get_prompt("pricing", {"sku": "a1"}),
        ):
            assert _plain(await call(via)) == _plain(await call(direct))


async def test_read_through_a_legacy_upstream_is_stamped_for_modern_clients(
    legacy_upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(legacy_upstream.url) as sidecar:
        status, reply = await rpc(http, sidecar.url, "resources/read", {"uri": "catalog://price"}, request_id="r1")
    assert status == 200
    assert reply["id"] == "r1"
    result = reply["result"]
    assert result["contents"][0]["text"] == "price=100"
    assert (result["resultType"], result["ttlMs"], result["cacheScope"]) == ("complete", 0, "private")


async def test_unknown_resource_is_invalid_params_with_its_uri(upstream: Upstream, http: aiohttp.ClientSession) -> None:
    async with serve_sidecar(upstream.url) as sidecar:
        _, reply = await rpc(http, sidecar.url, "resources/read", {"uri": "catalog://nope"}, request_id=7)
    assert reply["id"] == 7
    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["uri"] == "catalog://nope"


async def test_discover_names_the_sidecar_and_the_upstream(upstream: Upstream, http: aiohttp.ClientSession) -> None:
    async with serve_sidecar(upstream.url) as sidecar:
        status, reply = await rpc(http, sidecar.url, "server/discover")
    assert status == 200
    result = reply["result"]
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-sidecar"
    assert result["_meta"]["io.github.mcp-sidecar/upstreamServerInfo"]["name"] == f"shop-{upstream.era}"
    assert isinstance(result["ttlMs"], int) and result["cacheScope"] in ("public", "private")


@pytest.mark.parametrize("era", ["legacy"])
async def test_a_restarted_legacy_upstream_is_initialized_again(era: str, legacy_upstream: Upstream) -> None:
    async with serve_sidecar(legacy_upstream.url) as sidecar, Client(sidecar.url, cache=None) as client:
        first = await client.read_resource("catalog://price")
        await legacy_upstream.restart()
        second = await client.read_resource("catalog://price")
    assert first.contents[0].text == second.contents[0].text == "price=100"  # type: ignore[union-attr]
    initializes = await legacy_upstream.count("initialize")
    assert initializes == 1  # the restarted process saw exactly one new session


async def test_upstream_down_is_a_clear_error_and_readiness_follows(
    modern_upstream: Upstream, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve_sidecar(modern_upstream.url, upstream={"timeout_s": 5}) as sidecar:
        async with http.get(f"{sidecar.base_url}/readyz") as resp:
            assert resp.status == 200
        await modern_upstream.kill()
        status, reply = await rpc(http, sidecar.url, "tools/list")
        assert status == 502
        assert reply["error"]["message"] == "the upstream is unavailable"  # no address: the log has it, by the id
        assert told(reply["error"], caplog.records)["upstream"] == modern_upstream.url
        async with http.get(f"{sidecar.base_url}/readyz") as resp:
            assert resp.status == 503
        async with http.get(f"{sidecar.admin_url}/readyz") as resp:
            assert resp.status == 503
            assert "reason" in await resp.json()
        await modern_upstream.restart()
        async with http.get(f"{sidecar.base_url}/readyz") as resp:
            assert resp.status == 200
        status, reply = await rpc(http, sidecar.url, "tools/list")
        assert status == 200 and "tools" in reply["result"]
