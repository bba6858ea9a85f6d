"""Invariants 4, 14, 21 and 22 on the replica path: what one replica hears over Redis from another, and the budget
they share.

A change heard from another replica reaches only the streams that asked for its key: a private change only its own
context's streams, on every replica (4). A change made while the upstream was down is told on every replica once
it answers again, the streams on both kept open meanwhile (14). The read budget is the fleet's: two replicas
polling keys of their own stay within it together, counted by the upstream (21). A source hint given to one
replica is announced over Redis, and the replica polling the hinted watch looks; only a look that sees different
content notifies anyone (22). Their one-process twins are in tests/integration:
invariants/test_invariant_paths_sessions.py, listen/test_listen.py, polling/test_read_budget.py and
invariants/test_invariant_paths_hints.py.

Real redis-server, two `mcp-sidecar run` processes, the SDK shop upstream (which counts the reads it answers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from sidecar.bus.layout import REPLICAS
from tests.cluster import RedisServer, Replica, sidecar_replicas
from tests.kit import ListenStream, Streams, eventually
from tests.kit.polling import FAST
from tests.peers import Upstream, start_upstream

PRICE = "catalog://price"
PROFILE = "catalog://profile"
STATIC = "catalog://extra/static"
"""Never changes."""
TOKEN = "s3cret-hint-token"
TEN_MINUTES = {"default_interval_ms": 600_000, "max_interval_ms": 600_000, "min_interval_ms": 10, "linger_ms": 100}
"""Only a hint makes a watch look within a test's waits."""


@pytest.fixture
async def shop() -> AsyncIterator[Upstream]:
    """Reads and lists with no ttlMs (polled at the configured default), and a resource that never changes."""
    async with await start_upstream("modern", read_ttl_ms=0, list_ttl_ms=0) as up:
        await up.add("resource", "static")
        yield up


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:
        yield session


@pytest.mark.invariant(4)
async def test_a_private_change_heard_from_another_replica_reaches_only_its_own_contexts_streams(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    # Bob and alice each listen on both replicas: whichever replica polls bob's profile, the other hears its change
    # over Redis, where alice's watch of the same URI (another context) is in the same bucket.
    async with sidecar_replicas(tmp_path, shop.url, redis.url, 2, polling=FAST) as replicas:
        bobs = [
            ListenStream(http, r.url, f"bob-{n}", [PROFILE], authorization="Bearer bob") for n, r in enumerate(replicas)
        ]
        alices = [
            ListenStream(http, r.url, f"alice-{n}", [PROFILE, PRICE], authorization="Bearer alice")
            for n, r in enumerate(replicas)
        ]
        try:
            for stream in (*bobs, *alices):
                await stream.open()
            await shop.bump_profile("bob")
            for bob in bobs:
                assert (await bob.next_update())["params"]["uri"] == PROFILE
            # Had bob's change reached alice on either replica, it would sit before the price's on her stream.
            await shop.set_price(140)
            for alice in alices:
                assert (await alice.next_update())["params"]["uri"] == PRICE
        finally:
            for stream in (*bobs, *alices):
                await stream.close()


async def _hint(http: aiohttp.ClientSession, replica: Replica, body: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with http.post(f"http://127.0.0.1:{replica.admin_port}/hints", json=body, headers=headers) as resp:
        assert resp.status == 202, await resp.text()


async def _looked(shop: Upstream, uri: str, before: int) -> None:
    async def more() -> bool:
        return await shop.count("resources/read", uri) > before

    await eventually(more, what=f"a look at {uri}")


@pytest.mark.invariant(22)
async def test_a_hint_given_to_another_replica_for_an_unchanged_resource_notifies_nobody(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    token_file = tmp_path / "hints-token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    hints = {"token_file": str(token_file)}
    async with sidecar_replicas(tmp_path, shop.url, redis.url, 2, polling=TEN_MINUTES, hints=hints) as replicas:
        watcher, hinted = replicas  # streams on the first only: it polls both keys; the second has no watch
        stream = ListenStream(http, watcher.url, "w", [STATIC, PRICE])
        await stream.open()
        try:
            before = await shop.count("resources/read", STATIC)
            await _hint(http, hinted, {"uris": [STATIC]})  # nothing changed there
            await _looked(shop, STATIC, before)  # the watcher heard it over Redis and looked
            await shop.set_price(170)
            await _hint(http, hinted, {"uris": [PRICE]})
            frame = await stream.next_update()  # a false alarm for the static resource would come first
            assert frame["params"]["uri"] == PRICE
        finally:
            await stream.close()


@pytest.mark.invariant(21)
async def test_two_replicas_polling_keys_of_their_own_share_sixty_reads_a_second_counted_by_the_upstream(
    tmp_path: Path, redis: RedisServer, admin: aioredis.Redis, http: aiohttp.ClientSession
) -> None:
    # Each replica alone is interested in (and so polls) 150 keys that want a read every 200 ms: 1,500 reads a second
    # wanted by the fleet against a budget of 60, which each replica shares with the other live one.
    polling = {"min_interval_ms": 200, "max_interval_ms": 10_000, "max_reads_per_s": 60, "max_baselines_per_s": 1_000}
    async with (
        await start_upstream("modern", read_ttl_ms=200) as up,
        sidecar_replicas(tmp_path, up.url, redis.url, 2, polling=polling) as replicas,
    ):
        streams = Streams(http, [])
        try:
            for n, replica in enumerate(replicas):
                await streams.open(replica.url, f"r{n}", [f"catalog://items/{n}-{k}" for k in range(150)])

            async def both_live() -> bool:
                return await admin.zcard(REPLICAS) == 2

            await eventually(both_live, what="both replicas heartbeat on Redis")
            await up.reset_log()

            async def read_enough() -> bool:
                return await up.count("resources/read") >= 300

            await eventually(read_enough, what="300 polls answered")
            # The later half of them: by then (150 reads at most 60 a second: seconds) each replica has beaten since
            # the other joined, and shares the budget with it. The rule by the upstream's own clock: no span of its
            # reads holds more than the budget allows.
            reads = [entry for entry in await up.log() if entry["method"] == "resources/read"][150:300]
            span_s = reads[-1]["at"] - reads[0]["at"]
            # Slack for each replica's bucket: a few reads of burst on top of the rate (150 reads came in 2.46 s on a
            # loaded machine, one over a slack of 2). The fleet-wide rule broken (each replica spending all 60) gives
            # about 120 a second: 150 reads in 1.24 s against a bound of 84.
            assert len(reads) <= 60 * span_s + 10, (len(reads), span_s)
            shares = [(await replica.metrics()).total("mcp_sidecar_read_budget_per_second") for replica in replicas]
            assert shares == [30.0, 30.0]  # what each reports of its share agrees
        finally:
            await streams.aclose()


@pytest.mark.invariant(14)
async def test_a_change_made_while_the_upstream_was_down_is_told_on_every_replica_once_it_answers_again(
    tmp_path: Path, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    # A minute of backoff after the first failed poll: the change made during the outage reaches the streams within
    # the test only through the recovery (each replica retries the upstream on its own pace, and the lease owner's
    # first answer makes its failing watch look at once), never through the backoff running out.
    backing_off = {**FAST, "backoff_initial_ms": 60_000, "backoff_max_ms": 60_000}
    async with (
        await start_upstream("modern", read_ttl_ms=300) as up,
        sidecar_replicas(tmp_path, up.url, redis.url, 2, polling=backing_off) as replicas,
    ):
        streams = Streams(http, [PRICE])
        try:
            opened = [await streams.open(replica.url, replica.name) for replica in replicas]
            await up.set_price(120)
            for stream in opened:
                await stream.wait_update(PRICE)
            marks = [stream.mark() for stream in opened]
            await up.kill()

            async def failed() -> bool:
                scrapes = [await replica.metrics() for replica in replicas]
                return sum(m.total("mcp_sidecar_polls_total", kind="resource", outcome="error") for m in scrapes) >= 1

            await eventually(failed, what="the owner's poll failed")
            await up.restart()  # price=100 again: a change from 120, made while the upstream was down
            for stream, mark in zip(opened, marks, strict=True):
                await stream.wait_update(PRICE, since=mark)  # on the streams that stayed open
        finally:
            await streams.aclose()
