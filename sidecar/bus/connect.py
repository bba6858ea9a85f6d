"""From `bus.redis_url` to a client, its pub/sub and its pipelines. One Redis today; `sharded` is where a Redis
Cluster client (sharded pub/sub) will say so."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from sidecar.config.redis_url import check_redis_url

__all__ = ["Connection", "connect"]

logger = logging.getLogger(__name__)

_SOCKET_TIMEOUT_S = 2.0


@dataclass
class Connection:
    """A client, how to open its pub/sub and pipelines, and whether channels are sharded."""

    client: Any
    sharded: bool

    def pubsub(self) -> Any:
        return self.client.pubsub(ignore_subscribe_messages=False)

    def pipeline(self) -> Any:
        return self.client.pipeline(transaction=False)

    async def initialize(self) -> None:
        if self.sharded:
            await self.client.initialize()

    async def aclose(self) -> None:
        await self.client.aclose()


def connect(url: str) -> Connection:
    """A client for one Redis (the config has checked the URL)."""
    check_redis_url(url)
    timeouts: dict[str, Any] = {"socket_timeout": _SOCKET_TIMEOUT_S, "socket_connect_timeout": _SOCKET_TIMEOUT_S}
    return Connection(aioredis.from_url(url, **timeouts), sharded=False)
