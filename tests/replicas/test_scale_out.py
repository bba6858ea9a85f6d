"""Scale-out that scales (design §4): poll ownership spread by rendezvous hashing over the interested live
replicas, coordination that costs Redis per replica rather than per key, and events only where they are wanted.

Real redis-server, three sidecar processes and the SDK shop upstream: 300 watched item URIs (every one changes
with the price), every replica streaming on every one of them, as behind a load balancer that spreads clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from sidecar.bus.layout import Layout
from sidecar.config.sections import DEFAULT_JITTER
from tests.cluster import (
    FAST_POLLING,
    RedisServer,
    Replica,
    free_port,
    instances_where_first_polls,
    leases_held,
    sidecar_config,
    sidecar_replicas,
)
from tests.kit import UPDATED, ListenStream, eventually, rpc
from tests.peers import Upstream
from tests.procs import START_TIMEOUT_S

KEYS = 300
URIS = [f"catalog://items/{n}" for n in range(KEYS)]
READ_TTL_MS = 1000
"""The poll interval: the upstream's ttlMs."""
SCALE = {
    "polling": {**FAST_POLLING, "default_interval_ms": READ_TTL_MS, "max_baselines_per_s": 10_000},
}
WINDOW_S = 5.0
"""The measurement window for rates at rest (Redis commands, upstream reads)."""
WITHIN_S = 20.0
MAX_SHARE = 1.5
"""Busiest replica's polls over the mean share (the issue's bound; rendezvous gives about 1.1 at 300 keys)."""


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


async def _balanced(replicas: Sequence[Replica]) -> list[int]:
    """Waits until every key has exactly one poller among `replicas` and returns the keys each polls."""
    held: list[int] = []

    async def settled() -> bool:
        nonlocal held
        held = await leases_held(replicas)
        return sum(held) == KEYS

    try:
        await eventually(settled, WITHIN_S, what=f"the {KEYS} keys are polled by exactly one replica each")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; polls per replica: {held}") from None
    return held


async def _commands(redis: RedisServer) -> int:
    """Commands Redis has run, by INFO commandstats (script bodies' commands included), less the INFOs."""
    async with aioredis.Redis(host="127.0.0.1", port=redis.port) as client:
        stats = await client.info("commandstats")
    return sum(int(value["calls"]) for name, value in stats.items() if name != "cmdstat_info")


async def _all_told(streams: Sequence[ListenStream], marks: Sequence[int]) -> None:
    async def everyone() -> bool:
        return all(
            {frame["params"]["uri"] for frame in stream.updates(mark)} >= set(URIS)
            for stream, mark in zip(streams, marks, strict=True)
        )

    await eventually(everyone, WITHIN_S, what="every stream was told of every item's change")


def _told_once(stream: ListenStream, since: int, until: int | None = None) -> None:
    """Each URI told exactly once between the two marks."""
    frames = stream.frames[since:until]
    counts = Counter(frame["params"]["uri"] for frame in frames if frame.get("method") == UPDATED)
    missing = set(URIS) - set(counts)
    twice = {uri: n for uri, n in counts.items() if n > 1}
    assert not missing and not twice, f"{stream.label}: missed {sorted(missing)[:5]}, told twice {twice}"


async def _reads_by_uri(shop: Upstream) -> dict[str, list[float]]:
    """When the upstream had each read of each URI arrive, by its own clock, since its log was last reset."""
    reads: dict[str, list[float]] = {}
    for entry in await shop.log():
        if entry["method"] == "resources/read":
            reads.setdefault(entry["uri"], []).append(entry["at"])
    return reads


async def _open(http: aiohttp.ClientSession, replica: Replica, label: str) -> ListenStream:
    return await ListenStream.connect(http, replica.url, label, URIS, within_s=WITHIN_S)


@pytest.mark.invariant(8)
async def test_three_replicas_share_the_polls_evenly_cost_redis_little_at_rest_and_survive_a_restart(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    async with sidecar_replicas(tmp_path, shop.url, redis.url, 3, **SCALE) as replicas:
        streams = {replica.name: await _open(http, replica, replica.name) for replica in replicas}
        async with contextlib.AsyncExitStack() as stack:
            for stream in streams.values():
                stack.push_async_callback(stream.aclose)
            held = await _balanced(replicas)
            assert max(held) <= MAX_SHARE * KEYS / len(replicas), f"polls per replica: {held}"

            # At rest: Redis hears heartbeats, not per-key renewals; the upstream one read per key per interval.
            await shop.reset_log()
            before, started = await _commands(redis), time.monotonic()
            await asyncio.sleep(WINDOW_S)  # the measurement window itself
            elapsed = time.monotonic() - started
            per_key_s = (await _commands(redis) - before) / KEYS / elapsed
            reads = await _reads_by_uri(shop)
            print(f"\npolls per replica {held}; redis {per_key_s:.3f} commands/key/s")
            assert per_key_s <= 0.5, f"{per_key_s:.3f} Redis commands per watched key per second at rest"
            # Counted by the upstream's own clock, not over the window: however slow the machine, every key was
            # read in it, and no key more than once per (jittered) interval that passed, by whichever replica.
            assert set(reads) == set(URIS), f"keys never read at rest: {sorted(set(URIS) - set(reads))[:5]}"
            shortest_s = READ_TTL_MS / 1000 * (1 - DEFAULT_JITTER)
            crowded = {uri: at for uri, at in reads.items() if len(at) > (at[-1] - at[0]) / shortest_s + 1}
            assert not crowded, f"read more than once an interval: {dict(list(crowded.items())[:3])}"

            # A change of every key: each stream told of each URI once.
            marks = {name: stream.mark() for name, stream in streams.items()}
            await shop.set_price(101)
            await _all_told(list(streams.values()), list(marks.values()))

            # kill -9 one replica; a change while it is gone reaches the survivors' streams, once each.
            victim, survivors = replicas[2], replicas[:2]
            await victim.service.kill()
            gone = streams.pop(victim.name)
            _told_once(gone, marks.pop(victim.name))
            after_first = {name: stream.mark() for name, stream in streams.items()}
            await shop.set_price(102)
            await _all_told(list(streams.values()), list(after_first.values()))
            await _balanced(survivors)

            # Restarted (a new process, a new instance): the keys spread over three again.
            await victim.start()
            streams[victim.name] = await _open(http, victim, f"{victim.name}-again")
            stack.push_async_callback(streams[victim.name].aclose)

            async def spread_again() -> bool:
                held = await leases_held(replicas)
                return sum(held) == KEYS and min(held) > 0 and max(held) <= MAX_SHARE * KEYS / len(replicas)

            await eventually(spread_again, WITHIN_S, what="the keys spread over the restarted replica too")
            held_after = await leases_held(replicas)
            after_second = {name: stream.mark() for name, stream in streams.items()}
            await shop.set_price(103)
            await _all_told(list(streams.values()), list(after_second.values()))
            print(f"after the restart: polls per replica {held_after}")

            # One more change closes the last window: anything told twice in it has arrived by now.
            closing = {name: stream.mark() for name, stream in streams.items()}
            await shop.set_price(104)
            await _all_told(list(streams.values()), list(closing.values()))
            for name, stream in streams.items():
                if name in marks:  # the survivors' streams, through all three windows
                    _told_once(stream, marks[name], after_first[name])
                    _told_once(stream, after_first[name], after_second[name])
                _told_once(stream, after_second[name], closing[name])


# -- events only where they are wanted ---------------------------------------------------------------------------

PRICE = "catalog://price"


def _quiet_name() -> str:
    """An extra resource (its text never changes) in another bucket than the price."""
    layout = Layout()
    price = layout.bucket("resource", PRICE)
    return next(f"quiet{n}" for n in range(100) if layout.bucket("resource", f"catalog://extra/quiet{n}") != price)


async def _received(replica: Replica) -> float:
    return (await replica.metrics()).total("mcp_sidecar_bus_messages_received_total")


async def test_a_replica_with_no_stream_on_a_key_receives_no_bus_message_for_it(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    name = _quiet_name()
    await shop.add("resource", name)
    quiet_uri = f"catalog://extra/{name}"
    channel = Layout().channel(Layout().bucket("resource", PRICE))
    async with sidecar_replicas(tmp_path, shop.url, redis.url, 3) as (owner, elsewhere, also):
        price_streams = [await ListenStream.connect(http, r.url, r.name, [PRICE]) for r in (owner, also)]
        quiet = await ListenStream.connect(http, elsewhere.url, "quiet", [quiet_uri])
        try:
            # Only the two replicas with price streams listen to its bucket (one that listened to every bucket
            # would make three).
            assert await redis.subscribers(channel) == 2
            quiet_before = await _received(elsewhere)
            listening_before = [await _received(r) for r in (owner, also)]
            marks = [stream.mark() for stream in price_streams]
            await shop.set_price(321)
            for stream, mark in zip(price_streams, marks, strict=True):
                await stream.wait_update(PRICE, WITHIN_S, since=mark)

            # The change went through Redis to the interested replica that did not poll it: it was counted...
            async def counted() -> bool:
                now = [await _received(r) for r in (owner, also)]
                return any(after > before for after, before in zip(now, listening_before, strict=True))

            await eventually(counted, START_TIMEOUT_S, what="a price stream's replica counted the change it received")
            # ...and the replica whose streams are elsewhere received nothing at all.
            assert await _received(elsewhere) == quiet_before
            assert quiet.updates() == []
        finally:
            for stream in (*price_streams, quiet):
                await stream.aclose()


# -- a rolling change of the fleet -------------------------------------------------------------------------------

MAX_AGE_S = 1.0


@pytest.mark.invariant(13)
async def test_a_stream_older_than_max_age_ends_with_the_complete_result_and_its_client_can_listen_again(
    tmp_path: Path, shop: Upstream, http: aiohttp.ClientSession
) -> None:
    config = sidecar_config(shop.url, free_port(), streams={"max_age_s": MAX_AGE_S})
    sidecar = Replica("aging", tmp_path / "aging", config)
    await sidecar.start()
    try:
        loop = asyncio.get_running_loop()
        opened_at = loop.time()
        stream = await ListenStream.connect(http, sidecar.url, "old", [PRICE])
        final = await stream.wait_for(lambda frame: "result" in frame, within_s=MAX_AGE_S * 5)
        lived = loop.time() - opened_at
        assert final["result"]["resultType"] == "complete", final
        assert final["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "old"
        assert MAX_AGE_S * 0.85 <= lived <= MAX_AGE_S * 3, f"ended after {lived:.2f} s"
        ended = (await sidecar.metrics()).total("mcp_sidecar_streams_ended_total", reason="max_age")
        assert ended == 1
        await stream.aclose()
        again = await ListenStream.connect(http, sidecar.url, "new", [PRICE])  # and the client listens again
        # A write through the sidecar: polled at once, well within the new stream's own second of life.
        status, _ = await rpc(http, sidecar.url, "tools/call", {"name": "set_price", "arguments": {"value": 222}})
        assert status == 200
        await again.wait_update(PRICE, MAX_AGE_S * 0.85)
        await again.aclose()
    finally:
        assert await sidecar.service.stop() == 0, sidecar.service.log_tail()


HANDOFF_LEASE_MS = 6_000
"""Long heartbeats: a replica that left without handing over would keep its keys unpolled this long."""


async def test_a_replica_stopped_with_sigterm_hands_its_keys_over_at_once(
    tmp_path: Path, shop: Upstream, redis: RedisServer, http: aiohttp.ClientSession
) -> None:
    leaving, staying = instances_where_first_polls(PRICE, 2)
    async with sidecar_replicas(
        tmp_path, shop.url, redis.url, 2, instances=[leaving, staying], bus={"lease_ms": HANDOFF_LEASE_MS}
    ) as (first, second):
        streams = [await ListenStream.connect(http, replica.url, replica.name, [PRICE]) for replica in (first, second)]
        try:

            async def first_polls() -> bool:
                return await leases_held([first, second]) == [1, 0]

            await eventually(first_polls, WITHIN_S, what="the replica named to win the key polls it")
            loop = asyncio.get_running_loop()
            stopped_at = loop.time()
            await first.service.signal(signal.SIGTERM)

            async def second_polls() -> bool:
                return (await leases_held([second])) == [1]

            await eventually(second_polls, HANDOFF_LEASE_MS / 1000 * 2, what="the staying replica polls the key")
            handed_in = loop.time() - stopped_at
            assert handed_in < HANDOFF_LEASE_MS / 1000 / 2, f"taken over {handed_in:.2f} s after SIGTERM"
            assert await first.service.wait() == 0, first.service.log_tail()
            mark = streams[1].mark()
            await shop.set_price(333)
            await streams[1].wait_update(PRICE, WITHIN_S, since=mark)
        finally:
            for stream in streams:
                await stream.aclose()
