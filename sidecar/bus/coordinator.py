"""The Redis coordinator's shared state: its connection, scripts and bookkeeping, and how Redis being
lost or found again turns coordination off and on. The jobs are in the modules built on it (`sidecar.bus.redis`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from sidecar.bus import scripts
from sidecar.bus.channels import Channels
from sidecar.bus.connect import REDIS_FAILURES, SLOTS_MOVING, Connection, connect
from sidecar.bus.layout import (
    DEFAULT_BUCKETS,
    Layout,
    key_hash,
)
from sidecar.bus.memory import MemoryBus
from sidecar.bus.ownership import Ownership
from sidecar.changes import ChangeEvent, WatchKey, WatchState
from sidecar.observability.metrics import Metrics

__all__ = ["DEFAULT_LEASE_MS", "STATE_TTL_MS", "Coordinator"]

logger = logging.getLogger(__name__)

STATE_TTL_MS = 24 * 3600 * 1000
"""The last fingerprint told outlives any handoff by far; a key nobody changes for a day starts afresh."""
DEFAULT_LEASE_MS = 5_000
_HEARD_WITHIN_S = 2.0
_RETRY_S = 0.5
_RETRY_MAX_S = 30.0


class _NotHeard(Exception):
    """A bucket's subscription was not confirmed in time: our interest in its keys waits (and is retried)."""


class Coordinator:
    """The state every part of the Redis coordinator works on, and the switch between coordinated and degraded."""

    def __init__(
        self,
        url: str,
        *,
        instance: str,
        metrics: Metrics,
        lease_ms: int = DEFAULT_LEASE_MS,
        fallback: bool = False,
        buckets: int = DEFAULT_BUCKETS,
    ) -> None:
        self._conn: Connection = connect(url)
        self._redis: Any = self._conn.client
        self._publish_command = "SPUBLISH" if self._conn.sharded else "PUBLISH"
        self._layout = Layout(buckets)
        self._heartbeat = self._redis.register_script(scripts.HEARTBEAT)
        self._claim = self._redis.register_script(scripts.CLAIM)
        self._join = self._redis.register_script(scripts.JOIN)
        self._leave = self._redis.register_script(scripts.LEAVE)
        self._publish_change = self._redis.register_script(scripts.PUBLISH_CHANGE)
        self._baseline = self._redis.register_script(scripts.BASELINE)
        # The member's name among the replicas: unique per process (INSTANCE_ID), so per cluster member.
        self._instance = instance
        self._metrics = metrics
        self._lease_ms = lease_ms
        self._fallback = fallback
        self._local = MemoryBus()
        self._own = Ownership(self._instance)
        self._tracked: dict[WatchKey, WatchState] = {}
        self._by_hash: dict[str, WatchKey] = {}
        self._generation: dict[WatchKey, int] = {}
        """The latest cluster generation of each tracked key this replica knows of (the publish fence)."""
        self._registered: set[WatchKey] = set()
        """Keys whose interest of ours is written in Redis."""
        self._pending: dict[WatchKey, bool] = {}
        self._wake = asyncio.Event()
        self._cache_holds: dict[int, float] = {}
        """Bucket -> until when (monotonic) the cache holds an entry of it, so keeps hearing its changes."""
        self._joining: set[str] = set()
        """Keys (hashes) whose interest of ours is queued or being written: their interest messages wait in
        `_early`, as the members the write reads back replace this replica's view of who is interested."""
        self._early: dict[str, dict[str, bool]] = {}
        """Interest messages heard for keys whose interest of ours is still being written (hash -> instance ->
        present): newer than the members that write reads back, so they win over them."""
        self._bucket_keys: dict[int, set[WatchKey]] = {}
        self._unreadable: set[str] = set()
        """Tracked keys (hashes) whose stored state could not be read: reported once, while tracked."""
        self._unpublished: dict[WatchKey, ChangeEvent] = {}
        """Changes told here whose publishing failed (the latest per key): published when Redis answers again,
        so the other replicas' streams are told too."""
        self._cleaning: set[str] = set()
        self._taking: set[WatchKey] = set()
        """Keys this replica gained and has not yet taken over (see `_take_over`)."""
        self._take_over_task: asyncio.Task[None] | None = None
        self._slots: tuple[tuple[int, int, str], ...] | None = None
        """The cluster's slot map as of the last (re)subscription (Redis Cluster only)."""
        self._beaten = False
        self._revalidate_listeners: list[Callable[[frozenset[str]], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        """One-off tasks (resyncs, clean-ups of dead replicas): held here, so none is collected while pending,
        and each one's failure is logged when it ends; cancelled on close."""
        self._channels = Channels(
            self._conn.pubsub,
            self._layout,
            sharded=self._conn.sharded,
            on_message=self._dispatch,
            on_connected=lambda: self._set_up(True),
            on_confirmed=self._heard_again,
            on_lost=lambda reason: self._set_up(False, reason),
        )
        self.degraded: str | None = None
        """Why coordination is off (Redis unreachable), or None while it works."""

    @property
    def instance(self) -> str:
        return self._instance

    @property
    def owned_count(self) -> int:
        """The keys this replica polls for the cluster (`mcp_sidecar_leases_held`)."""
        return len(self._own.owned)

    @property
    def live_replicas(self) -> int:
        """The live replicas this one knows of, itself included (their shares of the fleet's read budget)."""
        return len(self._own.live)

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, SLOTS_MOVING):
            # Slots moved: a shard subscription may still be on a node that no longer owns its slot (a change
            # published meanwhile would not reach us). Subscribing afresh, on the owners, and resyncing each
            # confirmed bucket's keys from their stored states closes that gap.
            self._channels.reopen()
        self._set_up(False, str(exc))

    def _set_up(self, up: bool, reason: str | None = None) -> None:
        self._metrics.redis_up.set(1 if up else 0)
        if up and not self._channels.connected:
            # Coordination resumes only once we hear the bus again: an owner's change published before we
            # resubscribe would reach nobody here, and we would no longer be polling for ourselves.
            self._channels.retry_now()
            return
        if up and self.degraded is not None:
            logger.info("redis reachable again; coordinated polling resumes")
            self.degraded = None
            # Redis may have come back empty: write every interest again (and read the others' afresh).
            self._registered.clear()
            self._queue((key, True) for key in self._tracked)
            self._metrics.leases_held.set(len(self._own.owned))
        elif not up and self.degraded is None:
            logger.warning("redis unreachable; polling locally until it returns", extra={"reason": reason})
            self.degraded = reason or "redis unreachable"
            self._metrics.leases_held.set(0)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a redis coordination task failed", exc_info=task.exception())

    def _state_of(self, key: WatchKey) -> str:
        return self._layout.state(self._layout.bucket_of(key), key_hash(key))

    def _cmd(self, message: bytes) -> tuple[str, bytes]:
        return self._publish_command, message

    # Each of these is the job of a module further down the line (see `sidecar.bus.redis`).

    def _queue(self, ops: Iterable[tuple[WatchKey, bool]]) -> None:
        raise NotImplementedError

    def _dispatch(self, channel: bytes, data: bytes) -> None:
        raise NotImplementedError

    def _heard_again(self, bucket: int) -> None:
        raise NotImplementedError

    def _sweep_cache_holds(self) -> None:
        raise NotImplementedError


_CLEAN_UP_FAILURES: tuple[type[Exception], ...] = (*REDIS_FAILURES, ValueError)
_WRITE_FAILURES: tuple[type[Exception], ...] = (*REDIS_FAILURES, _NotHeard)


def _reraise_cancellation() -> None:
    # The redis client may turn a cancellation in the middle of a command into a connection error, or absorb it:
    # a loop must not go on after its own task was cancelled (shutdown would wait for it for ever).
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _pairs(items: list[Any]) -> Iterable[tuple[Any, Any]]:
    it = iter(items)
    return zip(it, it, strict=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _generation(raw: Any) -> int | None:
    """A stored generation (absent: 0), or None when it is not decimal digits alone below 2**53 (as the scripts
    read it: `int` alone would take " 7" or "7_0", Lua's `tonumber` "7.0" or "0x10")."""
    if raw is None:
        return 0
    if isinstance(raw, int) and not isinstance(raw, bool):
        text = str(raw)
    elif isinstance(raw, bytes | str):
        text = _text(raw)
    else:
        return None
    if not (text.isascii() and text.isdigit()):
        return None
    generation = int(text)
    return generation if generation < 2**53 else None
