"""Tools that only read cost nothing: a `tools/call` of a tool whose tools list entry says `readOnlyHint: true`
makes no watch look; any other call does, as does a tool no tools list has shown yet; `revalidate.tools` says it
either way over the annotation.

Against the SDK 2.3 shop upstream, whose `lookup_price` is marked read-only and whose `echo` carries no
annotations. The sidecar polls every ten minutes, so within a test only a write (or a hint) makes a watch look,
and it looks at one thing at a time (`polling.max_concurrency: 1`). The upstream logs every message it is sent,
in order: "no read" is its word. After the call that must not read, a hint for another watched resource is the
sync point: its look waits for any look the call had started, so that look would be in the log before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.app import METRICS
from tests.kit import ListenStream, Sidecar, eventually, listening, rpc, serve_sidecar
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
ITEM = "catalog://items/a1"
"""Watched beside the price; hinted as the sync point."""
POLLING = {"default_interval_ms": 600_000, "max_interval_ms": 600_000, "min_interval_ms": 10, "max_concurrency": 1}
"""Only a write or a hint makes a watch look within a test's waits, and looks go one after the other."""
TOKEN = "read-only-tools-hint-token"
READ_ONLY = "lookup_price"
"""Marked `readOnlyHint: true` by the shop."""
WRITING = "echo"
"""No annotations: as every tool of a server that sets none, it may write."""


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=0, list_ttl_ms=0) as up:
        yield up


@pytest.fixture
def hints(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "hints-token"
    path.write_text(TOKEN, encoding="utf-8")
    return {"token_file": str(path), "settle_ms": 0}  # one look per hint: the sync point reads once


async def _call(http: aiohttp.ClientSession, sidecar: Sidecar, tool: str) -> str:
    arguments = {"text": "hi"} if tool == WRITING else {}
    status, message = await rpc(http, sidecar.url, "tools/call", {"name": tool, "arguments": arguments})
    assert status == 200 and "result" in message, message
    text: str = message["result"]["content"][0]["text"]
    return text


def _calls_of(log: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    return [entry for entry in log if entry["method"] == "tools/call" and entry["name"] == tool]


async def _read(shop: Upstream, uri: str) -> bool:
    return await shop.count("resources/read", uri) > 0


async def _quiet_then_read(
    http: aiohttp.ClientSession, shop: Upstream, sidecar: Sidecar, quiet: str, reading: str
) -> None:
    """Call `quiet`: no watch looks (the item's hinted look, one at a time after any look `quiet` had started, finds
    no read of the price before it). Then call `reading`, the control: the price's watch looks."""
    await shop.reset_log()
    await _call(http, sidecar, quiet)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with http.post(f"{sidecar.admin_url}/hints", json={"uris": [ITEM]}, headers=headers) as resp:
        assert (resp.status, await resp.json()) == (202, {"hinted": 1, "warm_ms": 0})
    await eventually(lambda: _read(shop, ITEM), what="the hinted look at the item")
    assert await shop.count("resources/read", PRICE) == 0, f"{quiet} made the price's watch look"
    await _call(http, sidecar, reading)
    await eventually(lambda: _read(shop, PRICE), what=f"the price's look after {reading}")


def _counted(sidecar: Sidecar, decision: str, reason: str) -> float:
    value: float = sidecar.app[METRICS].tool_calls.labels(decision, reason)._value.get()
    return value


async def test_a_read_only_tool_reads_nothing_and_a_tool_without_the_annotation_still_revalidates(
    shop: Upstream, http: aiohttp.ClientSession, hints: dict[str, Any]
) -> None:
    async with serve_sidecar(shop.url, polling=POLLING, hints=hints) as sidecar:
        async with listening(ListenStream(http, sidecar.url, "l-1", [PRICE, ITEM])):
            status, listed = await rpc(http, sidecar.url, "tools/list", {})  # as a client does before calling
            assert status == 200, listed
            (entry,) = [tool for tool in listed["result"]["tools"] if tool["name"] == READ_ONLY]
            assert entry["annotations"]["readOnlyHint"] is True
            await _quiet_then_read(http, shop, sidecar, quiet=READ_ONLY, reading=WRITING)
            # The read-only call still went upstream, once, and its answer came back as the upstream gave it.
            await shop.set_price(120)
            assert await _call(http, sidecar, READ_ONLY) == "price=120"
            assert len(_calls_of(await shop.log(), READ_ONLY)) == 2
        assert _counted(sidecar, "read_only", "annotation") == 2
        assert _counted(sidecar, "revalidate", "annotation") == 1


async def test_the_tools_list_a_watch_polls_decides_as_well(
    shop: Upstream, http: aiohttp.ClientSession, hints: dict[str, Any]
) -> None:
    # No client asks for the tools list: the sidecar's own look at it, for a listener of its changes, is enough.
    async with serve_sidecar(shop.url, polling=POLLING, hints=hints) as sidecar:
        async with listening(ListenStream(http, sidecar.url, "l-2", [PRICE, ITEM], toolsListChanged=True)):
            await _quiet_then_read(http, shop, sidecar, quiet=READ_ONLY, reading=WRITING)
        assert _counted(sidecar, "read_only", "annotation") == 1
        assert _counted(sidecar, "revalidate", "annotation") == 1


async def test_a_read_only_tool_no_tools_list_has_shown_yet_revalidates(
    shop: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(shop.url, polling=POLLING) as sidecar:
        async with listening(ListenStream(http, sidecar.url, "l-3", [PRICE])):
            await shop.reset_log()
            await _call(http, sidecar, READ_ONLY)  # nobody has listed the tools: it is taken as writing
            await eventually(lambda: _read(shop, PRICE), what="the price's look after an unknown tool")
        assert _counted(sidecar, "revalidate", "unknown") == 1


async def test_revalidate_tools_overrides_the_annotation_either_way(
    shop: Upstream, http: aiohttp.ClientSession, hints: dict[str, Any]
) -> None:
    rules = [{"match": "lookup_*", "revalidate": True}, {"match": "ech*", "revalidate": False}]
    async with serve_sidecar(shop.url, polling=POLLING, hints=hints, revalidate={"tools": rules}) as sidecar:
        async with listening(ListenStream(http, sidecar.url, "l-4", [PRICE, ITEM], toolsListChanged=True)):
            await _quiet_then_read(http, shop, sidecar, quiet=WRITING, reading=READ_ONLY)
        assert _counted(sidecar, "read_only", "rule") == 1
        assert _counted(sidecar, "revalidate", "rule") == 1
