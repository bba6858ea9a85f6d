"""Polling rules and the read budget against a real SDK upstream that counts the reads it answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from mcp import Client

from sidecar.app import METRICS
from tests.kit import eventually, headers, listen_request, serve_sidecar, sse_messages
from tests.peers import Upstream, start_upstream

FAST = {"min_interval_ms": 100, "default_interval_ms": 300, "linger_ms": 100}
STAMPED, RAW = "catalog://stamped/report", "catalog://stamped/raw"


async def _open(http: aiohttp.ClientSession, url: str, uris: list[str]) -> Any:
    body = listen_request(uris, "budget")
    return await http.post(
        url, json=body, headers=headers("subscriptions/listen"), timeout=aiohttp.ClientTimeout(total=None)
    )


async def test_a_volatile_resource_with_a_rule_is_quiet_while_its_real_change_is_notified(
    http: aiohttp.ClientSession,
) -> None:
    rule = {"match": STAMPED, "ignore": {"json_pointers": ["/generatedAt"]}}
    async with (
        await start_upstream("modern", read_ttl_ms=300) as up,
        serve_sidecar(up.url, polling={**FAST, "rules": [rule]}) as sidecar,
    ):
        polls = sidecar.app[METRICS].polls.labels("resource", "ok")
        async with await _open(http, sidecar.url, [STAMPED]) as quiet, await _open(http, sidecar.url, [RAW]) as noisy:
            quiet_frames, noisy_frames = sse_messages(quiet), sse_messages(noisy)
            await anext(quiet_frames)
            await anext(noisy_frames)
            # Without the rule the stamp is a change: the other URI's stream is told of it.
            noise = await asyncio.wait_for(anext(noisy_frames), 15)
            assert noise["params"]["uri"] == RAW
            seen = polls._value.get()
            await eventually(lambda: polls._value.get() >= seen + 8)  # several polls, each with a new stamp
            await up.set_price(130)
            update = await asyncio.wait_for(anext(quiet_frames), 15)  # the first frame after the ack
            assert update["method"] == "notifications/resources/updated"
            assert update["params"]["uri"] == STAMPED
        async with Client(sidecar.url, cache=None) as client:
            text = (await client.read_resource(STAMPED)).contents[0].text  # type: ignore[union-attr]
        assert '"generatedAt"' in text, "the client still reads the whole content"


@pytest.mark.invariant(21)
async def test_three_hundred_watches_stay_within_sixty_reads_a_second_counted_by_the_upstream(
    http: aiohttp.ClientSession,
) -> None:
    uris = [f"catalog://items/{n}" for n in range(300)]
    polling = {
        "min_interval_ms": 200,
        "max_interval_ms": 10_000,
        "max_reads_per_s": 60,
        "max_baselines_per_s": 1_000,
    }
    async with (
        await start_upstream("modern", read_ttl_ms=200) as up,
        serve_sidecar(up.url, polling=polling) as sidecar,
    ):
        async with await _open(http, sidecar.url, uris) as resp:
            frames = sse_messages(resp)
            await anext(frames)  # the ack: every first read is done
            started = time.monotonic()  # before the reset: every read counted arrived after it
            await up.reset_log()
            # The polls go on past the first reads (a count waited for, not a rate over wall time: how much of the
            # budget is spent is the engine's rule, pinned on its own clock in tests/unit/watch/test_read_budget.py).
            await eventually(_reads_at_least(up, 120), step=0.2, what="120 polls of the upstream")
            reads = await up.count("resources/read")
            elapsed = time.monotonic() - started
        # The rule, not a figure: reads over the time they were counted in (the wanted schedule is 1,500 a second).
        assert reads <= 60 * elapsed + 2, (reads, elapsed)


def _reads_at_least(up: Upstream, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await up.count("resources/read") >= count

    return check
