"""A stdio server that announces a change it never declared it would (as the reference SQLite server does, without
`resources.subscribe`): its `notifications/resources/updated` is a hint like any of the upstream's own.

Our SDK stdio server here answers `write_note` at once, shows the write a second later, and then sends
`resources/updated` for the note. The sidecar polls every ten minutes and a hint asks for one look
(`hints.settle_ms: 0`): the look the write through the sidecar asks for comes before the write shows, so only
the server's own notification can bring the change within the test's deadline. The child speaks 2025-11-25, as
the SQLite server does: at 2026-07-28 the SDK sends change notifications only on a listen stream asked for them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.subscriptions import ResourceUpdated, Subscription

from sidecar.app import METRICS, UPSTREAM
from sidecar.watch.native_messages import capability
from tests.peers.stdio_notes_server import NOTE_URI
from tests.peers.stdio_peers import notes_command, serve_stdio_sidecar

TEN_MINUTES_MS = 600_000
SLOW = {"default_interval_ms": TEN_MINUTES_MS, "max_interval_ms": TEN_MINUTES_MS, "linger_ms": 100}
ONE_LOOK = {"settle_ms": 0}
"""A hint asks for one look: the write's look sees nothing yet, and no warm look follows it."""
LEGACY = {"protocol": "2025-11-25"}
DEADLINE_S = 12.0
LAG_MS = 1000


async def _told(subscription: Subscription) -> Any:
    async with asyncio.timeout(DEADLINE_S):
        return await anext(subscription)


async def test_a_resources_updated_the_server_never_declared_makes_the_watch_look(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("before", encoding="utf-8")
    command = notes_command(note, read_ttl_ms=TEN_MINUTES_MS, write_lag_ms=LAG_MS, announce=True)
    async with (
        serve_stdio_sidecar(command, polling=SLOW, hints=ONE_LOOK, upstream=LEGACY) as sidecar,
        Client(sidecar.url, cache=None) as client,
        client.listen(resource_subscriptions=[NOTE_URI]) as subscription,
    ):
        info = sidecar.app[UPSTREAM].info
        assert info is not None and not capability(info.capabilities, "resources", "subscribe")
        await client.call_tool("write_note", {"text": "shown a second later"})
        assert await _told(subscription) == ResourceUpdated(uri=NOTE_URI)
        assert (await client.read_resource(NOTE_URI)).contents[0].text == "shown a second later"  # type: ignore[union-attr]
        heard = sidecar.app[METRICS].upstream_notifications.labels("notifications/resources/updated")._value.get()
        assert heard == 1
