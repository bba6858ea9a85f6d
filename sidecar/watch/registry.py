"""Our SharedInformer: one refcounted watch per key, shared by every stream that wants it; the watch engine's driver.

The rules (coalescing, baseline first, pacing, private per context, linger, and each watch's looks and polls:
the ticket rule, error confirmation, change, schedule, read budget) are the engine's (`sidecar.watch.engine`),
which never awaits and is the one writer of watch state. This is the one place in `sidecar.watch` that turns its
commands into I/O (looks and polls at the upstream, publishes, timers, the coordinator, the upstream's
notification streams, metrics) and what comes of them back into events. A caller of `acquire` is a waiter:
answered when the engine says, and dropped from its look if it leaves first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sidecar.changes import Bus, ChangeEvent, LocalCoordinator, PollCoordinator, WatchKey, WatchKind
from sidecar.config import PollingConfig, ToolRule
from sidecar.fair_share import FairShare
from sidecar.identity import Identity
from sidecar.observability.metrics import Metrics
from sidecar.tasks import TaskSet
from sidecar.upstream.base import Watched
from sidecar.watch.clock import LOOP_CLOCK, Clock, Timer
from sidecar.watch.engine import (
    AnnounceWrites,
    BudgetShare,
    CancelTimer,
    ChangeHeard,
    Command,
    CoordinatorView,
    Cover,
    Covered,
    Engine,
    Event,
    Fail,
    Hinted,
    Interval,
    Leave,
    LinkPoll,
    LookDone,
    LookFailed,
    Observed,
    Publish,
    Published,
    PublishFirst,
    Record,
    Recovered,
    Release,
    Resolve,
    Revoke,
    SetTimer,
    Stage,
    StartLook,
    StartPoll,
    StartWatch,
    StopWatch,
    Subscribe,
    TimerFired,
    Track,
    Uncover,
    Untrack,
    Waited,
    WatchSummary,
    busiest,
)
from sidecar.watch.handles import Handle
from sidecar.watch.hearing import Hearing
from sidecar.watch.looks import Looks
from sidecar.watch.native import NativeNotifications
from sidecar.watch.poll_tasks import PollTasks
from sidecar.watch.waiters import Waiters

__all__ = ["AuthFailureListener", "Handle", "ObservationListener", "Stage", "WatchRegistry", "WatchSummary"]

logger = logging.getLogger(__name__)

AuthFailureListener = Callable[[WatchKey, str], None]
"""Told that a context's credential was refused while polling a key (its streams should end)."""
ObservationListener = Callable[[WatchKey, str, int], None]
"""(key, fingerprint, ticket): a look at the upstream was applied (the cache drops what it contradicts)."""


class WatchRegistry:
    """WatchKey -> watch (the engine's record), with credentials per context and the revalidate-on-write hints."""

    def __init__(
        self,
        upstream: Watched,
        config: PollingConfig,
        bus: Bus,
        metrics: Metrics,
        fair_share: FairShare,
        coordinator: PollCoordinator | None = None,
        clock: Clock = LOOP_CLOCK,
        replicas: Callable[[], int] = lambda: 1,
        hint_settle_ms: int = 0,
        tool_rules: Sequence[ToolRule] = (),
    ) -> None:
        self._clock = clock
        self._coordinator: PollCoordinator = coordinator or LocalCoordinator()
        self._bus = bus
        self._metrics = metrics
        self._looks = Looks(upstream, config, fair_share, metrics, clock)
        self._engine = Engine(
            linger_s=config.linger_ms / 1000,
            absent_ttl_s=config.default_interval_ms / 1000,
            rate_per_s=config.max_baselines_per_s,
            rules=self._looks.rules,
            polling=config,
            settle_ms=hint_settle_ms,
            may_poll=self._coordinator.may_poll,
            replicas=replicas,
        )
        self._waiters = Waiters()
        self._timers: dict[int, Timer] = {}
        self._polls = PollTasks(self._engine, self._looks, bus, metrics, clock, self._handle)
        self._inflight: set[asyncio.Task[None]] = set()
        """Looks and first publishes the engine waits on (cancelled at shutdown)."""
        self._observation_listeners: list[ObservationListener] = []
        self._auth_listeners: list[AuthFailureListener] = []
        self._tasks = TaskSet("a registry task failed", logger)
        """Spawned tasks nobody awaits (a publish): shutdown waits for them."""
        self._native = NativeNotifications(
            upstream, config, metrics, hint=self._hint, cover=self._cover, keys_at=self._keys_at, clock=self._clock
        )
        self._stop_hearing_recovery = upstream.add_recovery_listener(self._upstream_recovered)
        self._unsubscribe = bus.subscribe(self._on_change)
        self._stop_adopting = self._coordinator.on_adopt(self._on_change)
        self.hearing = Hearing(
            self._handle,
            self._looks.tickets.take,
            tool_rules=tool_rules,
            tools=self._looks.tools,
            index=self._engine.index,
            hint=self._hint,
            coordinator=self._coordinator,
            metrics=metrics,
            spawn=self._spawn,
        )
        """What the watches hear besides their own looks: the handler's observer, the hint endpoint's target."""
        self._release_handle = self._release
        """One bound method for every Handle (each `self._release` would be a new object, kept per handle)."""

    # -- reading ---------------------------------------------------------------------------------------

    def watches(self) -> list[WatchSummary]:
        """Every watch as the status page shows one."""
        return self._summaries(self._engine.records())

    def busiest(self, most: int) -> list[WatchSummary]:
        """The `most` watches with the most subscribers, those first (ties in the order the watches started)."""
        return self._summaries(busiest(self._engine.records(), most))

    @property
    def watch_count(self) -> int:
        return len(self._engine.index)

    @property
    def watched_contexts(self) -> int:
        return self._engine.index.contexts

    def _summaries(self, records: Iterable[Record]) -> list[WatchSummary]:
        now, wall = self._clock.now(), time.time()
        return [WatchSummary.of(record, now=now, wall=wall) for record in records]

    @property
    def looks_in_flight(self) -> int:
        """Looks (first reads, joiners' looks) and first publishes not back yet."""
        return sum(not task.done() for task in self._inflight)

    @property
    def polls_in_flight(self) -> int:
        return self._polls.running

    @property
    def waiting(self) -> int:
        """Callers of `acquire` not answered yet."""
        return len(self._waiters)

    def on_auth_failure(self, listener: AuthFailureListener) -> None:
        self._auth_listeners.append(listener)

    def on_observation(self, listener: ObservationListener) -> None:
        """Be told of every look at the upstream a watch applies (the read-through cache listens)."""
        self._observation_listeners.append(listener)

    def _observed(self, key: WatchKey, fingerprint: str, ticket: int) -> None:
        for listener in self._observation_listeners:
            listener(key, fingerprint, ticket)

    # -- interest ----------------------------------------------------------------------------------------

    async def acquire(self, kind: WatchKind, uri: str | None, identity: Identity) -> Handle | None:
        """Join or start the watch for this client; None when its own read finds nothing (not found).

        Raises UpstreamError when the upstream could not answer that read (down, a bad answer, a refusal), so
        the caller can tell the client what happened rather than that the resource does not exist; and
        TooManyRequests when the client's first reads beyond `polling.max_baselines_per_s` could not start
        within `polling.baseline_wait_s` (its own requests upstream held every slot of its fair share).
        """
        waiter, answer = self._waiters.add()
        self._handle(Subscribe(waiter, kind, uri, identity))
        try:
            key = await answer
        except asyncio.CancelledError:
            held = self._waiters.held(waiter)
            if held is not None:
                self._handle(Release(held, identity.context))  # answered as it was cancelled: it lets go
            else:
                self._handle(Leave(waiter))  # still waiting (or failed, or found nothing): dropped from its look
            raise
        finally:
            self._waiters.remove(waiter)
        return None if key is None else Handle(key, identity.context, self._release_handle)

    def _release(self, handle: Handle) -> None:
        self._handle(Release(handle.key, handle.context))

    # -- the engine's commands, carried out ----------------------------------------------------------------

    def _handle(self, event: Event, publishes: list[Publish] | None = None) -> None:
        """Feed `event`; carry out what it asks for. `publishes`: where a poll collects its changes, to publish
        them itself before it is over (otherwise each is published by a task of its own)."""
        for command in self._engine.handle(event, self._clock.now()):
            if publishes is not None and isinstance(command, Publish):
                publishes.append(command)
            else:
                self._do(command)

    def _do(self, command: Command) -> None:
        if isinstance(command, Observed):
            self._observed(command.key, command.fingerprint, command.ticket)
        elif isinstance(command, Publish):
            self._spawn(self._polls.publish(command))
        elif isinstance(command, SetTimer):
            timer = command.timer
            self._timers[timer] = self._clock.call_at(command.when, lambda: self._fire(timer))
        elif isinstance(command, CancelTimer):
            if (scheduled := self._timers.pop(command.timer, None)) is not None:
                scheduled.cancel()
        elif isinstance(command, StartPoll):
            self._polls.start(command)
        elif isinstance(command, Resolve):
            self._waiters.answer(command.waiter, command.key)
        elif isinstance(command, Fail):
            self._waiters.fail(command.waiter, command.error)
        elif isinstance(command, StartLook):
            self._run(self._look(command))
        elif isinstance(command, Track):
            self._coordinator.track(CoordinatorView(command.key, self._engine.record, self._hint))
        elif isinstance(command, Untrack):
            self._coordinator.untrack(command.key)
        elif isinstance(command, Cover):
            self._native.hold(command.identity, command.kind, command.uri)
        elif isinstance(command, Uncover):
            self._native.drop(command.context, command.kind, command.uri)
        elif isinstance(command, StartWatch):
            self._start_watch(command)
        elif isinstance(command, PublishFirst):
            self._run(self._publish_first(command))
        elif isinstance(command, StopWatch):
            self._stop_watch(command)
        elif isinstance(command, Revoke):
            for listener in self._auth_listeners:
                listener(command.key, command.context)
        elif isinstance(command, AnnounceWrites):
            self._spawn(self._coordinator.announce_revalidate(command.contexts))
        elif isinstance(command, LinkPoll):
            self._polls.link(command.key, command.links)
        elif isinstance(command, Waited):
            self._metrics.queue_wait.labels(command.limit).observe(command.seconds)
        elif isinstance(command, Interval):
            self._metrics.poll_interval.observe(command.seconds)
        elif isinstance(command, BudgetShare):
            self._metrics.read_budget.set(command.per_s)

    def _run(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _look(self, command: StartLook) -> None:
        try:
            ticket, observation = await self._looks.look(command.kind, command.uri, command.identity, command.paced)
        except Exception as exc:  # every waiter on it is told (an UpstreamError, TooManyRequests, or a bug)
            self._handle(LookFailed(command.look, exc))
        else:
            self._handle(LookDone(command.look, ticket, observation))

    async def _publish_first(self, command: PublishFirst) -> None:
        # Awaited before the callers' acks: other replicas drop a cached answer older than this first look.
        try:
            await self._bus.publish(ChangeEvent(command.key, command.fingerprint, 0, time.time(), baseline=True))
        except Exception as exc:
            self._handle(Published(command.look, exc))
        else:
            self._handle(Published(command.look))

    def _fire(self, timer: int) -> None:
        if self._timers.pop(timer, None) is not None:
            self._handle(TimerFired(timer))

    def _start_watch(self, command: StartWatch) -> None:
        key = command.key
        self._observed(key, command.observation.fingerprint, command.ticket)
        self._native.update(key)
        self._metrics.watches.labels(key.kind).inc()
        self._refresh_contexts()
        logger.debug("watch started", extra={"watch": key.short_hash, "kind": key.kind})

    def _stop_watch(self, command: StopWatch) -> None:
        key = command.key
        if command.native:
            self._metrics.native_watches.dec()
        self._polls.stop(key)
        self._metrics.watches.labels(key.kind).dec()
        self._refresh_contexts()
        logger.debug("watch stopped", extra={"watch": key.short_hash, "kind": key.kind})

    def _refresh_contexts(self) -> None:
        self._metrics.watched_contexts.set(self.watched_contexts)

    def _hint(self, key: WatchKey, *, warm: bool = False) -> None:
        """`key`'s watch, if there is one, looks soon (see `Hinted`)."""
        self._handle(Hinted(key, warm))

    def _keys_at(self, kind: WatchKind, uri: str | None) -> list[WatchKey]:
        """The watches of (kind, uri), in every context (what an upstream's own notification concerns)."""
        return self._engine.index.at([(kind, uri)])

    def _cover(self, key: WatchKey, native: bool) -> None:
        """The upstream's notifications cover `key` now, or no longer do."""
        record = self._engine.record(key)
        if record is not None and record.native != native:
            self._metrics.native_watches.inc(1 if native else -1)
        self._handle(Covered(key, native))

    # -- heard on the bus and from the upstream ---------------------------------------------------------------

    def _on_change(self, event: ChangeEvent) -> None:
        self._handle(ChangeHeard(event))

    def _upstream_recovered(self) -> None:
        # Every watch that failed during the outage re-reads now instead of waiting out its backoff (once).
        self._handle(Recovered())

    # -- lifecycle -------------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        self._tasks.spawn(coro)

    async def aclose(self) -> None:
        self._unsubscribe()
        self._stop_adopting()
        self._stop_hearing_recovery()
        await self._native.aclose()
        inflight = list(self._inflight)
        for task in inflight:
            task.cancel()
        self._waiters.cancel_all()
        self._engine.close()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await asyncio.gather(*inflight, return_exceptions=True)
        await self._polls.aclose()
        await self._tasks.wait()
