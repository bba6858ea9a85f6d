"""From `bus.redis_url` to a client, its pub/sub and batches: one Redis (`redis://`, `rediss://`, `unix://`) or
a Redis Cluster (`redis+cluster://host:port,host:port,...`, seed nodes; `rediss+cluster://` with TLS) with
sharded pub/sub. The redis library's own clients do the work (and, on a cluster, follow failovers and slot
migrations, shard subscriptions included); this picks one and runs batches on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import AskError, ClusterDownError, RedisError, TryAgainError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sidecar.config.redis_url import CLUSTER_SCHEMES, check_redis_url, cluster_seeds, url_scheme

__all__ = ["REDIS_FAILURES", "SLOTS_MOVING", "TIMEOUTS", "Op", "RedisClient", "connect", "stop_if_cancelled"]

logger = logging.getLogger(__name__)

REDIS_FAILURES: tuple[type[Exception], ...] = (RedisError, OSError, RuntimeError, AttributeError)
"""What a Redis command may raise when Redis or a cluster node is unreachable. Besides the client's own errors
and socket errors, the cluster client (redis 8.1) raises RuntimeError (a closed uvloop transport) and
AttributeError (a connection whose writer was dropped) while a node fails over."""
SLOTS_MOVING: tuple[type[Exception], ...] = (AskError, TryAgainError, ClusterDownError)
"""A cluster's slots are moving (a migration, a failover; MovedError is an AskError): shard subscriptions may
lag behind their slots for a moment."""
TIMEOUTS: tuple[type[Exception], ...] = (RedisTimeoutError, TimeoutError)
"""A command nobody answered within the socket timeout: Redis is cut off (a partition), not refusing."""
_SOCKET_TIMEOUT_S = 2.0
_CLUSTER_BATCH = 64
"""Commands in flight at once on a cluster (each goes to its slot's node; the client pools per node)."""


def stop_if_cancelled() -> None:
    """The redis client may turn a cancellation in the middle of a command into a connection error, or absorb it:
    a loop must not go on after its own task was cancelled (shutdown would wait for it for ever)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@dataclass(frozen=True, slots=True)
class Op:
    """One command of a batch: a registered script with its keys and arguments, or a plain command."""

    script: Any
    keys: Sequence[Any] = ()
    args: Sequence[Any] = ()
    command: str = ""


@dataclass
class RedisClient:
    """A client, how to open its pub/sub and run batches, and whether channels are sharded."""

    client: Any
    sharded: bool

    def pubsub(self) -> Any:
        return self.client.pubsub(ignore_subscribe_messages=False)

    async def batch(self, ops: Sequence[Op]) -> list[Any]:
        """Every op's result, in order. One Redis: one pipeline (one round trip). A cluster: each command to its
        node, a few dozen at once (a script in a cluster pipeline is not loaded on its node for us)."""
        if not ops:
            return []
        if not self.sharded:
            async with self.client.pipeline(transaction=False) as pipe:
                for op in ops:
                    if op.script is not None:
                        await op.script(keys=list(op.keys), args=list(op.args), client=pipe)
                    else:
                        getattr(pipe, op.command)(*op.args)
                return list(await pipe.execute())
        results: list[Any] = []
        for start in range(0, len(ops), _CLUSTER_BATCH):
            chunk = ops[start : start + _CLUSTER_BATCH]
            results += await asyncio.gather(*(self._one(op) for op in chunk))
        return results

    async def _one(self, op: Op) -> Any:
        if op.script is not None:
            return await op.script(keys=list(op.keys), args=list(op.args))
        return await getattr(self.client, op.command)(*op.args)

    async def topology(self) -> tuple[tuple[int, int, str], ...]:
        """A cluster's slot ranges and the primary of each (one command, to one node); empty for one Redis."""
        if not self.sharded:
            return ()
        slots = await self.client.cluster_slots()
        return tuple(sorted((int(a), int(b), str(owner["primary"])) for (a, b), owner in slots.items()))

    async def refresh(self) -> None:
        """Learn a cluster's slot map afresh (before subscribing again on the slots' new owners)."""
        if self.sharded:
            await self.client.nodes_manager.initialize()

    async def initialize(self) -> None:
        if self.sharded:
            await self.client.initialize()

    async def aclose(self) -> None:
        await self.client.aclose()


def connect(url: str) -> RedisClient:
    """A client for `url` (the config has checked it; checked again for callers that did not load one)."""
    check_redis_url(url)
    timeouts: dict[str, Any] = {"socket_timeout": _SOCKET_TIMEOUT_S, "socket_connect_timeout": _SOCKET_TIMEOUT_S}
    scheme = url_scheme(url)
    if scheme not in CLUSTER_SCHEMES:
        return RedisClient(aioredis.from_url(url, **timeouts), sharded=False)
    userinfo = url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[0]
    username, _, password = userinfo.partition(":")
    client = AsyncRedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in cluster_seeds(url)],
        username=unquote(username) or None,
        password=unquote(password) or None,
        ssl=scheme == "rediss+cluster",
        **timeouts,
    )
    return RedisClient(client, sharded=True)
