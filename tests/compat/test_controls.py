"""Controls: the same clients straight at each upstream, no sidecar, so a failure through the sidecar is the
sidecar's. Also pins what the suite assumes of the third-party servers (versions, capabilities, and how the
reference server announces updates of its own)."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPDeprecationWarning

from tests.compat.clients import SdkMode, sdk_client, surface
from tests.compat.upstreams import UPSTREAMS, open_upstream, record_latency
from tests.peers.thirdparty import Mcp1Client, missing
from tests.prereqs import needs

pytestmark = pytest.mark.timeout(120)

EVERYTHING_CADENCE_S = 5.0
"""server-everything repeats `resources/updated` for every subscribed URI at this pace once toggled on."""
TOGGLE = "toggle-subscriber-updates"


@needs(missing())
@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_the_1x_client_runs_its_whole_sequence_directly(upstream: str, tmp_path: Path) -> None:
    async with open_upstream(upstream, tmp_path) as up:
        tool, arguments = up.tool
        prompt, prompt_arguments = up.prompt
        args = ["--call", tool, json.dumps(arguments), "--read", up.stable_uri, "--read", up.watched_uri,
                "--prompt", prompt, json.dumps(prompt_arguments)]  # fmt: skip
        async with Mcp1Client.run(up.url, tmp_path, *args) as client:
            steps = await client.finish()
    initialized = steps["initialize"]["result"]
    assert initialized["protocolVersion"] == "2025-11-25"
    assert steps["initialize"]["session"] is True  # every upstream here is stateful
    # Only the reference server subscribes natively; the others are the legacy servers the sidecar is for.
    assert initialized["capabilities"]["resources"].get("subscribe", False) is (upstream == "server-everything")
    assert steps["tools/call"]["result"]["isError"] is False


@needs(missing())
async def test_server_everything_announces_updates_to_a_direct_1x_subscriber_once_toggled(tmp_path: Path) -> None:
    async with open_upstream("server-everything", tmp_path) as up:
        args = ["--subscribe", up.watched_uri, "--trigger", TOGGLE, "{}", "--wait-updated", "10"]
        async with Mcp1Client.run(up.url, tmp_path, *args) as client:
            updated = await client.step("updated")
            record_latency("control: server-everything native update after the toggle (1.x client)", updated["after_s"])
            steps = await client.finish()
    # The update is for the subscribed URI and came once the toggle was on, and the URI reads after it.
    order = [step["step"] for step in client.steps]
    assert order.index("subscribed") < order.index("triggered") < order.index("updated") < order.index("reread")
    assert updated["uri"] == steps["subscribed"]["uri"] == steps["reread"]["uri"]
    assert steps["reread"]["result"]["contents"]


@needs(missing())
async def test_server_everything_repeats_its_updates_every_five_seconds(tmp_path: Path) -> None:
    arrived: asyncio.Queue[tuple[float, str]] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/updated":
            arrived.put_nowait((asyncio.get_running_loop().time(), str(message.params.uri)))

    async with (
        open_upstream("server-everything", tmp_path) as up,
        sdk_client(up.url, "legacy", message_handler=on_message) as client,
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            await client.subscribe_resource(up.watched_uri)
        assert arrived.empty()  # subscribing alone announces nothing
        started = asyncio.get_running_loop().time()
        await client.call_tool(TOGGLE, {})
        async with asyncio.timeout(3 * EVERYTHING_CADENCE_S):
            first, first_uri = await arrived.get()  # sent at once when toggled on
            second, second_uri = await arrived.get()  # then on its own timer, with no request in between
    assert first_uri == second_uri == up.watched_uri
    record_latency("control: server-everything native update after the toggle (SDK 2.3 legacy)", first - started)
    record_latency("control: server-everything gap between its own updates", second - first)


@pytest.mark.parametrize("mode", ["2026", "legacy"])
@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_the_sdk_client_reaches_each_upstream_directly(upstream: str, mode: SdkMode, tmp_path: Path) -> None:
    async with open_upstream(upstream, tmp_path) as up, sdk_client(up.url, mode) as client:
        # Only the SDK 2.3 dual-era server speaks 2026-07-28; the default mode falls back for the rest.
        assert client.protocol_version == (up.era if mode == "2026" else "2025-11-25")
        seen = await surface(client, up)
    assert seen["tools/call"]["isError"] is False
