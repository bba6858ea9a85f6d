"""One watch and the loop that keeps it fresh: our Reflector, the only caller of the upstream for its key.

Target load: one read per key per interval (ttlMs clamped to [min, max], +/- jitter), and while the upstream
fails backoff, both as its `Schedule` (`sidecar.watch.schedule`) says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from sidecar.changes import ChangeEvent, LocalCoordinator, PollCoordinator, WatchKey
from sidecar.identity import PUBLIC
from sidecar.observability.metrics import Metrics
from sidecar.observability.tracing import MAX_LINKS, tracing
from sidecar.protocol.errors import UpstreamError, UpstreamHTTPError
from sidecar.watch.budget import ReadBudget
from sidecar.watch.clock import LOOP_CLOCK, Clock, Timer
from sidecar.watch.engine.commands import CancelTimer, SetTimer
from sidecar.watch.engine.confirm import ErrorConfirmation, Seen, Take
from sidecar.watch.engine.events import TimerFired
from sidecar.watch.engine.polls import (
    Begin,
    Changed,
    Finished,
    Hint,
    Interval,
    LogLimiter,
    Looked,
    Poll,
    PollEvent,
    PollPlan,
    Recover,
    Slotted,
    Stop,
    Tighten,
    Waited,
)
from sidecar.watch.observation import Observation
from sidecar.watch.schedule import HintBudget, Schedule
from sidecar.watch.tickets import Latest, Tickets

if TYPE_CHECKING:
    from opentelemetry.trace import Link

__all__ = ["ObservationListener", "Watch"]

logger = logging.getLogger(__name__)

Reader = Callable[["Watch"], Awaitable[Observation | None]]
"""Looks at the upstream for a watch; None means there is nobody to poll for (no credential held)."""
Sink = Callable[[ChangeEvent], Awaitable[None]]
ObservationListener = Callable[[WatchKey, str, int], None]
"""(key, fingerprint, ticket): a look at the upstream was applied (the cache drops what it contradicts)."""
AuthFailure = Callable[["Watch", UpstreamHTTPError], None]

_HOLD_BEFORE_PUBLISH = os.environ.get("MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH") == "1"
"""Test seam: the replica tests kill an owner between seeing a change and publishing it. A poll that saw a
change logs that it holds it and waits for ever (for the kill). Unset in every real deployment."""


async def _hold() -> None:
    logger.warning("holding a change before publishing it (MCP_SIDECAR_TEST_HOLD_BEFORE_PUBLISH)")
    await asyncio.get_running_loop().create_future()


_ERROR_LOG_INTERVAL_S = 10.0
_error_log_limiter = LogLimiter(_ERROR_LOG_INTERVAL_S)


class Watch:
    """A polled key: its last fingerprint and generation, and the driver of its poll schedule.

    When it polls is its `PollPlan`'s (`sidecar.watch.engine.polls`), which never awaits; the watch arms the plan's
    timers on the clock, runs the polls it asks for and reports how each went.

    Ticket rule (invariant 7, kept by `sidecar.watch.tickets`): its polls are ticketed as they start,
    and an observation is applied only if its look is newer than every look applied so far, so a slow poll, a
    baseline read or a forwarded client read that started earlier never overwrites a fresher one.
    """

    def __init__(
        self,
        key: WatchKey,
        baseline: Observation,
        ticket: int,
        *,
        schedule: Schedule,
        reader: Reader,
        sink: Sink,
        gate: asyncio.Semaphore,
        tickets: Tickets,
        metrics: Metrics,
        on_auth_failure: AuthFailure,
        coordinator: PollCoordinator | None = None,
        observed: ObservationListener = lambda key, fingerprint, ticket: None,
        budget: HintBudget | None = None,
        clock: Clock = LOOP_CLOCK,
        rule_interval_ms: int | None = None,
        reads: ReadBudget[Watch] | None = None,
        holders: Callable[[WatchKey], int] = lambda key: 0,
    ) -> None:
        self.key = key
        self.fingerprint = baseline.fingerprint
        self.ttl_ms = baseline.ttl_ms
        self.generation = 0
        """Its changes as this process counts them (its own and those adopted): the generation its events carry on a
        bus of one process (the Redis bus numbers a key's changes by its stored state instead)."""
        self.last_poll_at: float | None = None
        self.last_change_at: float | None = None
        self.native = False
        """The upstream's own notifications cover this key: it polls at once on them, and as a backstop."""
        self.rule_interval_ms = rule_interval_ms
        """The interval `polling.rules` gives this key instead of its ttlMs."""
        self._holders = holders
        """The engine's count of the streams holding each key (the one count: see `sidecar.watch.engine`)."""
        self._latest = Latest(ticket)
        self._confirmation = ErrorConfirmation()
        """The error state a poll saw that a second look must confirm before anyone is told (invariant 24)."""
        self._schedule = schedule
        self._reader = reader
        self._sink = sink
        self._gate = gate
        self._tickets = tickets
        self._metrics = metrics
        self._on_auth_failure = on_auth_failure
        self._observed = observed
        self._reads = reads if reads is not None and reads.enabled else None
        self._clock = clock
        self._coordinator: PollCoordinator = coordinator or LocalCoordinator()
        self._plan = PollPlan(schedule, interval=self.interval_at, budget=budget, started=clock.now())
        self._timer: Timer | None = None
        self._timer_id = 0
        self._task: asyncio.Task[None] | None = None
        self._links: list[Link] = []
        """Traced writes whose hints the next poll answers (tracing on only)."""
        self._poll_ok = metrics.polls.labels(key.kind, "ok")
        self._poll_error_state = metrics.polls.labels(key.kind, "error_state")
        self._poll_error = metrics.polls.labels(key.kind, "error")
        self._poll_duration = metrics.poll_duration.labels(key.kind)
        self._poll_changed = metrics.poll_changes.labels(key.kind)

    @property
    def refs(self) -> int:
        """How many streams hold it."""
        return self._holders(self.key)

    @property
    def consecutive_errors(self) -> int:
        return self._plan.errors

    @property
    def wanted_ms(self) -> float:
        """Its interval before jitter, were there no read budget."""
        return self._schedule.wanted_ms(self.ttl_ms, self.rule_interval_ms, native=self.native)

    @property
    def interval_s(self) -> float:
        """Its regular interval now (jittered, under the read budget)."""
        return self.interval_at(self._clock.now())

    def interval_at(self, now: float) -> float:
        """Its regular interval at `now` (the plan asks with the time of the event it handles)."""
        if self._reads is not None:
            return self._schedule.budgeted_s(self._reads.interval_ms(self, now))
        if self.native:
            return self._schedule.backstop_s(self.ttl_ms, self.rule_interval_ms)
        return self._schedule.interval_s(self.ttl_ms, self.rule_interval_ms)

    def set_native(self, native: bool) -> None:
        """Covered by the upstream's notifications or not; losing the cover polls now (what changed meanwhile was
        not told)."""
        if native == self.native:
            return
        self.native = native
        if not native:
            self.hint()

    def offer(self, observation: Observation, ticket: int) -> ChangeEvent | None:
        """Apply an observation that started at `ticket`; returns the change event, if it is one."""
        if not self._latest.admit(ticket):
            return None
        if not observation.error:
            self.ttl_ms = observation.ttl_ms  # an error state has no ttlMs: the key keeps its interval
        # Synchronously, before any event exists: the cache never keeps an answer this look contradicts (an error
        # state not confirmed yet included).
        self._observed(self.key, observation.fingerprint, ticket)
        if self._confirmation.handle(Seen(self.fingerprint, observation.fingerprint), self._clock.now()) != [Take()]:
            self._feed(Hint())  # the confirming look: soon, as a hinted one (after this poll, when it is one)
            return None
        if observation.fingerprint == self.fingerprint:
            return None
        previous, self.fingerprint = self.fingerprint, observation.fingerprint
        self.generation += 1
        self.last_change_at = time.time()
        self._metrics.changes.labels(self.key.kind).inc()
        logger.info(
            "change detected",
            extra={
                "watch": self.key.short_hash,
                "kind": self.key.kind,
                "generation": self.generation,
                "old": previous[:8],
                "new": self.fingerprint[:8],
            },
        )
        self._feed(Changed())  # a warm watch settles: what its hint announced has been seen
        return ChangeEvent(self.key, self.fingerprint, self.generation, self.last_change_at)

    def adopt(self, fingerprint: str) -> None:
        """Another replica saw this change and told everyone (our streams too): take it as ours, so that our next
        poll, if we hold the lease then, does not tell it again. Events arrive in the bus's order; a local look
        newer than an event that arrives late costs at worst one repeated notification, never a lost one."""
        self._confirmation.clear()
        if fingerprint != self.fingerprint:
            self.fingerprint = fingerprint
            self.generation += 1
            self._feed(Changed())

    def hint(self, links: Sequence[Link] = (), *, warm: bool = False) -> None:
        """Poll soon (when, the plan says: never sooner than min_interval_ms after the last poll, nor than a backoff
        allows; hints coalesce into at most one extra poll). `links`: the traced writes that asked for it, which
        the next poll's span links to. `warm`: a hint that something was written (a write, the upstream's or the
        source's word), after which the watch looks again a few times while it sees no change (`hints.settle_ms`);
        a hint of the sidecar's own (a lost cover, a lease taken) asks for one look."""
        if links and len(self._links) < MAX_LINKS:
            self._links.extend(links[: MAX_LINKS - len(self._links)])
        self._feed(Hint(warm=warm))

    def tighten(self) -> None:
        """The read budget gave this key a shorter interval: its next poll comes that much after its last."""
        if self._plan.tightenable:
            self._feed(Tighten())

    def recover(self) -> None:
        """The upstream answers again: a failing watch retries now instead of waiting out its backoff (once per
        failure streak)."""
        self._feed(Recover())

    def start(self) -> None:
        """Schedule the first poll one interval after the baseline (which was just read)."""
        self._feed(Begin())

    async def stop(self) -> None:
        self._feed(Stop())
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the plan's commands, carried out --------------------------------------------------------------------

    def _feed(self, event: PollEvent) -> None:
        for command in self._plan.handle(event, self._clock.now()):
            if isinstance(command, SetTimer):
                # An idle watch is one timer entry, not a sleeping task: thousands of watches stay cheap.
                self._timer_id = command.timer
                self._timer = self._clock.call_at(command.when, self._fire)
            elif isinstance(command, CancelTimer):
                if self._timer is not None and command.timer == self._timer_id:
                    self._timer.cancel()
                    self._timer = None
            elif isinstance(command, Poll):
                self._task = asyncio.get_running_loop().create_task(self._cycle(command))
            elif isinstance(command, Waited):
                self._metrics.queue_wait.labels(command.limit).observe(command.seconds)
            elif isinstance(command, Interval):
                self._metrics.poll_interval.observe(command.seconds)
        if self._reads is not None:
            # The plan's step is over: the watches an allocation made during it shortened are re-armed now (this
            # one too), not from inside the allocation.
            for watch in self._reads.take_tightened():
                watch.tighten()

    def _fire(self) -> None:
        self._timer = None
        # In flight from now (the plan's Poll), not from the task's first step a loop turn later.
        self._feed(TimerFired(self._timer_id))

    async def _cycle(self, poll: Poll) -> None:
        try:
            if poll.slotted or self._coordinator.may_poll(self.key):
                if self._reads is not None and not poll.slotted:
                    if self._wait_for_slot(poll.hinted):
                        return  # its slot's timer polls
                await self.poll_once(poll.due)
            else:
                self._feed(Looked(self._clock.now(), None))  # another replica holds the lease; look again later
        except Exception:  # boundary: a bug in one poll must not stop this watch for good
            logger.exception("poll crashed", extra={"watch": self.key.short_hash, "kind": self.key.kind})
            self._feed(Looked(self._plan.last_start, False))
        finally:
            self._task = None
        self._feed(Finished())

    def _wait_for_slot(self, hinted: bool) -> bool:
        # Every poll takes a slot of the read budget, hinted ones too (invariant 21); over it, it waits its slot:
        # a timer of the plan's, not a sleep.
        assert self._reads is not None
        now = self._clock.now()
        slot = self._reads.slot(now, hinted=hinted)
        self._metrics.read_budget.set(self._reads.per_s())
        if slot <= now:
            return False
        self._metrics.queue_wait.labels("read_budget").observe(slot - now)
        self._feed(Slotted(slot))
        return True

    async def poll_once(self, due: float) -> None:
        links, self._links = self._links, []
        key = self.key
        uri = key.uri if key.context == PUBLIC else None  # a private URI can name a person: only its hash
        with tracing().poll(key.kind, key.short_hash, uri, links):
            await self._poll_once(due)

    async def _poll_once(self, due: float) -> None:
        queued_at = self._clock.now() if self._gate.locked() else None
        async with self._gate:
            started = self._clock.now()
            if queued_at is not None:  # waited for polling.max_concurrency: a wait, not a refusal
                self._metrics.queue_wait.labels("poll_concurrency").observe(started - queued_at)
            previous = self._plan.last_start
            self._metrics.poll_lag.observe(max(0.0, started - due))
            try:
                ticket, observation = await self._tickets.look(lambda: self._reader(self))
            except UpstreamError as exc:
                self._feed(Looked(started, False))
                self._failed(exc)
                return
            except Exception:
                self._feed(Looked(started, None))  # a crash still started a poll: its backoff counts from it
                raise
            finally:
                self._poll_duration.observe(self._clock.now() - started)
        if observation is None:
            self._feed(Looked(started, None))
            return
        self.last_poll_at = time.time()
        self._feed(Looked(started, True))  # an error state too: the upstream answered (no backoff, readiness kept)
        (self._poll_error_state if observation.error else self._poll_ok).inc()
        event = self.offer(observation, ticket)
        if self._reads is not None:
            self._reads.polled(self.key, event is not None, started - previous)
        if event is not None:
            self._poll_changed.inc()
            if _HOLD_BEFORE_PUBLISH:
                await _hold()
            with tracing().change(self.key.kind, self.key.short_hash, event.generation):
                await self._sink(event)

    def _failed(self, exc: UpstreamError) -> None:
        self._poll_error.inc()
        if isinstance(exc, UpstreamHTTPError) and exc.is_auth_failure:
            self._on_auth_failure(self, exc)
            return
        # Expected failures (upstream down) log at info, others at warning; at most one line per interval
        # for all watches together, so an outage with thousands of watches stays readable.
        if self.consecutive_errors == 1 and _error_log_limiter.allow(time.monotonic()):
            level = logging.INFO if exc.is_transport_failure else logging.WARNING
            logger.log(
                level,
                "poll failed; backing off",
                extra={"watch": self.key.short_hash, "kind": self.key.kind, "reason": exc.reason},
            )
