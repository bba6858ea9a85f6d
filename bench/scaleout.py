"""Scale-out on paper and in simulation: the real ownership, interest and heartbeat code of many replicas, in
one process, against a real redis-server. No upstream and no streams: each replica's watches are stand-ins
that only count the polls they are asked for.

    python -m bench.scaleout --quick              # 10 replicas, 2,000 keys: a smoke run (~20 s)
    python -m bench.scaleout                      # 100 replicas, 100,000 keys, 2 interested replicas per key
    python -m bench.scaleout --keys 1000000 --buckets 65536   # the full size (too long for one process here)

Reports Redis commands/s at rest (from INFO commandstats), commands and bus messages per change, the busiest
replica's share of the polls, and the keys moved when one replica leaves. See docs/scaling.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.services import redis_missing, start_redis
from sidecar.bus.redis import RedisBus
from sidecar.changes import ChangeEvent, WatchKey
from sidecar.observability.metrics import Metrics

LEASE_MS = 5_000
"""The default `bus.lease_ms`: each replica beats every 1.7 s."""
REST_S = 10.0
_CHUNK = 500
_CHUNK_PAUSE_S = 0.25
CHANGES = 200


class _Watch:
    """Stands in for a watch: what the coordinator needs of one (WatchState)."""

    def __init__(self, key: WatchKey) -> None:
        self.key = key
        self.fingerprint = "f0"
        self.hints = 0

    def adopt(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint

    def hint(self) -> None:
        self.hints += 1


async def _commands(client: Any) -> int:
    stats = await client.info("commandstats")
    return sum(int(value["calls"]) for name, value in stats.items() if name != "cmdstat_info")


def _received(metrics: list[Metrics]) -> float:
    name = "mcp_sidecar_bus_messages_received_total"
    return sum(m.registry.get_sample_value(name) or 0.0 for m in metrics)


def _owned(cluster: RedisBus, keys: list[WatchKey]) -> set[WatchKey]:
    return {key for key in keys if cluster.may_poll(key)}


async def _settled(clusters: list[RedisBus], keys: list[WatchKey], within_s: float) -> list[int]:
    """Waits until every key has exactly one owner; returns the keys each replica owns."""
    deadline = time.monotonic() + within_s
    while True:
        held = [cluster.owned_count for cluster in clusters]
        if sum(held) == len(keys) or time.monotonic() > deadline:
            return held
        await asyncio.sleep(0.5)


async def run(replicas: int, keys_count: int, interest: int, buckets: int) -> dict[str, float]:
    rng = random.Random(22)
    async with contextlib.AsyncExitStack() as stack:
        url = await start_redis(stack, Path(tempfile.mkdtemp(prefix="scaleout-")))
        client = aioredis.from_url(url)
        stack.push_async_callback(client.aclose)
        metrics = [Metrics() for _ in range(replicas)]
        clusters = [
            RedisBus(url, instance=f"sim-{n}", metrics=metrics[n], lease_ms=LEASE_MS, buckets=buckets)
            for n in range(replicas)
        ]
        for cluster in clusters:
            await cluster.start()
        # Every replica's first heartbeats are read by all before any interest arrives (a fleet already up).
        await asyncio.sleep(2 * LEASE_MS / 3000)
        keys = [WatchKey("resource", f"sim://item/{n}", "public") for n in range(keys_count)]
        watches: list[dict[WatchKey, _Watch]] = [{} for _ in clusters]
        started = time.monotonic()
        for chunk in range(0, keys_count, _CHUNK):
            for key in keys[chunk : chunk + _CHUNK]:
                for n in rng.sample(range(replicas), interest):
                    watch = watches[n][key] = _Watch(key)
                    clusters[n].track(watch)
            await asyncio.sleep(_CHUNK_PAUSE_S)  # streams arrive over time; the writers batch what came meanwhile
        held = await _settled(clusters, keys, within_s=max(60.0, keys_count * interest / 2000))
        startup_s = time.monotonic() - started
        mean = keys_count / replicas
        print(f"interest written and settled in {startup_s:.1f} s; owners per key ok: {sum(held) == keys_count}")

        before, t0 = await _commands(client), time.monotonic()
        await asyncio.sleep(REST_S)  # the measurement window at rest
        rest = (await _commands(client) - before) / (time.monotonic() - t0)

        received = _received(metrics)
        before = await _commands(client)
        owners = {key: n for n, cluster in enumerate(clusters) for key in _owned(cluster, list(watches[n]))}
        for generation, key in enumerate(rng.sample(keys, CHANGES), start=1):
            await clusters[owners[key]].publish(ChangeEvent(key, f"f{generation}", generation, time.time()))
        per_change = (await _commands(client) - before) / CHANGES
        await asyncio.sleep(1.0)  # the last messages are read
        messages = (_received(metrics) - received) / CHANGES

        leaver = max(range(replicas), key=lambda n: held[n])
        had = {key for key, n in owners.items() if n == leaver}
        await clusters[leaver].aclose()
        rest_clusters = [cluster for n, cluster in enumerate(clusters) if n != leaver]
        left_keys = [key for key in keys if any(key in watches[n] for n in range(replicas) if n != leaver)]
        await _settled(rest_clusters, left_keys, within_s=30.0)
        after = {
            key: n for n, cluster in enumerate(clusters) if n != leaver for key in _owned(cluster, list(watches[n]))
        }
        moved = sum(1 for key, n in after.items() if owners.get(key) != n)
        for n, cluster in enumerate(clusters):
            if n != leaver:
                await cluster.aclose()
        figures = {
            "replicas": replicas,
            "keys": keys_count,
            "interest": interest,
            "buckets": buckets,
            "startup_s": startup_s,
            "busiest_share": max(held) / mean,
            "rest_cmds_s": rest,
            "rest_cmds_key_s": rest / keys_count,
            "cmds_per_change": per_change,
            "messages_per_change": messages,
            "leaver_keys": len(had),
            "moved": moved,
            "moved_fraction": moved / keys_count,
        }
        print(Counter(held).most_common(3))
        return figures


async def _until_signalled(work: Any) -> dict[str, float]:
    # SIGTERM or Ctrl-C unwinds the run, so its redis-server is stopped too.
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    result: dict[str, float] = await task
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--interest", type=int, default=2, help="interested replicas per key")
    parser.add_argument("--buckets", type=int, default=65536, help="bus.buckets (1,024 for --quick)")
    parser.add_argument("--quick", action="store_true", help="10 replicas, 2,000 keys")
    args = parser.parse_args()
    missing = redis_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    replicas, keys, buckets = (10, 2_000, 1024) if args.quick else (args.replicas, args.keys, args.buckets)
    figures = asyncio.run(_until_signalled(run(replicas, keys, args.interest, buckets)))
    for name, value in figures.items():
        print(f"{name:>22}: {value:,.4g}" if isinstance(value, float) else f"{name:>22}: {value:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
