"""Our SharedInformer: one refcounted watch per key, shared by every stream that wants it.

Guarantees:
- Coalescing: one poll loop per WatchKey, however many streams hold it; concurrent first interests
  share one baseline read per (kind, URI, authorization context).
- Baseline first: `acquire` returns only after the watch has a fingerprint, so a change after the
  caller's ack is never missed and the first poll never fires a spurious change.
- Paced, not dropped: a client's first reads beyond `polling.max_baselines_per_s` wait their turn among
  its requests upstream (the fair share), up to `polling.baseline_wait_s`.
- Private stays private: a result that is not `public` is watched per authorization context, polled
  with that context's own credential, held only while one of its streams holds the watch.
- Release is idempotent; the last release starts a short linger so a reconnecting client does not
  pay a cold start.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

from sidecar.changes import Bus, ChangeEvent, LocalCoordinator, PollCoordinator, WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS, PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.constants import READ_ONLY_METHODS
from sidecar.protocol.errors import UpstreamHTTPError
from sidecar.upstream.base import Upstream
from sidecar.watch.admission import Admission
from sidecar.watch.clock import LOOP_CLOCK, Clock, Timer
from sidecar.watch.fingerprint import ABSENT
from sidecar.watch.handles import Handle, Holder
from sidecar.watch.native import NativeNotifications
from sidecar.watch.observe import Observation, observation_from_read, observe
from sidecar.watch.poller import HintBudget, ObservationListener, Schedule, Watch
from sidecar.watch.revalidate import Revalidator

__all__ = ["Handle", "WatchRegistry"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
_NEW_WATCH_GRACE_S = 1.0

AuthFailureListener = Callable[[WatchKey, str], None]
"""Told that a context's credential was refused while polling a key (its streams should end)."""


T = TypeVar("T")


def _joinable_read(reads: dict[Hashable, asyncio.Task[T]], read: Hashable, client: str) -> asyncio.Task[T] | None:
    """A read in flight that `client` may wait on: one that went at once (anyone's), or its own paced one. A read
    paced in another client's fair share is never joined: that client's queue must not delay this one
    (invariant 20); a read of its own costs one more upstream read, bounded by this client's rate."""
    return reads.get(read) or reads.get((read, client))


def _register_read(
    reads: dict[Hashable, asyncio.Task[T]], read: Hashable, paced_for: str | None, task: asyncio.Task[T]
) -> None:
    key: Hashable = read if paced_for is None else (read, paced_for)
    reads[key] = task

    def done(_: asyncio.Task[T]) -> None:
        if reads.get(key) is task:
            del reads[key]
        if not task.cancelled():
            # Retrieved here: the callers still waiting got it through their shield, and a read every caller gave
            # up on (a shield cancelled first no longer looks) has nobody left to tell.
            task.exception()

    task.add_done_callback(done)


class WatchRegistry:
    """WatchKey -> Watch, with credentials per context and the revalidate-on-write hints."""

    def __init__(
        self,
        upstream: Upstream,
        config: PollingConfig,
        bus: Bus,
        metrics: Metrics,
        fair_share: FairShare,
        coordinator: PollCoordinator | None = None,
        clock: Clock = LOOP_CLOCK,
    ) -> None:
        self._upstream = upstream
        self._fair_share = fair_share
        """Where a client's first reads over its rate wait their turn, among its forwarded requests."""
        self._clock = clock
        self._coordinator: PollCoordinator = coordinator or LocalCoordinator()
        self._config = config
        self._bus = bus
        self._metrics = metrics
        self._schedule = Schedule(config)
        self._budget = HintBudget(config.max_hinted_polls_per_s)
        self._gate = asyncio.Semaphore(config.max_concurrency)
        self._tickets = itertools.count(1)
        self._watches: dict[WatchKey, Watch] = {}
        self._baselines: dict[Hashable, asyncio.Task[Watch | None]] = {}
        """First reads in flight, per (kind, URI, context); one paced for a client is its alone (see
        `_joinable_read`)."""
        self._syncs: dict[Hashable, asyncio.Task[bool]] = {}
        """Joiners' looks at live watches in flight, one per key (see `_join`), paced ones per client too."""
        self._observation_listeners: list[ObservationListener] = []
        self._holders: dict[WatchKey, dict[str, Holder]] = {}
        """Per key, the contexts holding it: the only place the identities the sidecar polls with live."""
        self._lingers: dict[WatchKey, Timer] = {}
        self._last_poller: dict[WatchKey, str] = {}
        """The context whose identity the last poll of a key went with (one of its holders, for public keys): a
        refusal of that poll concerns that context alone."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._auth_listeners: list[AuthFailureListener] = []
        self._admission = Admission(
            absent_ttl_s=config.default_interval_ms / 1000, rate_per_s=config.max_baselines_per_s
        )
        self._native = NativeNotifications(upstream, config, metrics, watch_of=self._watches.get)
        upstream.on_recovered = self._upstream_recovered
        self._unsubscribe = bus.subscribe(self._on_change)
        self._revalidator = Revalidator(
            config.revalidate_debounce_ms, self._coordinator, self._hint_contexts, self._spawn, self._clock
        )
        self._coordinator.on_revalidate(self._hint_contexts)
        self._release_handle = self._release
        """One bound method for every Handle (each `self._release` would be a new object, kept per handle)."""

    # -- reading ---------------------------------------------------------------------------------------

    def ticket(self) -> int:
        """A ticket for a look at the upstream that starts now (see Watch's generation rule)."""
        return next(self._tickets)

    def watches(self) -> Iterable[Watch]:
        return self._watches.values()

    def on_auth_failure(self, listener: AuthFailureListener) -> None:
        self._auth_listeners.append(listener)

    # -- interest ----------------------------------------------------------------------------------------

    async def acquire(self, kind: WatchKind, uri: str | None, identity: Identity) -> Handle | None:
        """Join or start the watch for this client; None when its own read finds nothing (not found).

        Raises UpstreamError when the upstream could not answer that read (down, a bad answer, a refusal), so
        the caller can tell the client what happened rather than that the resource does not exist; and
        TooManyRequests when the client's first reads beyond `polling.max_baselines_per_s` could not start
        within `polling.baseline_wait_s` (its own requests upstream held every slot of its fair share).
        """
        context = identity.context
        watch = self._joinable(kind, uri, context)
        if watch is not None:
            return await self._join(watch, identity)
        read = (kind, uri, context)
        task = _joinable_read(self._baselines, read, identity.client)
        if task is None:
            if self._admission.known_absent(kind, uri, context):
                return None  # found missing a moment ago: not read again so soon
            paced = not self._admission.take(identity.client)
            task = asyncio.get_running_loop().create_task(self._baseline(kind, uri, identity, paced))
            _register_read(self._baselines, read, identity.client if paced else None, task)
        # Shielded: one caller giving up must not cancel the read the others are waiting for.
        watch = await asyncio.shield(task)
        if watch is None:
            return None
        return self._add_ref(watch, identity)

    def _turn(self, identity: Identity, paced: bool) -> contextlib.AbstractAsyncContextManager[None]:
        """A first read within the client's rate goes at once (among the polls); one over it waits its turn in
        the client's fair share, so a client subscribing to thousands of URIs delays only itself."""
        if not paced:
            return contextlib.nullcontext()
        return self._fair_share.slot(identity.client, within_s=self._config.baseline_wait_s, limit="baseline_wait")

    async def _join(self, watch: Watch, identity: Identity) -> Handle | None:
        """Join a live or lingering watch: a sync point. The caller's ack waits for a look at the upstream that
        starts after it asked (shared by everyone joining while it is in flight: a reconnect storm costs one
        read per key), so a read after the ack is never older than the subscription (invariant 16)."""
        handle = self._add_ref(watch, identity)  # first: a lingering watch must not expire while we look
        try:
            task = _joinable_read(self._syncs, watch.key, identity.client)
            if task is None:
                paced = not self._admission.take(identity.client)
                task = asyncio.get_running_loop().create_task(self._sync(watch, identity, paced))
                _register_read(self._syncs, watch.key, identity.client if paced else None, task)
            found = await asyncio.shield(task)
        except BaseException:
            handle.release()
            raise
        if not found:
            handle.release()
            return None
        return handle

    async def _sync(self, watch: Watch, identity: Identity, paced: bool) -> bool:
        async with self._turn(identity, paced), self._gate:
            ticket = self.ticket()
            observation = await observe(self._upstream, watch.key.kind, watch.key.uri, identity)
        self._apply(watch, observation, ticket)
        return observation.found

    def on_observation(self, listener: ObservationListener) -> None:
        """Be told of every look at the upstream a watch applies (the read-through cache listens)."""
        self._observation_listeners.append(listener)

    def _observed(self, key: WatchKey, fingerprint: str, ticket: int) -> None:
        for listener in self._observation_listeners:
            listener(key, fingerprint, ticket)

    def _joinable(self, kind: WatchKind, uri: str | None, context: str) -> Watch | None:
        public = self._watches.get(WatchKey(kind, uri, PUBLIC))
        if public is not None and context in public.verified:
            return public
        return self._watches.get(WatchKey(kind, uri, context))

    async def _baseline(self, kind: WatchKind, uri: str | None, identity: Identity, paced: bool) -> Watch | None:
        context = identity.context
        async with self._turn(identity, paced), self._gate:
            ticket = self.ticket()
            observation = await observe(self._upstream, kind, uri, identity)
        if not observation.found:
            self._admission.absent(kind, uri, context)
            return None
        key = WatchKey(kind, uri, PUBLIC if observation.public else context)
        watch = self._watches.get(key)
        if watch is None:
            watch = self._start_watch(key, observation, ticket)
            # Other replicas' caches may hold an answer older than this first look (one cached before anyone
            # watched): awaited, so they drop it if it differs before the caller's ack. No stream is told.
            await self._bus.publish(ChangeEvent(key, observation.fingerprint, 0, time.time(), baseline=True))
            if watch.refs == 0:
                # Starting, not idle, while the publish waited (a slow bus may take longer than any linger):
                # only now may it expire, once the callers waiting on this baseline had their turn to take it.
                self._relinger(watch)
        else:
            self._apply(watch, observation, ticket)
            if watch.refs == 0:
                # Lingering: its timer must not fire before the callers waiting on this baseline take it.
                self._relinger(watch)
        watch.verified.add(context)
        return watch

    def _start_watch(self, key: WatchKey, baseline: Observation, ticket: int) -> Watch:
        watch = Watch(
            key,
            baseline,
            ticket,
            schedule=self._schedule,
            reader=self._read,
            sink=self._bus.publish,
            gate=self._gate,
            next_ticket=self.ticket,
            metrics=self._metrics,
            on_auth_failure=self._auth_failed,
            coordinator=self._coordinator,
            observed=self._observed,
            budget=self._budget,
            clock=self._clock,
        )
        self._watches[key] = watch
        self._holders[key] = {}
        self._observed(key, baseline.fingerprint, ticket)
        self._native.update(watch)
        watch.start()
        self._metrics.watches.labels(key.kind).inc()
        self._refresh_partitions()
        logger.debug("watch started", extra={"watch": key.short_hash, "kind": key.kind})
        return watch

    def _add_ref(self, watch: Watch, identity: Identity) -> Handle:
        context = identity.context
        watch.refs += 1
        if watch.refs == 1:
            self._coordinator.track(watch)
        linger = self._lingers.pop(watch.key, None)
        if linger is not None:
            linger.cancel()
        holders = self._holders[watch.key]
        holder = holders.get(context)
        if holder is None:
            holder = holders[context] = Holder(identity)
            self._native.hold(identity, watch.key.kind, watch.key.uri)
        holder.handles += 1
        return Handle(watch.key, context, self._release_handle)

    def _release(self, handle: Handle) -> None:
        watch = self._watches.get(handle.key)
        if watch is None:
            return
        watch.refs -= 1
        holders = self._holders[handle.key]
        holder = holders.get(handle.context)
        if holder is not None:
            holder.handles -= 1
            if holder.handles <= 0:
                del holders[handle.context]  # the identity leaves memory with its last stream
                self._native.drop(handle.context, handle.key.kind, handle.key.uri)
        if watch.refs <= 0:
            # No local interest: the lease goes to a replica that still has some; we linger, unpolled.
            self._coordinator.untrack(watch.key)
            self._linger(watch)

    def _relinger(self, watch: Watch) -> None:
        """Until a caller waiting on a baseline takes a reference (all may have given up meanwhile); never sooner
        than they can resume, however short the configured linger."""
        timer = self._lingers.pop(watch.key, None)
        if timer is not None:
            timer.cancel()
        self._linger(watch, minimum_s=_NEW_WATCH_GRACE_S)

    def _linger(self, watch: Watch, minimum_s: float = 0.0) -> None:
        if watch.key in self._lingers:
            return
        delay = max(self._config.linger_ms / 1000, minimum_s)
        key = watch.key
        self._lingers[key] = self._clock.call_at(self._clock.now() + delay, lambda: self._expire(key))

    def _expire(self, key: WatchKey) -> None:
        self._lingers.pop(key, None)
        watch = self._watches.get(key)
        if watch is None or watch.refs > 0:
            return
        del self._watches[key]
        self._holders.pop(key, None)
        self._native.forget(watch)
        self._last_poller.pop(key, None)
        self._metrics.watches.labels(key.kind).dec()
        self._refresh_partitions()
        self._spawn(watch.stop())
        logger.debug("watch stopped", extra={"watch": key.short_hash, "kind": key.kind})

    def _refresh_partitions(self) -> None:
        self._metrics.partitions.set(len({key.partition for key in self._watches}))

    async def _read(self, watch: Watch) -> Observation | None:
        holders = self._holders.get(watch.key)
        if not holders:
            return None  # lingering: no stream holds it, so no credential to poll with
        # Public data is the same for everyone; prefer polling it without credentials when possible.
        context = ANONYMOUS if ANONYMOUS in holders else next(iter(holders))
        self._last_poller[watch.key] = context
        observation = await observe(self._upstream, watch.key.kind, watch.key.uri, holders[context].identity)
        return observation

    # -- evidence and hints --------------------------------------------------------------------------------

    def after_forward(
        self, method: str, params: JsonObject, identity: Identity, answer: JsonObject, ticket: int
    ) -> None:
        """A forwarded request taught us something: a write may have changed data; a read shows content."""
        if method not in READ_ONLY_METHODS:
            self.revalidate(identity)
            return
        if method != "resources/read" or not isinstance(params.get("uri"), str):
            return
        uri = params["uri"]
        result = answer.get("result")
        if isinstance(result, dict):
            self._admission.present(uri, identity.context)
            scope = PUBLIC if result.get("cacheScope") == "public" else identity.context
            watch = self._watches.get(WatchKey("resource", uri, scope))
            if watch is not None:  # fingerprint only what someone watches: this is the forwarding hot path
                with contextlib.suppress(ValueError):  # unfingerprintable content teaches nothing
                    self._apply(watch, observation_from_read(result), ticket)
            return
        error = answer.get("error")
        if isinstance(error, dict) and error.get("code") in (-32602, -32002):
            # Only this context's own watch: a resource hidden from one user is not gone for everyone.
            watch = self._watches.get(WatchKey("resource", uri, identity.context))
            if watch is not None:
                self._apply(watch, Observation(ABSENT, None, False), ticket)

    def refused(self, method: str, params: JsonObject, identity: Identity) -> None:
        """The upstream refused `identity` a forwarded request (401/403). A refused read of a URI the context
        watches ends its subscription to it, even when the watch is public and polled with someone else's
        credential, which the upstream still accepts."""
        uri = params.get("uri")
        if method != "resources/read" or not isinstance(uri, str):
            return
        for partition in (PUBLIC, identity.context):
            key = WatchKey("resource", uri, partition)
            watch = self._watches.get(key)
            if watch is not None:
                watch.verified.discard(identity.context)  # it must prove access again before rejoining
                for listener in self._auth_listeners:
                    listener(key, identity.context)

    def _apply(self, watch: Watch, observation: Observation, ticket: int) -> None:
        event = watch.offer(observation, ticket)
        if event is not None:
            self._spawn(self._bus.publish(event))

    def revalidate(self, identity: Identity) -> None:
        """Hint the public watches and this context's watches to poll soon (debounced: see Revalidator)."""
        self._revalidator.wrote(identity.context)

    def _hint_contexts(self, contexts: frozenset[str], links: Mapping[str, tuple[Any, ...]] | None = None) -> None:
        # A poll links to the traced writes that may concern it: a private watch to its own context's only.
        links = links or {}
        everyone = tuple(link for written in links.values() for link in written)
        for watch in self._watches.values():
            partition = watch.key.partition
            if partition == PUBLIC:
                watch.hint(everyone)
            elif partition in contexts:
                watch.hint(links.get(partition, ()))

    def _on_change(self, event: ChangeEvent) -> None:
        if event.baseline:
            return  # a first look elsewhere: nothing changed for anyone watching
        if event.key.kind == "resources_list":
            self._admission.present()  # what was missing may exist now
        # Changes seen by other replicas keep this replica's copy current, for when it takes the lease.
        watch = self._watches.get(event.key)
        if watch is not None:
            watch.adopt(event.fingerprint)

    def _upstream_recovered(self) -> None:
        # Every watch that failed during the outage re-reads now instead of waiting out its backoff (once).
        for watch in self._watches.values():
            watch.recover()

    def _auth_failed(self, watch: Watch, error: UpstreamHTTPError) -> None:
        # Only the context whose credential was refused: a public key is polled with one holder's credential,
        # and the other holders' credentials are as good as before (their streams must not end).
        context = watch.key.partition if watch.key.partition != PUBLIC else self._last_poller.get(watch.key)
        if context is None:
            return
        watch.verified.discard(context)  # it must prove access again with its own read before rejoining
        for listener in self._auth_listeners:
            listener(watch.key, context)

    # -- lifecycle -------------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_done)

    def _spawned_done(self, task: asyncio.Task[Any]) -> None:
        # Nobody awaits a spawned task (a publish, a watch's stop): its error is reported now, not when (or if)
        # the task is collected.
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("a registry task failed", exc_info=error)

    async def aclose(self) -> None:
        self._unsubscribe()
        await self._native.aclose()
        for timer in self._lingers.values():
            timer.cancel()
        self._lingers.clear()
        self._revalidator.cancel()
        for task in [*self._baselines.values(), *self._syncs.values()]:
            task.cancel()
        watches = list(self._watches.values())
        self._watches.clear()
        await asyncio.gather(*(watch.stop() for watch in watches), return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
