"""Real stdio MCP servers behind the sidecar, through the SDK 2.3 client in both eras.

The servers: our SDK 2.3 server whose resource is a file (changed behind its back, and through a tool),
the npm reference server (`server-everything`) in stdio mode, and `mcp-server-time` of both SDK eras.
The 2026-07-28 client must negotiate 2026-07-28 and get its listen streams honoured whatever the child
speaks; the 2025-11-25 client (`mode="legacy"`) subscribes on a session of the sidecar's own.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.client.subscriptions import ResourceUpdated, Subscription, ToolsListChanged
from mcp.shared.exceptions import MCPDeprecationWarning

from sidecar.app import METRICS, UPSTREAM
from sidecar.config import CacheConfig
from sidecar.upstream.base import NotificationSource
from sidecar.upstream.stdio.client import StdioUpstream
from tests.kit import WAIT_S, ListenStream, eventually, rpc, scrape
from tests.peers.stdio_notes_server import NOTE_URI
from tests.peers.stdio_peers import (
    everything_command,
    notes_command,
    serve_stdio_sidecar,
    stdio_config,
    time1_command,
    time2_command,
)

FAST = {"min_interval_ms": 100, "default_interval_ms": 300, "max_interval_ms": 300, "linger_ms": 100}
"""Polling every 300 ms: an out-of-band change is seen within a fraction of a second."""
SLOW = {"min_interval_ms": 100, "default_interval_ms": 600_000, "max_interval_ms": 600_000, "linger_ms": 100}
"""Polling every ten minutes: a change seen within WAIT_S came from the revalidation a write triggers."""
SLOW_TTL_MS = 600_000
DYNAMIC = "demo://resource/dynamic/text/1"
"""server-everything's text resource, stamped with the time of each read: it changes every second."""


def _text(result: Any) -> str:
    text: str = result.contents[0].text
    return text


async def _next(subscription: Subscription) -> Any:
    async with asyncio.timeout(WAIT_S):
        return await anext(subscription)


class _Notifications:
    """What a 2025-11-25 SDK client receives on its session's GET stream."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[Any] = asyncio.Queue()

    async def __call__(self, message: Any) -> None:
        if hasattr(message, "method"):
            await self.received.put(message)

    async def next(self, method: str) -> Any:
        async with asyncio.timeout(WAIT_S):
            while True:
                message = await self.received.get()
                if message.method == method:
                    return message


# -- our SDK 2.3 server whose resource is a file -------------------------------------------------------------


async def test_a_2026_client_uses_every_primitive_and_hears_of_a_change_behind_the_servers_back(
    tmp_path: Path,
) -> None:
    note = tmp_path / "note.txt"
    note.write_text("first", encoding="utf-8")
    async with (
        serve_stdio_sidecar(notes_command(note, read_ttl_ms=300), polling=FAST) as sidecar,
        Client(sidecar.url, cache=None) as client,
    ):
        assert client.protocol_version == "2026-07-28"
        assert sidecar.app[UPSTREAM].info is not None and sidecar.app[UPSTREAM].info.era == "modern"
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert {"write_note", "add_tool", "server_pid", "slow"} <= tools
        prompt = await client.get_prompt("summarize", {"topic": "pipes"})
        assert "pipes" in prompt.messages[0].content.text  # type: ignore[union-attr]
        assert [str(resource.uri) for resource in (await client.list_resources()).resources] == [NOTE_URI]
        assert _text(await client.read_resource(NOTE_URI)) == "first"
        async with client.listen(resource_subscriptions=[NOTE_URI], tools_list_changed=True) as subscription:
            assert subscription.honored.resource_subscriptions == [NOTE_URI]
            assert subscription.honored.tools_list_changed
            note.write_text("changed behind its back", encoding="utf-8")
            assert await _next(subscription) == ResourceUpdated(uri=NOTE_URI)
            assert _text(await client.read_resource(NOTE_URI)) == "changed behind its back"
            await client.call_tool("add_tool", {"name": "late"})
            assert await _next(subscription) == ToolsListChanged()
            assert "late" in {tool.name for tool in (await client.list_tools()).tools}


async def test_a_change_through_a_tool_is_told_at_once_not_a_poll_later(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("first", encoding="utf-8")
    async with (
        serve_stdio_sidecar(notes_command(note, read_ttl_ms=SLOW_TTL_MS), polling=SLOW) as sidecar,
        Client(sidecar.url, cache=None) as client,
        client.listen(resource_subscriptions=[NOTE_URI]) as subscription,
    ):
        await client.call_tool("write_note", {"text": "written through the sidecar"})
        assert await _next(subscription) == ResourceUpdated(uri=NOTE_URI)
        assert _text(await client.read_resource(NOTE_URI)) == "written through the sidecar"


@pytest.mark.parametrize(
    "polling",
    [
        pytest.param(FAST, id="out-of-band"),
        pytest.param(SLOW, id="through-a-tool"),
    ],
)
async def test_a_2025_client_subscribes_and_hears_of_changes(tmp_path: Path, polling: dict[str, int]) -> None:
    note = tmp_path / "note.txt"
    note.write_text("first", encoding="utf-8")
    ttl_ms = 300 if polling is FAST else SLOW_TTL_MS
    heard = _Notifications()
    async with (
        serve_stdio_sidecar(notes_command(note, read_ttl_ms=ttl_ms), polling=polling) as sidecar,
        Client(sidecar.url, mode="legacy", cache=None, message_handler=heard) as client,
    ):
        assert client.protocol_version == "2025-11-25"
        assert client.server_capabilities.resources is not None
        assert client.server_capabilities.resources.subscribe is True
        assert "write_note" in {tool.name for tool in (await client.list_tools()).tools}
        assert "summarize" in {prompt.name for prompt in (await client.list_prompts()).prompts}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)  # the SDK's nudge towards listen
            await client.subscribe_resource(NOTE_URI)
        if polling is FAST:
            note.write_text("changed behind its back", encoding="utf-8")
        else:
            await client.call_tool("write_note", {"text": "changed behind its back"})
        updated = await heard.next("notifications/resources/updated")
        assert str(updated.params.uri) == NOTE_URI
        assert _text(await client.read_resource(NOTE_URI)) == "changed behind its back"


async def test_progress_reaches_the_client_that_asked_for_it(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("", encoding="utf-8")
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with serve_stdio_sidecar(notes_command(note)) as sidecar, Client(sidecar.url, cache=None) as client:
        result = await client.call_tool("slow", {"steps": 3}, progress_callback=on_progress)
        assert result.content[0].text == "done after 3 steps"  # type: ignore[union-attr]
    assert progress == [1, 2, 3]


# -- the npm reference server, stdio mode ---------------------------------------------------------------------


async def test_server_everything_serves_both_eras_with_subscriptions() -> None:
    command = everything_command()
    heard = _Notifications()
    async with serve_stdio_sidecar(command, polling={**FAST, "default_interval_ms": 500}) as sidecar:
        async with Client(sidecar.url, cache=None) as client:
            assert client.protocol_version == "2026-07-28"
            assert sidecar.app[UPSTREAM].info is not None and sidecar.app[UPSTREAM].info.era == "legacy"
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"echo", "trigger-long-running-operation"} <= tools
            echoed = await client.call_tool("echo", {"message": "through stdio"})
            assert echoed.content[0].text == "Echo: through stdio"  # type: ignore[union-attr]
            assert "simple-prompt" in {prompt.name for prompt in (await client.list_prompts()).prompts}
            resources = [str(resource.uri) for resource in (await client.list_resources()).resources]
            static = next(uri for uri in resources if uri.startswith("demo://resource/static/document/"))
            assert _text(await client.read_resource(static))
            async with client.listen(resource_subscriptions=[DYNAMIC], tools_list_changed=True) as subscription:
                assert subscription.honored.resource_subscriptions == [DYNAMIC]
                assert subscription.honored.tools_list_changed
                assert await _next(subscription) == ResourceUpdated(uri=DYNAMIC)  # its text carries the time
        async with Client(sidecar.url, mode="legacy", cache=None, message_handler=heard) as legacy:
            assert legacy.protocol_version == "2025-11-25"
            assert "echo" in {tool.name for tool in (await legacy.list_tools()).tools}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await legacy.subscribe_resource(DYNAMIC)
            updated = await heard.next("notifications/resources/updated")
            assert str(updated.params.uri) == DYNAMIC


async def test_server_everythings_progress_reaches_the_client_that_asked() -> None:
    command = everything_command()
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with serve_stdio_sidecar(command) as sidecar, Client(sidecar.url, cache=None) as client:
        done = await client.call_tool(
            "trigger-long-running-operation", {"duration": 0.3, "steps": 3}, progress_callback=on_progress
        )
        assert "completed" in done.content[0].text  # type: ignore[union-attr]
    assert progress == [1, 2, 3]


async def test_a_notification_listener_hears_a_list_change_from_server_everything() -> None:
    config = stdio_config(everything_command())
    upstream = StdioUpstream(config.upstream, CacheConfig())
    assert isinstance(upstream, NotificationSource)
    heard: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    remove = upstream.add_notification_listener(heard.put_nowait)
    await upstream.start()
    try:
        async with asyncio.timeout(WAIT_S):
            while (await heard.get()).get("method") != "notifications/tools/list_changed":
                pass
        # Its own resources/updated, once subscribed upstream (the watch engine's hints).
        await upstream.call("resources/subscribe", {"uri": DYNAMIC})
        await upstream.call("tools/call", {"name": "toggle-subscriber-updates", "arguments": {}})
        async with asyncio.timeout(WAIT_S):
            while (message := await heard.get()).get("method") != "notifications/resources/updated":
                pass
        assert message["params"]["uri"] == DYNAMIC
    finally:
        remove()
        remove()  # idempotent
        await upstream.aclose()


@pytest.mark.invariant(19)
async def test_server_everythings_own_notifications_over_stdio_make_the_sidecar_look_at_once(
    http: aiohttp.ClientSession,
) -> None:
    # It declares resources.subscribe: the sidecar subscribes on the child and listens to it; the child's
    # updates (after toggle-subscriber-updates, every 5 s, content unchanged or not) are hints, each a read.
    slow = {"default_interval_ms": 60_000, "max_interval_ms": 120_000, "min_interval_ms": 50}
    async with serve_stdio_sidecar(everything_command(), polling=slow) as sidecar:
        metrics = sidecar.app[METRICS]
        stream = ListenStream(http, sidecar.url, "l", [DYNAMIC])
        await stream.open()
        try:
            await eventually(lambda: metrics.native_watches._value.get() == 1, within_s=WAIT_S)
            polls_before = metrics.polls.labels("resource", "ok")._value.get()
            await rpc(http, sidecar.url, "tools/call", {"name": "toggle-subscriber-updates", "arguments": {}})
            updates = metrics.upstream_notifications.labels("notifications/resources/updated")
            await eventually(lambda: updates._value.get() >= 1, within_s=WAIT_S)
            # Each hint is a read, 60 s before the poll interval would make one; the text holds the time, so it
            # changed, and the client is told.
            await eventually(lambda: metrics.polls.labels("resource", "ok")._value.get() > polls_before)
            frame = await stream.next()
            assert frame["params"]["uri"] == DYNAMIC
        finally:
            await stream.close()


# -- mcp-server-time, both SDK eras ---------------------------------------------------------------------------


@pytest.mark.parametrize("era", ["1.x", "2026"])
async def test_mcp_server_time_serves_both_eras(era: str, http: aiohttp.ClientSession) -> None:
    command = time1_command() if era == "1.x" else time2_command()
    async with serve_stdio_sidecar(command) as sidecar:
        async with Client(sidecar.url, cache=None) as client:
            assert client.protocol_version == "2026-07-28"
            assert {"get_current_time", "convert_time"} <= {tool.name for tool in (await client.list_tools()).tools}
            now = await client.call_tool("get_current_time", {"timezone": "Etc/UTC"})
            assert "Etc/UTC" in now.content[0].text  # type: ignore[union-attr]
            async with client.listen(tools_list_changed=True, resource_subscriptions=["time://none"]) as sub:
                assert sub.honored.tools_list_changed  # it has tools: their list is watched
                assert not sub.honored.resource_subscriptions  # and no resources: left out of the ack
        async with Client(sidecar.url, mode="legacy", cache=None) as legacy:
            assert legacy.protocol_version == "2025-11-25"
            converted = await legacy.call_tool(
                "convert_time", {"source_timezone": "Etc/UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}
            )
            assert "Asia/Tokyo" in converted.content[0].text  # type: ignore[union-attr]
        info = sidecar.app[UPSTREAM].info
        assert info is not None and info.era == ("legacy" if era == "1.x" else "modern")
        status, reply = await rpc(http, sidecar.url, "tools/list")
        assert status == 200 and reply["result"]["resultType"] == "complete"
        metrics = await scrape(http, sidecar.admin_url)
        assert metrics.value("mcp_sidecar_upstream_up") == 1
        assert metrics.value("mcp_sidecar_upstream_era_info", era=info.revision) == 1
        assert (metrics.value("mcp_sidecar_upstream_requests_total", method="tools/call", outcome="ok") or 0) >= 1
        async with http.get(f"{sidecar.admin_url}/status") as resp:
            upstream = (await resp.json())["upstream"]
        assert upstream["url"].startswith("stdio: ") and upstream["era"] == info.revision and upstream["up"] is True
        async with http.get(f"{sidecar.base_url}/readyz") as resp:
            assert resp.status == 200
