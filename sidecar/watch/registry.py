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
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from sidecar.changes import Bus, ChangeEvent, LocalCoordinator, PollCoordinator, WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS, PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.tasks import TaskSet
from sidecar.upstream.base import Upstream
from sidecar.watch.admission import Admission
from sidecar.watch.budget import ReadBudget
from sidecar.watch.clock import LOOP_CLOCK, Clock
from sidecar.watch.entry import Entry, Stage
from sidecar.watch.evidence import AuthFailureListener, Evidence
from sidecar.watch.handles import ContextShare, Handle
from sidecar.watch.hint_routing import HintRouting
from sidecar.watch.looks import Looks
from sidecar.watch.native import NativeNotifications
from sidecar.watch.observe import Observation
from sidecar.watch.poller import ObservationListener, Watch
from sidecar.watch.rules import Rules
from sidecar.watch.schedule import HintBudget, Schedule
from sidecar.watch.shared_reads import SharedReads
from sidecar.watch.source_hints import SourceHint

__all__ = ["Handle", "Stage", "WatchRegistry"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
_NEW_WATCH_GRACE_S = 1.0


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
        replicas: Callable[[], int] = lambda: 1,
    ) -> None:
        self._clock = clock
        self._coordinator: PollCoordinator = coordinator or LocalCoordinator()
        self._config = config
        self._bus = bus
        self._metrics = metrics
        self._schedule = Schedule(config)
        self._budget = HintBudget(config.max_hinted_polls_per_s)
        self._rules = Rules(config.rules)
        self._reads = ReadBudget(
            config, metrics, clock, watches=self.watches, may_poll=self._coordinator.may_poll, replicas=replicas
        )
        self._looks = Looks(upstream, config, fair_share, self._rules)
        self._entries: dict[WatchKey, Entry] = {}
        self._baselines: SharedReads[Entry | None] = SharedReads()
        """First reads in flight, per (kind, URI, context)."""
        self._syncs: SharedReads[bool] = SharedReads()
        """Joiners' looks at live watches in flight, per key (see `_join`)."""
        self._observation_listeners: list[ObservationListener] = []
        self._tasks = TaskSet("a registry task failed", logger)
        """Spawned tasks nobody awaits (a publish, a watch's stop): shutdown waits for them."""
        self._admission = Admission(
            absent_ttl_s=config.default_interval_ms / 1000, rate_per_s=config.max_baselines_per_s, clock=clock.now
        )
        self._native = NativeNotifications(upstream, config, metrics, watch_of=self._watch, clock=self._clock)
        upstream.on_recovered = self._upstream_recovered
        self._unsubscribe = bus.subscribe(self._on_change)
        self._hints = HintRouting(
            self.watches,
            self._coordinator,
            metrics,
            debounce_ms=config.revalidate_debounce_ms,
            spawn=self._spawn,
            clock=self._clock,
        )
        self._evidence = Evidence(
            watch_of=self._watch,
            apply=self._apply,
            admission=self._admission,
            rules=self._rules,
            revalidate=self.revalidate,
            last_poller=self._last_poller,
        )
        self._release_handle = self._release
        """One bound method for every Handle (each `self._release` would be a new object, kept per handle)."""

    # -- reading ---------------------------------------------------------------------------------------

    def ticket(self) -> int:
        """A ticket for a look at the upstream that starts now (see `sidecar.watch.tickets`)."""
        return self._looks.tickets.take()

    def watches(self) -> Iterable[Watch]:
        return [entry.watch for entry in self._entries.values()]

    def _watch(self, key: WatchKey) -> Watch | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.watch

    def on_auth_failure(self, listener: AuthFailureListener) -> None:
        self._evidence.on_auth_failure(listener)

    def _last_poller(self, key: WatchKey) -> str | None:
        entry = self._entries.get(key)
        return entry.last_poller if entry is not None else None

    # -- interest ----------------------------------------------------------------------------------------

    async def acquire(self, kind: WatchKind, uri: str | None, identity: Identity) -> Handle | None:
        """Join or start the watch for this client; None when its own read finds nothing (not found).

        Raises UpstreamError when the upstream could not answer that read (down, a bad answer, a refusal), so
        the caller can tell the client what happened rather than that the resource does not exist; and
        TooManyRequests when the client's first reads beyond `polling.max_baselines_per_s` could not start
        within `polling.baseline_wait_s` (its own requests upstream held every slot of its fair share).
        """
        context = identity.context
        entry = self._joinable(kind, uri, context)
        if entry is not None:
            return await self._join(entry, identity)
        read = (kind, uri, context)
        task = self._baselines.joinable(read, identity.client)
        if task is None:
            if self._admission.known_absent(kind, uri, context):
                return None  # found missing a moment ago: not read again so soon
            paced = not self._admission.take(identity.client)
            task = asyncio.get_running_loop().create_task(self._baseline(kind, uri, identity, paced))
            self._baselines.register(read, identity.client if paced else None, task)
        # Shielded: one caller giving up must not cancel the read the others are waiting for.
        entry = await asyncio.shield(task)
        if entry is None:
            return None
        if entry.stage is Stage.ENDED:
            return await self.acquire(kind, uri, identity)  # expired before this caller could resume: start anew
        return self._add_ref(entry, identity)

    async def _join(self, entry: Entry, identity: Identity) -> Handle | None:
        """Join a live or lingering watch: a sync point. The caller's ack waits for a look at the upstream that
        starts after it asked (shared by everyone joining while it is in flight: a reconnect storm costs one
        read per key), so a read after the ack is never older than the subscription (invariant 16)."""
        watch = entry.watch
        handle = self._add_ref(entry, identity)  # first: a lingering watch must not expire while we look
        try:
            task = self._syncs.joinable(watch.key, identity.client)
            if task is None:
                paced = not self._admission.take(identity.client)
                task = asyncio.get_running_loop().create_task(self._sync(watch, identity, paced))
                self._syncs.register(watch.key, identity.client if paced else None, task)
            found = await asyncio.shield(task)
        except BaseException:
            handle.release()
            raise
        if not found:
            handle.release()
            return None
        return handle

    async def _sync(self, watch: Watch, identity: Identity, paced: bool) -> bool:
        ticket, observation = await self._looks.look(watch.key.kind, watch.key.uri, identity, paced)
        self._apply(watch, observation, ticket)
        return observation.found

    def on_observation(self, listener: ObservationListener) -> None:
        """Be told of every look at the upstream a watch applies (the read-through cache listens)."""
        self._observation_listeners.append(listener)

    def _observed(self, key: WatchKey, fingerprint: str, ticket: int) -> None:
        for listener in self._observation_listeners:
            listener(key, fingerprint, ticket)

    def _joinable(self, kind: WatchKind, uri: str | None, context: str) -> Entry | None:
        public = self._entries.get(WatchKey(kind, uri, PUBLIC))
        if public is not None and context in public.watch.verified:
            return public
        return self._entries.get(WatchKey(kind, uri, context))

    async def _baseline(self, kind: WatchKind, uri: str | None, identity: Identity, paced: bool) -> Entry | None:
        context = identity.context
        ticket, observation = await self._looks.look(kind, uri, identity, paced)
        if not observation.found:
            self._admission.absent(kind, uri, context)
            return None
        key = WatchKey(kind, uri, PUBLIC if observation.public else context)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._start_watch(key, observation, ticket)
            # Other replicas' caches may hold an answer older than this first look (one cached before anyone
            # watched): awaited, so they drop it if it differs before the caller's ack. No stream is told.
            await self._bus.publish(ChangeEvent(key, observation.fingerprint, 0, time.time(), baseline=True))
            if entry.stage is Stage.STARTING:
                # Starting, not idle, while the publish waited (a slow bus may take longer than any linger): only
                # now may it expire, once the callers waiting on this first look had their turn to take it.
                self._settle(entry, minimum_s=_NEW_WATCH_GRACE_S)
        else:
            self._apply(entry.watch, observation, ticket)
            if entry.stage is Stage.LINGERING:
                # Its timer must not fire before the callers waiting on this first look take it.
                self._linger(entry, minimum_s=_NEW_WATCH_GRACE_S)
        entry.watch.verified.add(context)
        return entry

    def _start_watch(self, key: WatchKey, baseline: Observation, ticket: int) -> Entry:
        watch = Watch(
            key,
            baseline,
            ticket,
            schedule=self._schedule,
            reader=self._read,
            sink=self._bus.publish,
            gate=self._looks.gate,
            tickets=self._looks.tickets,
            metrics=self._metrics,
            on_auth_failure=self._evidence.poll_refused,
            coordinator=self._coordinator,
            observed=self._observed,
            budget=self._budget,
            clock=self._clock,
            rule_interval_ms=rule.interval_ms if (rule := self._rules.for_uri(key.uri)) is not None else None,
            reads=self._reads,
        )
        entry = self._entries[key] = Entry(watch)
        self._observed(key, baseline.fingerprint, ticket)
        self._native.update(watch)
        watch.start()
        self._metrics.watches.labels(key.kind).inc()
        self._refresh_contexts()
        logger.debug("watch started", extra={"watch": key.short_hash, "kind": key.kind})
        return entry

    def _add_ref(self, entry: Entry, identity: Identity) -> Handle:
        watch, context = entry.watch, identity.context
        watch.refs += 1
        if watch.refs == 1:
            self._coordinator.track(watch)
        if entry.stage is Stage.LINGERING:
            entry.live()
        share = entry.shares.get(context)
        if share is None:
            share = entry.shares[context] = ContextShare(identity)
            self._native.hold(identity, watch.key.kind, watch.key.uri)
        share.handles += 1
        return Handle(watch.key, context, self._release_handle)

    def _release(self, handle: Handle) -> None:
        entry = self._entries.get(handle.key)
        if entry is None:
            return
        watch = entry.watch
        watch.refs -= 1
        share = entry.shares.get(handle.context)
        if share is not None:
            share.handles -= 1
            if share.handles <= 0:
                del entry.shares[handle.context]  # the identity leaves memory with its last stream
                self._native.drop(handle.context, handle.key.kind, handle.key.uri)
        if watch.refs <= 0:
            # No local interest: the lease goes to a replica that still has some; we linger, unpolled. (A watch
            # still starting lingers once its first look is published.)
            self._coordinator.untrack(watch.key)
            if entry.stage is Stage.LIVE:
                self._linger(entry)

    def _settle(self, entry: Entry, minimum_s: float) -> None:
        """The first look is published: live if someone holds it already, else lingering (not over sooner than
        `minimum_s`, so the callers waiting on that look can resume and take it, however short the linger)."""
        if entry.watch.refs > 0:
            entry.live()
        else:
            self._linger(entry, minimum_s)

    def _linger(self, entry: Entry, minimum_s: float = 0.0) -> None:
        """Held by none: ends after the linger (restarted, when it lingers already)."""
        delay = max(self._config.linger_ms / 1000, minimum_s)
        entry.lingers(self._clock.call_at(self._clock.now() + delay, lambda: self._expire(entry)))

    def _expire(self, entry: Entry) -> None:
        entry.linger = None
        if entry.stage is not Stage.LINGERING or entry.watch.refs > 0:
            return
        entry.stage = Stage.ENDED
        watch = entry.watch
        key = watch.key
        del self._entries[key]
        entry.shares.clear()
        self._native.forget(watch)
        self._reads.forget(key)
        self._metrics.watches.labels(key.kind).dec()
        self._refresh_contexts()
        self._spawn(watch.stop())
        logger.debug("watch stopped", extra={"watch": key.short_hash, "kind": key.kind})

    def _refresh_contexts(self) -> None:
        self._metrics.watched_contexts.set(len({key.context for key in self._entries}))

    async def _read(self, watch: Watch) -> Observation | None:
        entry = self._entries.get(watch.key)
        if entry is None or not entry.shares:
            return None  # lingering: no stream holds it, so no credential to poll with
        # Public data is the same for everyone; prefer polling it without credentials when possible.
        context = ANONYMOUS if ANONYMOUS in entry.shares else next(iter(entry.shares))
        entry.last_poller = context
        return await self._looks.read(watch.key.kind, watch.key.uri, entry.shares[context].identity)

    # -- evidence and hints --------------------------------------------------------------------------------

    def after_forward(
        self, method: str, params: JsonObject, identity: Identity, answer: JsonObject, ticket: int
    ) -> None:
        """A forwarded request taught us something (see `Evidence`)."""
        self._evidence.after_forward(method, params, identity, answer, ticket)

    def refused(self, method: str, params: JsonObject, identity: Identity) -> None:
        """The upstream refused `identity` a forwarded request (401/403) (see `Evidence`)."""
        self._evidence.refused(method, params, identity)

    def _apply(self, watch: Watch, observation: Observation, ticket: int) -> None:
        event = watch.offer(observation, ticket)
        if event is not None:
            self._spawn(self._bus.publish(event))

    def revalidate(self, identity: Identity) -> None:
        """Hint the public watches and this context's watches to poll soon (see `HintRouting`)."""
        self._hints.wrote(identity.context)

    def hint_source(self, hint: SourceHint) -> int:
        """The source says what changed: the watches it names look soon (see `HintRouting`); how many here."""
        return self._hints.source(hint)

    def _on_change(self, event: ChangeEvent) -> None:
        if event.baseline:
            return  # a first look elsewhere: nothing changed for anyone watching
        if event.key.kind == "resources_list":
            self._admission.present()  # what was missing may exist now
        # Changes seen by other replicas keep this replica's copy current, for when it takes the lease.
        watch = self._watch(event.key)
        if watch is not None:
            watch.adopt(event.fingerprint)

    def _upstream_recovered(self) -> None:
        # Every watch that failed during the outage re-reads now instead of waiting out its backoff (once).
        for watch in self.watches():
            watch.recover()

    # -- lifecycle -------------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        self._tasks.spawn(coro)

    async def aclose(self) -> None:
        self._unsubscribe()
        await self._native.aclose()
        self._hints.cancel()
        self._baselines.cancel()
        self._syncs.cancel()
        entries = list(self._entries.values())
        self._entries.clear()
        for entry in entries:
            if entry.linger is not None:
                entry.linger.cancel()
            entry.stage = Stage.ENDED
        watches = [entry.watch for entry in entries]
        await asyncio.gather(*(watch.stop() for watch in watches), return_exceptions=True)
        await self._tasks.wait()
