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
import enum
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sidecar.changes import Bus, ChangeEvent, LocalCoordinator, PollCoordinator, WatchKey, WatchKind
from sidecar.config import PollingConfig
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS, PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.protocol.constants import READ_ONLY_METHODS
from sidecar.protocol.errors import UpstreamHTTPError
from sidecar.tasks import TaskSet
from sidecar.upstream.base import Upstream
from sidecar.watch.admission import Admission
from sidecar.watch.budget import ReadBudget
from sidecar.watch.clock import LOOP_CLOCK, Clock, Timer
from sidecar.watch.fingerprint import ABSENT
from sidecar.watch.handles import ContextShare, Handle
from sidecar.watch.native import NativeNotifications
from sidecar.watch.observe import Observation, observation_from_read, observe
from sidecar.watch.poller import ObservationListener, Watch
from sidecar.watch.revalidate import Revalidator
from sidecar.watch.rules import Rules
from sidecar.watch.schedule import HintBudget, Schedule
from sidecar.watch.source_hints import SourceHint, from_bus, matching
from sidecar.watch.tickets import Tickets

__all__ = ["Handle", "Stage", "WatchRegistry"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
_NEW_WATCH_GRACE_S = 1.0

AuthFailureListener = Callable[[WatchKey, str], None]
"""Told that a context's credential was refused while polling a key (its streams should end)."""


T = TypeVar("T")


class Stage(enum.Enum):
    """Where a watch is in its life. Only a lingering watch may expire; an ended one is gone from the registry."""

    STARTING = "starting"
    """Its first look is being published: callers waiting on that first look have not taken it yet."""
    LIVE = "live"
    """Held by at least one stream."""
    LINGERING = "lingering"
    """Held by none, unpolled, kept a moment for a reconnecting client; its timer ends it."""
    ENDED = "ended"


@dataclass(slots=True)
class _Entry:
    """Everything the registry keeps about one watch."""

    watch: Watch
    stage: Stage = Stage.STARTING
    shares: dict[str, ContextShare] = field(default_factory=dict)
    """Per context holding it: the only place the identities the sidecar polls with live."""
    linger: Timer | None = None
    last_poller: str | None = None
    """The context whose identity the last poll went with (one of its shares, for a public key): a refusal of
    that poll concerns that context alone."""


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
        replicas: Callable[[], int] = lambda: 1,
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
        self._rules = Rules(config.rules)
        self._reads = ReadBudget(
            config, metrics, clock, watches=self.watches, may_poll=self._coordinator.may_poll, replicas=replicas
        )
        self._gate = asyncio.Semaphore(config.max_concurrency)
        self._tickets = Tickets()
        self._entries: dict[WatchKey, _Entry] = {}
        self._baselines: dict[Hashable, asyncio.Task[_Entry | None]] = {}
        """First reads in flight, per (kind, URI, context); one paced for a client is its alone (see
        `_joinable_read`)."""
        self._syncs: dict[Hashable, asyncio.Task[bool]] = {}
        """Joiners' looks at live watches in flight, one per key (see `_join`), paced ones per client too."""
        self._observation_listeners: list[ObservationListener] = []
        self._tasks = TaskSet("a registry task failed", logger)
        """Spawned tasks nobody awaits (a publish, a watch's stop): shutdown waits for them."""
        self._auth_listeners: list[AuthFailureListener] = []
        self._admission = Admission(
            absent_ttl_s=config.default_interval_ms / 1000, rate_per_s=config.max_baselines_per_s, clock=clock.now
        )
        self._native = NativeNotifications(upstream, config, metrics, watch_of=self._watch, clock=self._clock)
        upstream.on_recovered = self._upstream_recovered
        self._unsubscribe = bus.subscribe(self._on_change)
        self._revalidator = Revalidator(
            config.revalidate_debounce_ms, self._coordinator, self._hint_contexts, self._spawn, self._clock
        )
        self._coordinator.on_revalidate(self._heard_revalidate)
        self._release_handle = self._release
        """One bound method for every Handle (each `self._release` would be a new object, kept per handle)."""

    # -- reading ---------------------------------------------------------------------------------------

    def ticket(self) -> int:
        """A ticket for a look at the upstream that starts now (see `sidecar.watch.tickets`)."""
        return self._tickets.take()

    def watches(self) -> Iterable[Watch]:
        return [entry.watch for entry in self._entries.values()]

    def _watch(self, key: WatchKey) -> Watch | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.watch

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
        entry = self._joinable(kind, uri, context)
        if entry is not None:
            return await self._join(entry, identity)
        read = (kind, uri, context)
        task = _joinable_read(self._baselines, read, identity.client)
        if task is None:
            if self._admission.known_absent(kind, uri, context):
                return None  # found missing a moment ago: not read again so soon
            paced = not self._admission.take(identity.client)
            task = asyncio.get_running_loop().create_task(self._baseline(kind, uri, identity, paced))
            _register_read(self._baselines, read, identity.client if paced else None, task)
        # Shielded: one caller giving up must not cancel the read the others are waiting for.
        entry = await asyncio.shield(task)
        if entry is None:
            return None
        if entry.stage is Stage.ENDED:
            return await self.acquire(kind, uri, identity)  # expired before this caller could resume: start anew
        return self._add_ref(entry, identity)

    def _turn(self, identity: Identity, paced: bool) -> contextlib.AbstractAsyncContextManager[None]:
        """A first read within the client's rate goes at once (among the polls); one over it waits its turn in
        the client's fair share, so a client subscribing to thousands of URIs delays only itself."""
        if not paced:
            return contextlib.nullcontext()
        return self._fair_share.slot(
            identity.client, within_s=self._config.baseline_wait_s, limit="baseline_wait", lane=identity.lane
        )

    async def _join(self, entry: _Entry, identity: Identity) -> Handle | None:
        """Join a live or lingering watch: a sync point. The caller's ack waits for a look at the upstream that
        starts after it asked (shared by everyone joining while it is in flight: a reconnect storm costs one
        read per key), so a read after the ack is never older than the subscription (invariant 16)."""
        watch = entry.watch
        handle = self._add_ref(entry, identity)  # first: a lingering watch must not expire while we look
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
        ticket, observation = await self._look(watch.key.kind, watch.key.uri, identity, paced)
        self._apply(watch, observation, ticket)
        return observation.found

    async def _look(self, kind: WatchKind, uri: str | None, identity: Identity, paced: bool) -> tuple[int, Observation]:
        """A caller's own look: in its turn, among the polls, ticketed as it starts."""
        async with self._turn(identity, paced), self._gate:
            return await self._tickets.look(lambda: observe(self._upstream, kind, uri, identity, self._rules))

    def on_observation(self, listener: ObservationListener) -> None:
        """Be told of every look at the upstream a watch applies (the read-through cache listens)."""
        self._observation_listeners.append(listener)

    def _observed(self, key: WatchKey, fingerprint: str, ticket: int) -> None:
        for listener in self._observation_listeners:
            listener(key, fingerprint, ticket)

    def _joinable(self, kind: WatchKind, uri: str | None, context: str) -> _Entry | None:
        public = self._entries.get(WatchKey(kind, uri, PUBLIC))
        if public is not None and context in public.watch.verified:
            return public
        return self._entries.get(WatchKey(kind, uri, context))

    async def _baseline(self, kind: WatchKind, uri: str | None, identity: Identity, paced: bool) -> _Entry | None:
        context = identity.context
        ticket, observation = await self._look(kind, uri, identity, paced)
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

    def _start_watch(self, key: WatchKey, baseline: Observation, ticket: int) -> _Entry:
        watch = Watch(
            key,
            baseline,
            ticket,
            schedule=self._schedule,
            reader=self._read,
            sink=self._bus.publish,
            gate=self._gate,
            tickets=self._tickets,
            metrics=self._metrics,
            on_auth_failure=self._auth_failed,
            coordinator=self._coordinator,
            observed=self._observed,
            budget=self._budget,
            clock=self._clock,
            rule_interval_ms=rule.interval_ms if (rule := self._rules.for_uri(key.uri)) is not None else None,
            reads=self._reads,
        )
        entry = self._entries[key] = _Entry(watch)
        self._observed(key, baseline.fingerprint, ticket)
        self._native.update(watch)
        watch.start()
        self._metrics.watches.labels(key.kind).inc()
        self._refresh_contexts()
        logger.debug("watch started", extra={"watch": key.short_hash, "kind": key.kind})
        return entry

    def _add_ref(self, entry: _Entry, identity: Identity) -> Handle:
        watch, context = entry.watch, identity.context
        watch.refs += 1
        if watch.refs == 1:
            self._coordinator.track(watch)
        if entry.stage is Stage.LINGERING:
            self._live(entry)
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

    def _settle(self, entry: _Entry, minimum_s: float) -> None:
        """The first look is published: live if someone holds it already, else lingering (not over sooner than
        `minimum_s`, so the callers waiting on that look can resume and take it, however short the linger)."""
        if entry.watch.refs > 0:
            self._live(entry)
        else:
            self._linger(entry, minimum_s)

    def _live(self, entry: _Entry) -> None:
        if entry.linger is not None:
            entry.linger.cancel()
            entry.linger = None
        entry.stage = Stage.LIVE

    def _linger(self, entry: _Entry, minimum_s: float = 0.0) -> None:
        """Held by none: ends after the linger (restarted, when it lingers already)."""
        if entry.linger is not None:
            entry.linger.cancel()
        entry.stage = Stage.LINGERING
        delay = max(self._config.linger_ms / 1000, minimum_s)
        entry.linger = self._clock.call_at(self._clock.now() + delay, lambda: self._expire(entry))

    def _expire(self, entry: _Entry) -> None:
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
        return await observe(self._upstream, watch.key.kind, watch.key.uri, entry.shares[context].identity, self._rules)

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
            watch = self._watch(WatchKey("resource", uri, scope))
            if watch is not None:  # fingerprint only what someone watches: this is the forwarding hot path
                with contextlib.suppress(ValueError):  # unfingerprintable content teaches nothing
                    self._apply(watch, observation_from_read(result, self._rules.for_uri(uri)), ticket)
            return
        error = answer.get("error")
        if isinstance(error, dict) and error.get("code") in (-32602, -32002):
            # Only this context's own watch: a resource hidden from one user is not gone for everyone.
            watch = self._watch(WatchKey("resource", uri, identity.context))
            if watch is not None:
                self._apply(watch, Observation(ABSENT, None, False), ticket)

    def refused(self, method: str, params: JsonObject, identity: Identity) -> None:
        """The upstream refused `identity` a forwarded request (401/403). A refused read of a URI the context
        watches ends its subscription to it, even when the watch is public and polled with someone else's
        credential, which the upstream still accepts."""
        uri = params.get("uri")
        if method != "resources/read" or not isinstance(uri, str):
            return
        for context in (PUBLIC, identity.context):
            key = WatchKey("resource", uri, context)
            watch = self._watch(key)
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
        for watch in self.watches():
            context = watch.key.context
            if context == PUBLIC:
                watch.hint(everyone)
            elif context in contexts:
                watch.hint(links.get(context, ()))

    def hint_source(self, hint: SourceHint) -> int:
        """The source says what changed: each matching watch, in every context, looks soon with its own credential
        (a hint, not a change), and the other replicas are told (their lease owners look). The watches hinted here."""
        self._spawn(self._coordinator.announce_revalidate(frozenset({hint.to_bus()})))
        return self._hint_matching(hint)

    def _hint_matching(self, hint: SourceHint) -> int:
        hinted = 0
        for watch in matching(self.watches(), hint):
            watch.hint()
            hinted += 1
        self._metrics.watches_hinted.inc(hinted)
        return hinted

    def _heard_revalidate(self, announced: frozenset[str]) -> None:
        written, hints = from_bus(announced)
        if written:
            self._hint_contexts(written)
        for hint in hints:
            self._hint_matching(hint)

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

    def _auth_failed(self, watch: Watch, error: UpstreamHTTPError) -> None:
        # Only the context whose credential was refused: a public key is polled with one context's credential,
        # and the other contexts' credentials are as good as before (their streams must not end).
        entry = self._entries.get(watch.key)
        if watch.key.context != PUBLIC:
            context: str | None = watch.key.context
        else:
            context = entry.last_poller if entry is not None else None
        if context is None:
            return
        watch.verified.discard(context)  # it must prove access again with its own read before rejoining
        for listener in self._auth_listeners:
            listener(watch.key, context)

    # -- lifecycle -------------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        self._tasks.spawn(coro)

    async def aclose(self) -> None:
        self._unsubscribe()
        await self._native.aclose()
        self._revalidator.cancel()
        for task in [*self._baselines.values(), *self._syncs.values()]:
            task.cancel()
        entries = list(self._entries.values())
        self._entries.clear()
        for entry in entries:
            if entry.linger is not None:
                entry.linger.cancel()
            entry.stage = Stage.ENDED
        watches = [entry.watch for entry in entries]
        await asyncio.gather(*(watch.stop() for watch in watches), return_exceptions=True)
        await self._tasks.wait()
