"""The bus reader: one pub/sub connection, subscribed to the hints channel and to the buckets this replica
wants, each wanted bucket counted by its holders (tracked keys, cache entries). A subscription is confirmed
before anything that depends on hearing the bucket is done (see `heard`); a lost connection is reopened with
backoff and every wanted bucket subscribed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar.backoff import Backoff
from sidecar.bus.connect import REDIS_FAILURES
from sidecar.bus.layout import HINTS_CHANNEL, Layout
from sidecar.tasks import TaskSet

__all__ = ["ChannelHooks", "Channels"]

logger = logging.getLogger(__name__)

_RECONNECT = Backoff(0.2, 5.0)
_POLL_S = 1.0
_SHARD_POLL_S = 0.02
_REOPEN_EVERY_S = 1.0


@dataclass(frozen=True)
class ChannelHooks:
    """What the reader tells its owner; each is synchronous and must not raise."""

    message: Callable[[bytes, bytes], None]
    """(channel, data) of a message read."""
    connected: Callable[[], None]
    """The hints channel is subscribed: the bus is heard again."""
    confirmed: Callable[[int], None]
    """A held bucket's subscription is confirmed (on this connection)."""
    lost: Callable[[Exception], None]
    """The connection failed, with the reason."""


class Channels:
    """Bucket subscriptions by reference count, on plain pub/sub or (Redis Cluster) sharded pub/sub."""

    def __init__(
        self,
        pubsub_factory: Callable[[], Any],
        layout: Layout,
        *,
        sharded: bool,
        hooks: ChannelHooks,
    ) -> None:
        self._factory = pubsub_factory
        self._layout = layout
        self._sharded = sharded
        self._hooks = hooks
        self._holds: dict[int, int] = {}
        self._confirmed: dict[int, float] = {}
        """Bucket -> monotonic time its subscription was confirmed on the current connection."""
        self._waiters: dict[int, asyncio.Event] = {}
        self._pubsub: Any = None
        self._open = False
        """The connection takes subscriptions (its first subscribe was sent)."""
        self.connected = False
        """Subscribed and reading: the bus is heard."""
        self._retry_now = asyncio.Event()
        self._commands = TaskSet("a bucket (un)subscription failed", logger)
        """(Un)subscribe commands in flight: held, so none is collected while pending and each failure is
        logged; cancelled on close."""
        self._reopen = False
        self._reopened_at = -_REOPEN_EVERY_S

    # -- holders ---------------------------------------------------------------------------------------

    def hold(self, bucket: int) -> None:
        count = self._holds.get(bucket, 0)
        self._holds[bucket] = count + 1
        if count == 0:
            self._send(bucket, subscribe=True)

    def release(self, bucket: int) -> None:
        count = self._holds.get(bucket, 0) - 1
        if count > 0:
            self._holds[bucket] = count
            return
        self._holds.pop(bucket, None)
        self._confirmed.pop(bucket, None)
        self._send(bucket, subscribe=False)

    def wanted(self) -> frozenset[int]:
        return frozenset(self._holds)

    def confirmed_at(self, bucket: int) -> float | None:
        return self._confirmed.get(bucket)

    async def heard(self, bucket: int, within_s: float) -> bool:
        """Wait (bounded) until the bucket's subscription is confirmed: only then is every message published on
        it from now on read here. False when it is not (Redis unreachable)."""
        if bucket in self._confirmed:
            return True
        event = self._waiters.setdefault(bucket, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                await event.wait()
        return bucket in self._confirmed

    def reopen(self) -> bool:
        """Close the connection and subscribe everything again at once (at most once a second); False when it
        was not (too soon, or not connected: it subscribes everything when it connects anyway)."""
        now = time.monotonic()
        if now - self._reopened_at < _REOPEN_EVERY_S or not self._open:
            return False
        self._reopened_at = now
        self._reopen = True
        self._retry_now.set()
        return True

    def retry_now(self) -> None:
        """Redis answers again: reconnect without waiting out the backoff."""
        self._retry_now.set()

    def _send(self, bucket: int, *, subscribe: bool) -> None:
        pubsub = self._pubsub
        if pubsub is None or not self._open:
            return  # subscribed with the others on (re)connection
        channel = self._layout.channel(bucket)
        if self._sharded:
            command = pubsub.ssubscribe if subscribe else pubsub.sunsubscribe
        else:
            command = pubsub.subscribe if subscribe else pubsub.unsubscribe
        self._commands.spawn(self._run(command(channel)))

    async def _run(self, command: Any) -> None:
        with contextlib.suppress(*REDIS_FAILURES):  # the read loop sees the connection fail and reopens it
            await command

    async def aclose(self) -> None:
        """Cancel the commands still in flight (the read loop is its caller's to cancel)."""
        await self._commands.aclose()

    # -- the read loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        failures = 0
        while True:
            pubsub = self._factory()
            self._pubsub = pubsub
            try:
                await pubsub.subscribe(HINTS_CHANNEL)
                # Open before the list is taken: a bucket held from now on is subscribed on its own (twice at
                # worst, which Redis takes as once), never left out.
                self._open = True
                buckets = [self._layout.channel(bucket) for bucket in self._holds]
                if buckets:
                    await (pubsub.ssubscribe if self._sharded else pubsub.subscribe)(*buckets)
                self.connected = True
                failures = 0
                while not self._reopen:
                    if self._sharded:
                        # Shard channels are read from one connection per node, in turn; the hints channel
                        # (plain pub/sub, which a cluster broadcasts) from another.
                        try:
                            message = await pubsub.get_sharded_message(timeout=_SHARD_POLL_S)
                        except RuntimeError:  # a node's connection is still being opened by a subscribe
                            message = None
                            await asyncio.sleep(_SHARD_POLL_S)
                        if message is not None:
                            self._read(message)
                        message = await pubsub.get_message(timeout=0 if message is not None else _SHARD_POLL_S)
                    else:
                        message = await pubsub.get_message(timeout=_POLL_S)
                    if message is not None:
                        self._read(message)
            except REDIS_FAILURES as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the client turned our cancellation into a connection error: stop, do not retry
                self._hooks.lost(exc)
            finally:
                self.connected = self._open = False
                self._pubsub = None
                self._confirmed.clear()
                with contextlib.suppress(*REDIS_FAILURES):
                    await pubsub.aclose()
            if self._reopen:
                self._reopen = False
                continue  # asked to subscribe afresh: at once
            failures += 1
            self._retry_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), _RECONNECT.delay(failures))

    def _read(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = message.get("channel", b"")
        if kind in ("message", "smessage"):
            self._hooks.message(channel, message["data"])
            return
        if kind == "subscribe" and channel in (HINTS_CHANNEL, HINTS_CHANNEL.encode()):
            self._hooks.connected()
            return
        bucket = self._layout.bucket_of_channel(channel)
        if bucket is None:
            return
        if kind in ("unsubscribe", "sunsubscribe"):
            self._confirmed.pop(bucket, None)  # held again meanwhile: heard once its new subscription is confirmed
        elif kind in ("subscribe", "ssubscribe") and bucket in self._holds:
            self._confirmed[bucket] = time.monotonic()
            self._hooks.confirmed(bucket)
            waiter = self._waiters.pop(bucket, None)
            if waiter is not None:
                waiter.set()
