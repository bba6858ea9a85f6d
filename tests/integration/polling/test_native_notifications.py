"""An upstream that can push is listened to: its notifications make the watches poll at once (invariant 19).

The upstream is the SDK 2.3 shop server with `--native`: it serves `subscriptions/listen` itself and
announces every change it makes. The sidecar polls every 60 s here, so only the upstream's own
notification can deliver a change within the test's waits; what clients see is still the sidecar's own
notification, sent only when the content changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from sidecar.app import METRICS, REGISTRY
from tests.kit import UPDATED, ListenStream, eventually, rpc, serve_sidecar
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
SLOW = {"default_interval_ms": 60_000, "max_interval_ms": 120_000, "min_interval_ms": 50, "linger_ms": 100}
PUSH_WAIT_S = 10.0
"""Far below the 60 s poll interval: a notification in time came from the upstream's push."""


@pytest.fixture
async def pushing() -> AsyncIterator[Upstream]:
    async with await start_upstream("modern", read_ttl_ms=0, list_ttl_ms=0, native=True) as up:
        yield up


@pytest.mark.invariant(19)
async def test_an_out_of_band_change_the_upstream_announces_reaches_the_client_at_once(
    pushing: Upstream, http: aiohttp.ClientSession
) -> None:
    async with serve_sidecar(pushing.url, polling=SLOW) as sidecar:
        stream = ListenStream(http, sidecar.url, "l-1", [PRICE], toolsListChanged=True)
        await stream.open()
        try:
            metrics = sidecar.app[METRICS]
            await eventually(lambda: metrics.native_watches._value.get() >= 2)  # the price and the tool list
            async with http.get(f"{sidecar.admin_url}/status") as resp:
                modes = {watch["kind"]: watch["mode"] for watch in (await resp.json())["watches"]}
            assert modes == {"resource": "native", "tools_list": "native"}

            await pushing.set_price(141)  # out of band: no request through the sidecar
            frame = await stream.next(within_s=PUSH_WAIT_S)
            assert frame["method"] == UPDATED and frame["params"]["uri"] == PRICE
            status, message = await rpc(http, sidecar.url, "resources/read", {"uri": PRICE})
            assert status == 200 and message["result"]["contents"][0]["text"] == "price=141"

            await pushing.add("tool", "late_tool")
            frame = await stream.next(within_s=PUSH_WAIT_S)
            assert frame["method"] == "notifications/tools/list_changed"
            assert metrics.upstream_notifications.labels(UPDATED)._value.get() >= 1
        finally:
            await stream.close()


@pytest.mark.invariant(19)
async def test_an_announced_change_that_changed_nothing_is_not_passed_on(
    pushing: Upstream, http: aiohttp.ClientSession
) -> None:
    other = "catalog://items/a1"
    async with serve_sidecar(pushing.url, polling=SLOW) as sidecar:
        # The real change that follows is to the tool list: a price change would change the item's text too
        # (it names the price), so its update could come first without any false alarm.
        stream = ListenStream(http, sidecar.url, "l-2", [other], toolsListChanged=True)
        await stream.open()
        try:
            await eventually(lambda: sidecar.app[METRICS].native_watches._value.get() >= 2)
            await pushing.reset_log()
            await pushing.notify(uri=other)  # nothing changed
            await eventually(lambda: _reads(pushing, other), within_s=PUSH_WAIT_S)  # the hint made it look at once
            await pushing.add("tool", "after_the_false_alarm")  # a real change, after the false alarm
            frame = await stream.next(within_s=PUSH_WAIT_S)
            assert frame["method"] == "notifications/tools/list_changed", frame  # the false alarm never came
        finally:
            await stream.close()


async def _reads(upstream: Upstream, uri: str) -> bool:
    return await upstream.count("resources/read", uri) >= 1


async def test_with_native_notifications_off_the_upstream_is_only_polled(
    pushing: Upstream, http: aiohttp.ClientSession
) -> None:
    polling = {**SLOW, "native_notifications": False}
    async with serve_sidecar(pushing.url, polling=polling) as sidecar:
        stream = ListenStream(http, sidecar.url, "l-3", [PRICE])
        await stream.open()
        try:
            assert sidecar.app[METRICS].native_streams._value.get() == 0
            assert not any(watch.native for watch in sidecar.app[REGISTRY].watches())
        finally:
            await stream.close()
