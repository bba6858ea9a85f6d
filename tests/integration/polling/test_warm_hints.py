"""A hint holds the watch warm: against a real SDK upstream whose reads lag its writes by about a second.

The upstream is our SDK stdio server whose resource is a file. Its `write_note` answers at once and the write
shows in reads a second later (as a server that re-indexes after a save); a change at the source is made
behind its back a second after the source says so. The sidecar polls every 30 s: the hint's own look comes
too early to see the change, and only the looks the warm watch keeps making can bring it within the test's
deadline, which ends long before the next poll could (27 s at the earliest, with jitter).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated, Subscription

from tests.peers.stdio_notes_server import NOTE_URI
from tests.peers.stdio_peers import notes_command, serve_stdio_sidecar

INTERVAL_MS = 30_000
POLLING = {"default_interval_ms": INTERVAL_MS, "max_interval_ms": INTERVAL_MS, "linger_ms": 100}
LAG_MS = 1000
"""How long after a write its content shows in reads (basic-memory's re-index takes 0.3 to 1 s)."""
DEADLINE_S = 12.0
"""Well before the first poll of the interval (27 s after the listen at the earliest): only a hint's looks fit."""
TOKEN = "warm-hint-token"


def _text(result: Any) -> str:
    text: str = result.contents[0].text
    return text


async def _told(subscription: Subscription) -> Any:
    async with asyncio.timeout(DEADLINE_S):
        return await anext(subscription)


@pytest.fixture
def note(tmp_path: Path) -> Path:
    path = tmp_path / "note.txt"
    path.write_text("before the save", encoding="utf-8")
    return path


async def test_a_write_through_the_sidecar_that_shows_a_second_later_is_told_before_the_next_poll(
    note: Path,
) -> None:
    command = notes_command(note, read_ttl_ms=INTERVAL_MS, write_lag_ms=LAG_MS)
    async with (
        serve_stdio_sidecar(command, polling=POLLING) as sidecar,
        Client(sidecar.url, cache=None) as client,
        client.listen(resource_subscriptions=[NOTE_URI]) as subscription,
    ):
        await client.call_tool("write_note", {"text": "saved, indexed a second later"})
        assert await _told(subscription) == ResourceUpdated(uri=NOTE_URI)
        assert _text(await client.read_resource(NOTE_URI)) == "saved, indexed a second later"


async def test_a_hint_sent_at_a_save_the_source_shows_a_second_later_is_told_before_the_next_poll(
    note: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    token_file = tmp_path / "hints-token"
    token_file.write_text(TOKEN, encoding="utf-8")
    command = notes_command(note, read_ttl_ms=INTERVAL_MS)
    async with (
        serve_stdio_sidecar(command, polling=POLLING, hints={"token_file": str(token_file)}) as sidecar,
        Client(sidecar.url, cache=None) as client,
        client.listen(resource_subscriptions=[NOTE_URI]) as subscription,
    ):
        # The save hook says so at once; the source shows the save a second later.
        shown = asyncio.get_running_loop().call_later(LAG_MS / 1000, note.write_text, "edited on disk", "utf-8")
        try:
            async with http.post(
                f"{sidecar.admin_url}/hints", json={"uris": [NOTE_URI]}, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as resp:
                assert (resp.status, await resp.json()) == (202, {"hinted": 1, "warm_ms": 3000})
            assert await _told(subscription) == ResourceUpdated(uri=NOTE_URI)
        finally:
            shown.cancel()
        assert _text(await client.read_resource(NOTE_URI)) == "edited on disk"
