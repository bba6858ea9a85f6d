"""A genuine 1.x SDK client (`tests/peers/mcp1_client.py`, mcp 1.30) through the sidecar, in front of each upstream.

The client speaks 2025-11-25 only: through the sidecar it must see what it sees directly (lists, a read, a tool
call, a prompt), get `resources.subscribe` and honoured subscriptions, hear an out-of-band change within one
poll interval, and hear a change made by its own tools/call while the sidecar polls only every 10 minutes.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.compat.upstreams import (
    OUT_OF_BAND_POLLING,
    OUT_OF_BAND_WITHIN_S,
    POLL_INTERVAL_MS,
    SLOW_POLL_MS,
    SLOW_POLLING,
    TOOL_CHANGE_WITHIN_S,
    TOOL_CHANGEABLE,
    UPSTREAMS,
    CompatUpstream,
    comparable,
    open_upstream,
    record_latency,
)
from tests.kit import serve_sidecar
from tests.peers.thirdparty import Mcp1Client, missing
from tests.prereqs import needs

pytestmark = [needs(missing()), pytest.mark.timeout(120)]

SURFACE = ["tools/list", "tools/call", "resources/list", "resources/templates/list", "resources/read", "prompts/list"]


def surface_args(up: CompatUpstream) -> list[str]:
    """The script's options for the lists, one read of the stable resource, the tool call and the prompt."""
    tool, arguments = up.tool
    prompt, prompt_arguments = up.prompt
    return [
        "--call", tool, json.dumps(arguments), "--read", up.stable_uri,
        "--prompt", prompt, json.dumps(prompt_arguments),
    ]  # fmt: skip


def text_of(step: dict[str, Any]) -> str:
    text = step["result"]["contents"][0]["text"]
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_the_1x_client_negotiates_2025_and_sees_what_it_sees_directly(upstream: str, tmp_path: Path) -> None:
    async with open_upstream(upstream, tmp_path) as up:
        async with Mcp1Client.run(up.url, tmp_path, *surface_args(up)) as direct:
            expected = await direct.finish()
        async with serve_sidecar(up.url) as sidecar, Mcp1Client.run(sidecar.url, tmp_path, *surface_args(up)) as client:
            seen = await client.finish()
    initialized = seen["initialize"]["result"]
    assert initialized["protocolVersion"] == "2025-11-25"
    assert initialized["capabilities"]["resources"]["subscribe"] is True, initialized["capabilities"]
    for step in [*SURFACE, "prompts/get"]:
        assert comparable(seen[step]["result"]) == comparable(expected[step]["result"]), f"{step} differs from direct"


@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_the_1x_client_hears_an_out_of_band_change_within_one_poll_interval(
    upstream: str, tmp_path: Path
) -> None:
    async with (
        open_upstream(upstream, tmp_path, read_ttl_ms=POLL_INTERVAL_MS) as up,
        serve_sidecar(up.url, polling=OUT_OF_BAND_POLLING) as sidecar,
    ):
        args = ["--read", up.watched_uri, "--subscribe", up.watched_uri, "--wait-updated", str(OUT_OF_BAND_WITHIN_S)]
        async with Mcp1Client.run(sidecar.url, tmp_path, *args) as client:
            before = text_of(await client.step("resources/read"))
            await client.step("subscribed")
            expected = await up.change_out_of_band(1)
            started = asyncio.get_running_loop().time()
            await client.step("updated", OUT_OF_BAND_WITHIN_S + 5.0)
            record_latency(f"{upstream} mcp1 out-of-band", asyncio.get_running_loop().time() - started)
            after = text_of(await client.step("reread"))
            await client.finish()
    if expected is None:  # the resource changes by itself: the re-read must not be what was read before
        assert after != before
    else:
        assert after == expected


@pytest.mark.parametrize("upstream", TOOL_CHANGEABLE)
async def test_the_1x_client_hears_its_own_tool_change_long_before_the_next_poll(upstream: str, tmp_path: Path) -> None:
    async with (
        open_upstream(upstream, tmp_path, read_ttl_ms=SLOW_POLL_MS) as up,
        serve_sidecar(up.url, polling=SLOW_POLLING) as sidecar,
    ):
        change = up.change_by_tool(2)
        assert change is not None, f"{upstream} is listed in TOOL_CHANGEABLE"
        tool, arguments, expected = change
        args = ["--subscribe", up.watched_uri, "--trigger", tool, json.dumps(arguments)]
        async with Mcp1Client.run(sidecar.url, tmp_path, *args, "--wait-updated", str(TOOL_CHANGE_WITHIN_S)) as client:
            # The script times the wait itself, from the start of its tools/call (TOOL_CHANGE_WITHIN_S at most).
            updated = await client.step("updated")
            record_latency(f"{upstream} mcp1 via tool", updated["after_s"])
            assert text_of(await client.step("reread")) == expected
            await client.finish()
