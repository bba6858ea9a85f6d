"""Our SharedInformer: one refcounted watch per key, shared by every stream that wants it; the watch engine's driver.

The rules (coalescing, baseline first, pacing, private per context, linger) are the engine's
(`sidecar.watch.engine`), which never awaits. This is the one place in `sidecar.watch` that turns its commands
into I/O (looks at the upstream, publishes, timers, the coordinator, the upstream's notification streams) and
what comes of them back into events. A caller of `acquire` is a waiter: answered when the engine says, and
dropped from its look if it leaves first.
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
from sidecar.protocol.errors import UpstreamHTTPError
from sidecar.protocol.types import JsonObject
from sidecar.tasks import TaskSet
from sidecar.upstream.base import Watched
from sidecar.watch.budget import ReadBudget
from sidecar.watch.clock import LOOP_CLOCK, Clock, Timer
from sidecar.watch.engine import Engine, Stage
from sidecar.watch.engine.commands import (
    Adopt,
    Apply,
    CancelTimer,
    Command,
    Cover,
    Fail,
    HintWrite,
    PublishFirst,
    Resolve,
    Revoke,
    SetTimer,
    StartLook,
    StartWatch,
    StopWatch,
    Track,
    Uncover,
    Untrack,
)
from sidecar.watch.engine.events import (
    ChangeHeard,
    Event,
    Forwarded,
    Leave,
    LookDone,
    LookFailed,
    PollRefused,
    Published,
    Refused,
    Release,
    Subscribe,
    TimerFired,
)
from sidecar.watch.engine.evidence import teaches
from sidecar.watch.handles import Handle
from sidecar.watch.hint_routing import HintRouting
from sidecar.watch.looks import Looks
from sidecar.watch.native import NativeNotifications
from sidecar.watch.observation import Observation
from sidecar.watch.poller import ObservationListener, Watch
from sidecar.watch.rules import Rules
from sidecar.watch.schedule import HintBudget, Schedule
from sidecar.watch.source_hints import SourceHint
from sidecar.watch.tool_calls import ToolCalls, ToolCatalog
from sidecar.watch.waiters import Waiters

__all__ = ["AuthFailureListener", "Handle", "Stage", "WatchRegistry"]

logger = logging.getLogger(__name__)


AuthFailureListener = Callable[[WatchKey, str], None]
"""Told that a context's credential was refused while polling a key (its streams should end)."""


class WatchRegistry:
    """WatchKey -> Watch, with credentials per context and the revalidate-on-write hints."""

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
        self._config = config
        self._bus = bus
        self._metrics = metrics
        self._schedule = Schedule(config, settle_ms=hint_settle_ms)
        """Every watch's: intervals, backoff, and how long a hint keeps a watch warm (`hints.settle_ms`)."""
        self._budget = HintBudget(config.max_hinted_polls_per_s)
        self._rules = Rules(config.rules)
        self._reads = ReadBudget(config, watches=self.watches, may_poll=self._coordinator.may_poll, replicas=replicas)
        catalog = ToolCatalog()
        self._tool_calls = ToolCalls(tool_rules, catalog, metrics)
        """Which tool calls may write (`revalidate.tools`, and the tools lists the looks and forwarded answers show)."""
        self._looks = Looks(upstream, config, fair_share, self._rules, tools=catalog)
        self._engine = Engine(
            linger_s=config.linger_ms / 1000,
            absent_ttl_s=config.default_interval_ms / 1000,
            rate_per_s=config.max_baselines_per_s,
            rules=self._rules,
        )
        self._watches: dict[WatchKey, Watch] = {}
        """The engine's watches, as pollers (one per record the engine keeps)."""
        self._waiters = Waiters()
        self._timers: dict[int, Timer] = {}
        self._inflight: set[asyncio.Task[None]] = set()
        """Looks and first publishes the engine waits on (cancelled at shutdown)."""
        self._observation_listeners: list[ObservationListener] = []
        self._auth_listeners: list[AuthFailureListener] = []
        self._tasks = TaskSet("a registry task failed", logger)
        """Spawned tasks nobody awaits (a publish, a watch's stop): shutdown waits for them."""
        self._native = NativeNotifications(
            upstream, config, metrics, watch_of=self._watches.get, watches=self.watches, clock=self._clock
        )
        self._stop_hearing_recovery = upstream.add_recovery_listener(self._upstream_recovered)
        self._unsubscribe = bus.subscribe(self._on_change)
        self._stop_adopting = self._coordinator.on_adopt(self._on_change)
        self._hints = HintRouting(
            self.watches,
            self._coordinator,
            metrics,
            debounce_ms=config.revalidate_debounce_ms,
            spawn=self._spawn,
            clock=self._clock,
        )
        self._release_handle = self._release
        """One bound method for every Handle (each `self._release` would be a new object, kept per handle)."""

    # -- reading ---------------------------------------------------------------------------------------

    def ticket(self) -> int:
        """A ticket for a look at the upstream that starts now (see `sidecar.watch.tickets`)."""
        return self._looks.tickets.take()

    def watches(self) -> Iterable[Watch]:
        return list(self._watches.values())

    @property
    def looks_in_flight(self) -> int:
        """Looks (first reads, joiners' looks) and first publishes not back yet."""
        return sum(not task.done() for task in self._inflight)

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

    def _handle(self, event: Event) -> None:
        for command in self._engine.handle(event, self._clock.now()):
            self._do(command)

    def _do(self, command: Command) -> None:
        if isinstance(command, Apply):
            self._apply(command.key, command.observation, command.ticket)
        elif isinstance(command, Resolve):
            self._waiters.answer(command.waiter, command.key)
        elif isinstance(command, Fail):
            self._waiters.fail(command.waiter, command.error)
        elif isinstance(command, StartLook):
            self._run(self._look(command))
        elif isinstance(command, Track):
            self._coordinator.track(self._watches[command.key])
        elif isinstance(command, Untrack):
            self._coordinator.untrack(command.key)
        elif isinstance(command, Cover):
            self._native.hold(command.identity, command.kind, command.uri)
        elif isinstance(command, Uncover):
            self._native.drop(command.context, command.kind, command.uri)
        elif isinstance(command, SetTimer):
            timer = command.timer
            self._timers[timer] = self._clock.call_at(command.when, lambda: self._fire(timer))
        elif isinstance(command, CancelTimer):
            if (scheduled := self._timers.pop(command.timer, None)) is not None:
                scheduled.cancel()
        elif isinstance(command, StartWatch):
            self._start_watch(command.key, command.observation, command.ticket)
        elif isinstance(command, PublishFirst):
            self._run(self._publish_first(command))
        elif isinstance(command, StopWatch):
            self._stop_watch(command.key)
        elif isinstance(command, Adopt):
            if (watch := self._watches.get(command.key)) is not None:
                watch.adopt(command.fingerprint)
        elif isinstance(command, Revoke):
            for listener in self._auth_listeners:
                listener(command.key, command.context)
        elif isinstance(command, HintWrite):
            self._hints.wrote(command.context)

    def _run(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _look(self, look: StartLook) -> None:
        try:
            ticket, observation = await self._looks.look(look.kind, look.uri, look.identity, look.paced)
        except Exception as exc:  # every waiter on it is told (an UpstreamError, TooManyRequests, or a bug)
            self._handle(LookFailed(look.look, exc))
        else:
            self._handle(LookDone(look.look, ticket, observation))

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

    def _start_watch(self, key: WatchKey, baseline: Observation, ticket: int) -> None:
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
            on_auth_failure=self._poll_refused,
            coordinator=self._coordinator,
            observed=self._observed,
            budget=self._budget,
            clock=self._clock,
            rule_interval_ms=rule.interval_ms if (rule := self._rules.for_uri(key.uri)) is not None else None,
            reads=self._reads,
            holders=self._engine.holders,
        )
        self._watches[key] = watch
        self._observed(key, baseline.fingerprint, ticket)
        self._native.update(watch)
        watch.start()
        self._metrics.watches.labels(key.kind).inc()
        self._refresh_contexts()
        logger.debug("watch started", extra={"watch": key.short_hash, "kind": key.kind})

    def _stop_watch(self, key: WatchKey) -> None:
        watch = self._watches.pop(key)
        self._native.forget(watch)
        self._reads.forget(key)
        self._metrics.watches.labels(key.kind).dec()
        self._refresh_contexts()
        self._spawn(watch.stop())
        logger.debug("watch stopped", extra={"watch": key.short_hash, "kind": key.kind})

    def _refresh_contexts(self) -> None:
        self._metrics.watched_contexts.set(len({key.context for key in self._watches}))

    async def _read(self, watch: Watch) -> Observation | None:
        identity = self._engine.poller(watch.key)
        if identity is None:
            return None  # lingering: no stream holds it, so no credential to poll with
        return await self._looks.read(watch.key.kind, watch.key.uri, identity)

    def _apply(self, key: WatchKey, observation: Observation, ticket: int) -> None:
        watch = self._watches.get(key)
        if watch is None:
            return
        event = watch.offer(observation, ticket)
        if event is not None:
            self._spawn(self._bus.publish(event))

    # -- evidence and hints --------------------------------------------------------------------------------

    def after_forward(
        self, method: str, params: JsonObject, identity: Identity, answer: JsonObject, ticket: int
    ) -> None:
        """A forwarded request taught us something (see `sidecar.watch.engine.evidence`); a tools list shows which
        tools only read, and a call of one of those writes nothing (see `sidecar.watch.tool_calls`)."""
        if self._tool_calls.forwarded(method, params, identity.context, answer) and teaches(method):
            self._handle(Forwarded(method, params, identity, answer, ticket))

    def refused(self, method: str, params: JsonObject, identity: Identity) -> None:
        """The upstream refused `identity` a forwarded request (401/403) (see `sidecar.watch.engine.evidence`)."""
        self._handle(Refused(method, params, identity))

    def _poll_refused(self, watch: Watch, error: UpstreamHTTPError) -> None:
        self._handle(PollRefused(watch.key))

    def revalidate(self, identity: Identity) -> None:
        """Hint the public watches and this context's watches to poll soon (see `HintRouting`)."""
        self._hints.wrote(identity.context)

    def hint_source(self, hint: SourceHint) -> int:
        """The source says what changed: the watches it names look soon (see `HintRouting`); how many here."""
        return self._hints.source(hint)

    def _on_change(self, event: ChangeEvent) -> None:
        self._handle(ChangeHeard(event))

    def _upstream_recovered(self) -> None:
        # Every watch that failed during the outage re-reads now instead of waiting out its backoff (once).
        for watch in self.watches():
            watch.recover()

    # -- lifecycle -------------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        self._tasks.spawn(coro)

    async def aclose(self) -> None:
        self._unsubscribe()
        self._stop_adopting()
        self._stop_hearing_recovery()
        await self._native.aclose()
        self._hints.cancel()
        inflight = list(self._inflight)
        for task in inflight:
            task.cancel()
        self._waiters.cancel_all()
        self._engine.close()
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        watches = list(self._watches.values())
        self._watches.clear()
        await asyncio.gather(*inflight, *(watch.stop() for watch in watches), return_exceptions=True)
        await self._tasks.wait()
