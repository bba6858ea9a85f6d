"""The SDK 2.3 client through the sidecar, in front of each upstream, in both modes.

In its default mode the client must reach 2026-07-28 through the sidecar whatever the upstream speaks, and
listen; in `legacy` mode it runs the 2025-11-25 handshake and subscribes. Either way it must see what it sees
talking to the upstream directly, hear an out-of-band change within one poll interval, and hear a change made
by its own tools/call while the sidecar polls only every 10 minutes (so only revalidate-on-write can
deliver it; server-everything has no tool that changes a resource, see `TOOL_CHANGEABLE`). Each notification's
latency is recorded (`tests/compat/conftest.py` prints them).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sidecar.app import METRICS
from tests.compat.clients import SdkMode, sdk_client, surface, text_of, watching
from tests.compat.upstreams import (
    OUT_OF_BAND_POLLING,
    OUT_OF_BAND_WITHIN_S,
    POLL_INTERVAL_MS,
    SLOW_POLL_MS,
    SLOW_POLLING,
    TOOL_CHANGE_WITHIN_S,
    TOOL_CHANGEABLE,
    UPSTREAMS,
    open_upstream,
    record_latency,
)
from tests.kit import eventually, serve_sidecar

pytestmark = pytest.mark.timeout(120)

MODES: list[SdkMode] = ["2026", "legacy"]
NEGOTIATED = {"2026": "2026-07-28", "legacy": "2025-11-25"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_the_sdk_client_negotiates_and_sees_what_it_sees_directly(
    upstream: str, mode: SdkMode, tmp_path: Path
) -> None:
    async with open_upstream(upstream, tmp_path) as up:
        async with sdk_client(up.url, "legacy") as direct:
            expected = await surface(direct, up)
        async with serve_sidecar(up.url) as sidecar, sdk_client(sidecar.url, mode) as client:
            assert client.protocol_version == NEGOTIATED[mode]
            seen = await surface(client, up)
    for exchange, result in expected.items():
        assert seen[exchange] == result, f"{exchange} through the sidecar differs from direct"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_the_sdk_client_hears_an_out_of_band_change_within_one_poll_interval(
    upstream: str, mode: SdkMode, tmp_path: Path
) -> None:
    async with (
        open_upstream(upstream, tmp_path, read_ttl_ms=POLL_INTERVAL_MS) as up,
        serve_sidecar(up.url, polling=OUT_OF_BAND_POLLING) as sidecar,
    ):
        async with sdk_client(sidecar.url, mode) as reader:
            before = await text_of(reader, up.watched_uri)
        async with watching(sidecar.url, mode, up.watched_uri) as watch:
            assert watch.client.protocol_version == NEGOTIATED[mode]
            expected = await up.change_out_of_band(1)
            started = asyncio.get_running_loop().time()
            await watch.updated(OUT_OF_BAND_WITHIN_S)
            record_latency(f"{upstream} sdk-{mode} out-of-band", asyncio.get_running_loop().time() - started)
            after = await text_of(watch.client, up.watched_uri)
    if expected is None:  # the resource changes by itself: the re-read must not be what was read before
        assert after != before
    else:
        assert after == expected


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("upstream", TOOL_CHANGEABLE)
async def test_the_sdk_client_hears_its_own_tool_change_long_before_the_next_poll(
    upstream: str, mode: SdkMode, tmp_path: Path
) -> None:
    async with (
        open_upstream(upstream, tmp_path, read_ttl_ms=SLOW_POLL_MS) as up,
        serve_sidecar(up.url, polling=SLOW_POLLING) as sidecar,
        watching(sidecar.url, mode, up.watched_uri) as watch,
    ):
        change = up.change_by_tool(2)
        assert change is not None, f"{upstream} is listed in TOOL_CHANGEABLE"
        tool, arguments, expected = change
        await watch.client.list_tools()  # the SDK lists tools before a tool's first call: not part of the timing
        started = asyncio.get_running_loop().time()
        await watch.client.call_tool(tool, arguments)
        await watch.updated(TOOL_CHANGE_WITHIN_S)
        record_latency(f"{upstream} sdk-{mode} via tool", asyncio.get_running_loop().time() - started)
        assert await text_of(watch.client, up.watched_uri) == expected


@pytest.mark.invariant(19)
@pytest.mark.parametrize("mode", MODES)
async def test_the_reference_servers_own_updates_make_the_sidecar_look_at_once(mode: SdkMode, tmp_path: Path) -> None:
    # It declares resources.subscribe: the sidecar subscribes on its own session and listens on that session's
    # GET stream. Once told to (toggle-subscriber-updates, a tool call through the sidecar on the same session)
    # it announces an update at once and then every 5 s; each is a hint, read at once, 60 s before the sidecar
    # would poll. Its clock resource reads the time to the second, so once the second of the sidecar's baseline
    # has passed, that read finds a change and the client is told.
    slow = {"default_interval_ms": 60_000, "max_interval_ms": 120_000, "min_interval_ms": 50}
    async with (
        open_upstream("server-everything", tmp_path) as up,
        serve_sidecar(up.url, polling=slow) as sidecar,
        watching(sidecar.url, mode, up.watched_uri) as watch,
        sdk_client(sidecar.url, "2026") as trigger,
        sdk_client(up.url, "legacy") as direct,
    ):
        metrics = sidecar.app[METRICS]
        await eventually(lambda: metrics.native_watches._value.get() >= 1)
        # Read after the ack, so no older than the baseline: once the upstream's text moves on from this, the
        # announcement's read differs from the baseline (else the first announcement can find nothing new, and
        # the figure would be the server's 5 s cadence, not the sidecar's reaction).
        seen = await text_of(direct, up.watched_uri)

        async def moved_on() -> bool:
            return await text_of(direct, up.watched_uri) != seen

        await eventually(moved_on, step=0.1)
        started = asyncio.get_running_loop().time()
        await trigger.call_tool("toggle-subscriber-updates", {})
        await watch.updated(OUT_OF_BAND_WITHIN_S)
        record_latency(f"server-everything sdk-{mode} native update", asyncio.get_running_loop().time() - started)
        assert metrics.upstream_notifications.labels("notifications/resources/updated")._value.get() >= 1
