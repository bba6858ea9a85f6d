"""The link to Redis: the client, the registered scripts, batches, and the switch between coordinated and
degraded (Redis unreachable: every replica polls its own keys), told to its listeners as Redis is lost and found.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.bus.channels import ChannelHooks, Channels
from sidecar.bus.connect import SLOTS_MOVING, TIMEOUTS, Op, RedisClient
from sidecar.bus.layout import Layout
from sidecar.bus.scripts import Scripts
from sidecar.observability.metrics import Metrics

__all__ = ["Link", "RedisUnavailable"]

logger = logging.getLogger(__name__)


class RedisUnavailable(Exception):
    """Redis could not be reached at start."""


class Link:
    """One replica's connection to the cluster's Redis, named `instance` among the replicas, in `layout`, with its
    bucket channels (`channels`: their reader tells `message`, `connected` and `confirmed` to the bus, and a lost
    connection to the link itself)."""

    def __init__(
        self,
        conn: RedisClient,
        *,
        layout: Layout,
        instance: str,
        metrics: Metrics,
        fallback: bool,
        message: Callable[[bytes, bytes], None],
        connected: Callable[[], None],
        confirmed: Callable[[int], None],
    ) -> None:
        self._conn = conn
        self._channels = self.channels = Channels(
            conn.pubsub,
            layout,
            sharded=conn.sharded,
            hooks=ChannelHooks(message=message, connected=connected, confirmed=confirmed, lost=self.lost),
        )
        self._metrics = metrics
        self._fallback = fallback
        self._listeners: list[Callable[[bool], None]] = []
        self._slots: tuple[tuple[int, int, str], ...] | None = None
        """The cluster's slot map as of the last (re)subscription (Redis Cluster only)."""
        self._layout = layout
        self._instance = instance
        self._scripts = Scripts.register(conn.client)
        self._degraded: str | None = None
        self._answering = True
        """False once a command timed out (nothing answers: a partition), until coordination resumes. A refused or
        reset connection, or a cluster's redirect while slots move, is an answer: Redis (or the node that failed)
        says so at once, and asking it again costs nothing."""

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def instance(self) -> str:
        """The member's name among the replicas: unique per process (INSTANCE_ID), so per cluster member."""
        return self._instance

    @property
    def scripts(self) -> Scripts:
        return self._scripts

    @property
    def degraded(self) -> str | None:
        """Why coordination is off (Redis unreachable), or None while it works."""
        return self._degraded

    @property
    def answering(self) -> bool:
        """Redis answers commands, at once if with an error: False after a command timed out."""
        return self._answering

    @property
    def client(self) -> Any:
        return self._conn.client

    def publish_args(self, message: bytes) -> tuple[str, bytes]:
        """The publish command of this Redis (sharded on a cluster) and the message, as a script's arguments."""
        return ("SPUBLISH" if self._conn.sharded else "PUBLISH"), message

    async def batch(self, ops: Sequence[Op]) -> list[Any]:
        return await self._conn.batch(ops)

    def on_switch(self, listener: Callable[[bool], None]) -> None:
        """`listener(True)` when coordination resumes, `listener(False)` when it stops; in registration order."""
        self._listeners.append(listener)

    async def initialize(self) -> None:
        await self._conn.initialize()

    def unreachable_at_start(self, exc: Exception) -> None:
        """Raises RedisUnavailable, unless falling back to local polling (then degraded from the start)."""
        if not self._fallback:
            raise RedisUnavailable(f"cannot reach Redis at bus.redis_url: {exc}") from exc
        self._heard_of(exc)
        self.set_up(False, f"redis unreachable at start: {exc}")

    def failed(self, exc: Exception) -> None:
        if isinstance(exc, SLOTS_MOVING):
            # Slots moved: a shard subscription may still be on a node that no longer owns its slot (a change
            # published meanwhile would not reach us). Subscribing afresh, on the owners, and resyncing each
            # confirmed bucket's keys from their stored states closes that gap.
            self._channels.reopen()
        self.lost(exc)

    def lost(self, exc: Exception) -> None:
        """A command or the bus reader's connection failed: coordination stops until the bus is heard again."""
        self._heard_of(exc)
        self.set_up(False, str(exc))

    def _heard_of(self, exc: Exception) -> None:
        if isinstance(exc, TIMEOUTS):
            self._answering = False

    def set_up(self, up: bool, reason: str | None = None) -> None:
        self._metrics.redis_up.set(1 if up else 0)
        if up and not self._channels.connected:
            # Coordination resumes only once we hear the bus again: an owner's change published before we
            # resubscribe would reach nobody here, and we would no longer be polling for ourselves.
            self._channels.retry_now()
            return
        if up and self._degraded is not None:
            logger.info("redis reachable again; coordinated polling resumes")
            self._degraded = None
            self._answering = True
            for listener in self._listeners:
                listener(True)
        elif not up and self._degraded is None:
            logger.warning("redis unreachable; polling locally until it returns", extra={"reason": reason})
            self._degraded = reason or "redis unreachable"
            for listener in self._listeners:
                listener(False)

    async def follow_slots(self) -> None:
        """Redis Cluster: a shard subscription stays on the node it was made on, and Redis 7.0 does not tell its
        subscribers when the slot moves (a migration, a failover); messages published on the slot's new owner
        would never reach them. So each heartbeat also reads the slot map (one command): when it changed, every
        bucket is subscribed again on its owner, and each (re)confirmed bucket resyncs from its stored states."""
        if not self._conn.sharded:
            return
        slots = await self._conn.topology()
        if self._slots is None:
            self._slots = slots
        elif slots != self._slots:
            await self._conn.refresh()
            if self._channels.reopen():
                self._slots = slots

    async def aclose(self) -> None:
        await self._conn.aclose()
