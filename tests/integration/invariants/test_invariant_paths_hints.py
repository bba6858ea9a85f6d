"""A hint is never a change (invariant 22) on the paths beside a resource on a listen stream (test_source_hints.py):
a source hint naming a list kind, and one naming a resource a 2025-11-25 session subscribed to. Each hinted watch
looks; only a look that sees different content notifies anyone.

The sidecar polls every ten minutes, so only a hint brings a look within the test's waits; the SDK shop upstream
counts its reads, so "the hint's look happened" is its word.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.kit import ListenStream, Sidecar, eventually, serve_sidecar
from tests.kit.session import sessions
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
STATIC = "catalog://extra/static"
TOKEN = "s3cret-hint-token"
TEN_MINUTES = {"default_interval_ms": 600_000, "max_interval_ms": 600_000, "min_interval_ms": 10, "linger_ms": 100}
"""Only a hint makes a watch look within a test's waits."""


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=0, list_ttl_ms=0) as up:
        await up.add("resource", "static")
        yield up


@pytest.fixture
async def sidecar(shop: Upstream, tmp_path: Path) -> AsyncIterator[Sidecar]:
    token_file = tmp_path / "hints-token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    async with serve_sidecar(shop.url, polling=TEN_MINUTES, hints={"token_file": str(token_file)}) as served:
        yield served


async def _hint(http: aiohttp.ClientSession, sidecar: Sidecar, body: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with http.post(f"{sidecar.admin_url}/hints", json=body, headers=headers) as resp:
        assert resp.status == 202, await resp.text()
        assert (await resp.json())["hinted"] >= 1


async def _looked(shop: Upstream, method: str, uri: str | None, before: int) -> None:
    async def more() -> bool:
        return await shop.count(method, uri) > before

    await eventually(more, what=f"a look at {method} {uri or ''}")


@pytest.mark.invariant(22)
async def test_a_hint_naming_an_unchanged_list_kind_notifies_nobody(
    shop: Upstream, sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    stream = ListenStream(http, sidecar.url, "l", [PRICE], toolsListChanged=True)
    await stream.open()
    try:
        before = await shop.count("tools/list")
        await _hint(http, sidecar, {"uris": [], "lists": ["tools"]})  # nothing changed in the tools
        await _looked(shop, "tools/list", None, before)
        await shop.set_price(170)
        await _hint(http, sidecar, {"uris": [PRICE]})
        frame = await stream.next()  # a false alarm for the tools would come first
        assert frame["method"] == "notifications/resources/updated" and frame["params"]["uri"] == PRICE
    finally:
        await stream.close()


@pytest.mark.invariant(22)
async def test_a_hint_naming_a_2025_sessions_unchanged_resource_tells_it_nothing(
    shop: Upstream, sidecar: Sidecar, http: aiohttp.ClientSession
) -> None:
    async with sessions(http, sidecar.url, None) as (session,):
        await session.subscribe(STATIC)
        await session.subscribe(PRICE)
        before = await shop.count("resources/read", STATIC)
        await _hint(http, sidecar, {"uris": [STATIC]})  # nothing changed there
        await _looked(shop, "resources/read", STATIC, before)
        await shop.set_price(170)
        await _hint(http, sidecar, {"uris": [PRICE]})
        (told,) = await session.wait_updates(1)  # a false alarm for the static resource would come first
        assert told["params"] == {"uri": PRICE}
