"""Replicas on Redis (one, or a Redis Cluster): change events routed by bucket, and one poller per key chosen by
rendezvous hashing.

Coordination costs what changes, not keys x replicas: a heartbeat per replica (one script), interest written
when a replica's first stream on a key arrives and removed with its last, a change recorded and published in
one script. Names and layout: `sidecar.bus.layout`; the owner rule: `sidecar.bus.ownership`. Redis lost: every
replica polls its own keys (degraded) and local streams keep getting changes; coordination resumes when Redis
answers and the bus is heard again.

`RedisBus` is the one thing the app sees. It wires its parts once, here, each owning its state:
the link (`link.py`: client, scripts, batches, coordinated or degraded, and its bucket channels, `channels.py`),
the tracked keys (`keys.py`, written here alone), the fence (`fence.py`: fenced publish, republish, catch-up),
ownership and take-over (`takeover.py`), membership (`membership.py`: heartbeats, dead replicas, leaving), the
interest writer (`interest.py`) and the inbox (`inbox.py`: the bus's messages routed). Here: lifecycle, the
`Bus` and `PollCoordinator` surface, and the buckets the cache holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable

import orjson

from sidecar.bus.connect import REDIS_FAILURES, connect, stop_if_cancelled
from sidecar.bus.fence import Fence
from sidecar.bus.inbox import Inbox
from sidecar.bus.interest import InterestWriter
from sidecar.bus.keys import TrackedKeys
from sidecar.bus.layout import CONTEXT_NAMING_KEY, DEFAULT_BUCKETS, HINTS_CHANNEL, Layout, key_hash
from sidecar.bus.link import Link, RedisUnavailable
from sidecar.bus.machine import (
    BusCommand,
    BusEvent,
    BusMachine,
    CleanUp,
    Forgotten,
    GaveUp,
    Moved,
    RegisterAgain,
    Untracked,
)
from sidecar.bus.membership import DEFAULT_LEASE_MS, Membership
from sidecar.bus.memory import MemoryBus
from sidecar.bus.reach import Reach, Readable
from sidecar.bus.takeover import Takeover
from sidecar.changes import ChangeEvent, ChangeListener, WatchKey, WatchKind, WatchState
from sidecar.observability.metrics import Metrics
from sidecar.tasks import TaskSet

__all__ = ["DEFAULT_LEASE_MS", "RedisBus", "RedisUnavailable"]

logger = logging.getLogger(__name__)


class RedisBus:
    """The Redis bus (Bus protocol), the poll coordinator (PollCoordinator) and event routing for the cache.

    `membership` and `fence` are the classes of those parts (a test passes a subclass to stage a race)."""

    def __init__(
        self,
        url: str,
        *,
        instance: str,
        metrics: Metrics,
        lease_ms: int = DEFAULT_LEASE_MS,
        fallback: bool = False,
        buckets: int = DEFAULT_BUCKETS,
        membership: type[Membership] = Membership,
        fence: type[Fence] = Fence,
        upstream: Readable | None = None,
    ) -> None:
        conn = connect(url)
        layout = Layout(buckets)
        self._link = Link(
            conn,
            layout=layout,
            instance=instance,
            metrics=metrics,
            fallback=fallback,
            message=self._read,
            connected=self._hints_heard,
            confirmed=self._heard_again,
        )
        self._channels = self._link.channels
        self._tasks = TaskSet("a redis coordination task failed", logger)
        """Its loops (the bus reader, the heartbeat, the interest writer) and one-off tasks (resyncs, take-overs,
        clean-ups of dead replicas): closing cancels them all, and the handover follows whatever they ended with."""
        self._keys = TrackedKeys(layout)
        self._local = MemoryBus()
        self._machine = BusMachine(instance)
        """The bus's rules (membership, ownership, interest routing, the fence's generations): the parts make the
        Redis calls and feed it what they read (`_decide`)."""
        decide = self._decide
        self._fence = fence(self._link, self._keys, self._local, metrics, self._machine, decide)
        self._takeover = Takeover(self._link, self._keys, self._fence, self._tasks, metrics, self._machine, decide)
        self._writer = InterestWriter(self._link, self._channels, self._keys, self._fence, self._machine, decide)
        self._reach = Reach(
            self._link, self._machine, decide, self._tasks, metrics, upstream=upstream, lease_ms=lease_ms
        )
        self._membership = membership(self._link, self._tasks, decide, lease_ms=lease_ms)
        self._inbox = Inbox(instance, self._keys, decide, self._local, metrics, self._reach)
        self._cache_holds: dict[int, float] = {}
        """Bucket -> until when (monotonic) the cache holds an entry of it, so keeps hearing its changes."""

    @property
    def instance(self) -> str:
        return self._link.instance

    @property
    def degraded(self) -> str | None:
        """Why coordination is off (Redis unreachable), or None while it works."""
        return self._link.degraded

    @property
    def moved(self) -> str | None:
        """Why this replica's clients belong on another replica (it cannot read the upstream and one can), or None."""
        return self._reach.moved

    def on_moved(self, listener: Callable[[bool], None]) -> None:
        """`listener(True)` when this replica's clients should listen again elsewhere, `listener(False)` when not."""
        self._reach.on_moved(listener)

    @property
    def owned_count(self) -> int:
        """The keys this replica polls for the cluster (`mcp_sidecar_leases_held`)."""
        return self._machine.owned_count

    @property
    def live_replicas(self) -> int:
        """The live replicas this one knows of, itself included (their shares of the fleet's read budget)."""
        return len(self._machine.live)

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> bytes:
        """Connect and return the shared key that names contexts; raises RedisUnavailable unless falling back."""
        shared = None
        try:
            await self._link.initialize()
            await self._link.client.set(CONTEXT_NAMING_KEY, secrets.token_hex(32), nx=True)
            shared = await self._link.client.get(CONTEXT_NAMING_KEY)
            await self._membership.join()
        except REDIS_FAILURES as exc:
            self._link.unreachable_at_start(exc)
        self._tasks.spawn(self._channels.run())
        self._tasks.spawn(self._heartbeat_loop())
        self._tasks.spawn(self._writer.run())
        if shared is None:
            return secrets.token_bytes(32)
        return shared.encode() if isinstance(shared, str) else bytes(shared)

    async def aclose(self) -> None:
        """Hand over first: our interest leaves Redis and the others hear it (and that we left), so each key we
        polled gets its next owner now rather than when our heartbeat runs out."""
        await self._tasks.aclose()
        try:
            if self._link.degraded is None:
                with contextlib.suppress(*REDIS_FAILURES):
                    await self._writer.remove_all()
                    await self._membership.leave()
        finally:
            self._takeover.closed()
            await self._channels.aclose()
            await self._link.aclose()

    async def _heartbeat_loop(self) -> None:
        while True:
            stop_if_cancelled()
            await asyncio.sleep(self._membership.beat_every_s)
            try:
                await self._membership.beat()
                self._link.set_up(True)
                await self._reach.beat()
                if self._fence.behind and self._link.degraded is None:
                    await self._fence.publish_again()
                await self._link.follow_slots()
            except REDIS_FAILURES as exc:
                stop_if_cancelled()
                self._link.failed(exc)
            self._sweep_cache_holds()

    def _decide(self, event: BusEvent) -> list[BusCommand]:
        """`event` fed to the bus's machine; what follows for the bus as a whole is carried out here (ownership
        moved, a dead replica's clean-up, registering again), the rest (a key's, which its caller holds) handed
        back."""
        rest: list[BusCommand] = []
        for command in self._machine.handle(event, time.time()):
            match command:
                case Moved(gained, lost):
                    self._takeover.moved(gained, lost)
                case GaveUp():
                    self._takeover.gave_up()
                case CleanUp(instance):
                    self._membership.clean_up_soon(instance)
                case Forgotten(instance):
                    self._reach.forget(instance)
                case RegisterAgain():
                    # Taken for dead while we were only slow, and cleaned up: our interest is written again.
                    logger.warning(
                        "this replica was taken for dead (heartbeats too late); registering its interest again"
                    )
                    self._writer.write_all()
                    self._reach.rewrite()
                case _:
                    rest.append(command)
        return rest

    # -- what the bus reader hears ---------------------------------------------------------------------------

    def _hints_heard(self) -> None:
        """The revalidate channel is (re)subscribed: declarations told while it was not are read afresh."""
        self._link.set_up(True)
        self._tasks.spawn(self._reach.reload())

    def _read(self, channel: bytes, data: bytes) -> None:
        self._inbox.read(channel, data)

    def _heard_again(self, bucket: int) -> None:
        """A bucket's subscription is (re)confirmed: after a reconnection or a slot migration, a change published
        while it was not may have been missed; its keys' stored states say."""
        keys = [key for key in self._keys.in_bucket(bucket) if self._writer.written(key)]
        if keys:
            self._tasks.spawn(self._fence.resync(keys))

    # -- Bus -------------------------------------------------------------------------------------------------

    async def publish(self, event: ChangeEvent) -> None:
        await self._fence.publish(event)

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        return self._local.subscribe(listener)

    async def announce_revalidate(self, contexts: frozenset[str]) -> None:
        with contextlib.suppress(*REDIS_FAILURES):
            message = orjson.dumps({"o": self._link.instance, "c": sorted(contexts)})
            await self._link.client.publish(HINTS_CHANNEL, message)

    def on_revalidate(self, listener: Callable[[frozenset[str]], None]) -> None:
        self._inbox.on_revalidate(listener)

    def on_adopt(self, listener: ChangeListener) -> Callable[[], None]:
        return self._fence.on_adopt(listener)

    # -- PollCoordinator -------------------------------------------------------------------------------------

    def may_poll(self, key: WatchKey) -> bool:
        return self._link.degraded is not None or self._machine.owns(key_hash(key))

    def track(self, watch: WatchState) -> None:
        if not self._keys.add(watch):
            return
        self._channels.hold(self._link.layout.bucket_of(watch.key))
        self._writer.join(watch.key)

    def untrack(self, key: WatchKey) -> None:
        if not self._keys.remove(key):
            return
        self._writer.leave(key)
        self._fence.forget(key)
        self._decide(Untracked(key))
        self._channels.release(self._link.layout.bucket_of(key))

    # -- the cache's buckets ---------------------------------------------------------------------------------

    def hold(self, kind: WatchKind, uri: str | None, since: float, until: float) -> bool:
        """The cache keeps an entry of (kind, uri) until `until` (monotonic): keep hearing its bucket till then.
        True when the bucket was heard since before `since` (when the entry's request started), so a change
        after that request is heard here and drops the entry; False: do not keep it (heard from now on)."""
        bucket = self._link.layout.bucket(kind, uri)
        held = self._cache_holds.get(bucket)
        if held is None:
            self._channels.hold(bucket)
        self._cache_holds[bucket] = max(until, held or until)
        confirmed = self._channels.confirmed_at(bucket)
        return self._link.degraded is None and confirmed is not None and confirmed <= since

    def _sweep_cache_holds(self) -> None:
        now = time.monotonic()
        for bucket, until in list(self._cache_holds.items()):
            if until < now:
                del self._cache_holds[bucket]
                self._channels.release(bucket)
