"""Each watch's own state over time, as part of the engine: what its streams were last told, and when it polls.

The engine (`sidecar.watch.engine.core`) decides which watches exist and who holds them; this part keeps, in the
same records, what each watch has seen and its poll plan (`sidecar.watch.engine.polls`), and decides:
- which look is applied (the ticket rule, invariant 7), whether an error state waits for a second look
  (invariant 24), and whether what a look saw is a change to publish;
- what a change heard from the bus does to the watch (taken as its own: one generation, one writer);
- when it polls: the plan's timers, hints, recovery, the upstream's cover, the read budget's slots and
  intervals (`sidecar.watch.budget`, which it asks with its own time, and re-arms what an allocation tightened
  once the step is over).

Like the rest of the engine it never awaits and reads no clock: the registry runs each `StartPoll` and feeds back
how it went (`PollDone`, `PollFailed`, `PollSkipped`, `PollCrashed`, then `PollFinished`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import assert_never

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.config import PollingConfig
from sidecar.watch.budget import ReadBudget
from sidecar.watch.engine.commands import (
    BudgetShare,
    CancelTimer,
    Command,
    Observed,
    Publish,
    SetTimer,
    StartPoll,
    Waited,
)
from sidecar.watch.engine.confirm import Seen, Take
from sidecar.watch.engine.events import (
    Covered,
    Hinted,
    PollCrashed,
    PollDone,
    PollFailed,
    PollFinished,
    PollSkipped,
    TimerFired,
)
from sidecar.watch.engine.index import WatchIndex
from sidecar.watch.engine.polls import (
    Begin,
    Changed,
    Finished,
    Hint,
    Looked,
    Poll,
    PollEvent,
    PollPlan,
    Recover,
    Slotted,
    Stop,
    Tighten,
)
from sidecar.watch.engine.record import Record
from sidecar.watch.observation import Observation
from sidecar.watch.schedule import HintBudget, Schedule
from sidecar.watch.tickets import Latest

__all__ = ["WatchEvent", "Watching"]

WatchEvent = Hinted | Covered | PollDone | PollFailed | PollSkipped | PollCrashed | PollFinished
"""An event of one watch's polls."""


class Watching:
    """The watches' looks and polls, over the engine's records (see the module's docstring)."""

    def __init__(
        self,
        records: dict[WatchKey, Record],
        index: WatchIndex,
        polling: PollingConfig,
        *,
        settle_ms: int,
        rand: Callable[[], float],
        may_poll: Callable[[WatchKey], bool],
        replicas: Callable[[], int],
    ) -> None:
        self._records = records
        self._index = index
        """The order the watches started in: a recovery retries the failing ones in it."""
        self._ids = itertools.count(-1, -1)
        """The plans' timer ids: negative, so that they never meet the ids of the engine's looks and lingers."""
        self._schedule = Schedule(polling, rand, settle_ms=settle_ms)
        """Every watch's: intervals, backoff, and how long a hint keeps a watch warm (`hints.settle_ms`)."""
        self._hinted = HintBudget(polling.max_hinted_polls_per_s)
        reads: ReadBudget[Record] = ReadBudget(polling)
        self._reads = reads if reads.enabled else None
        self._may_poll = may_poll
        self._replicas = replicas
        """How many replicas share the read budget (the coordinator's answer; it writes nothing)."""
        """Whether this replica holds `key`'s lease now (the coordinator's answer; it writes nothing)."""
        self._timers: dict[int, WatchKey] = {}
        """The poll plans' armed timers, by id."""
        self._failing: dict[WatchKey, Record] = {}
        """The watches whose plan counts failed polls, kept as each look comes back: the only ones a recovery may
        retry, so that a recovery (after any one failed exchange, over HTTP) visits them, not every watch."""

    def owns_timer(self, timer: int) -> bool:
        return timer in self._timers

    # -- a watch's life ----------------------------------------------------------------------------------

    def start(
        self, record: Record, baseline: Observation, ticket: int, rule_ms: int | None, now: float
    ) -> list[Command]:
        """`record`'s watch starts from its first look (`baseline`, at `ticket`): its first poll an interval later."""
        record.fingerprint = baseline.fingerprint
        record.ttl_ms = baseline.ttl_ms
        record.latest = Latest(ticket)
        record.rule_interval_ms = rule_ms
        self._wanted(record)
        record.plan = PollPlan(
            self._schedule,
            interval=lambda at: self._interval(record, at),
            budget=self._hinted,
            started=now,
            ids=self._ids.__next__,
        )
        return self._feed(record, Begin(), now)

    def stop(self, record: Record, now: float) -> list[Command]:
        """`record`'s watch ended: nothing is armed again, and the read budget forgets it."""
        if self._reads is not None:
            self._reads.forget(record.key)
        commands = self._feed(record, Stop(), now)
        self._failed(record)  # stopped: nothing to retry
        return commands

    # -- looks -----------------------------------------------------------------------------------------------

    def apply(self, record: Record, observation: Observation, ticket: int, now: float) -> list[Command]:
        """A look that started at `ticket` saw `observation`: applied if it is the newest yet; a change, if it is."""
        if not record.latest.admit(ticket):
            return []
        if not observation.error:
            record.ttl_ms = observation.ttl_ms  # an error state has no ttlMs: the key keeps its interval
            self._wanted(record)
        # Before any change event exists: the cache never keeps an answer this look contradicts (an error state
        # not confirmed yet included).
        commands: list[Command] = [Observed(record.key, observation.fingerprint, ticket)]
        if record.confirmation.handle(Seen(record.fingerprint, observation.fingerprint), now) != [Take()]:
            commands.extend(self._feed(record, Hint(), now))  # the confirming look: soon, as a hinted one
            return commands
        if observation.fingerprint == record.fingerprint:
            return commands
        previous, record.fingerprint = record.fingerprint, observation.fingerprint
        record.generation += 1
        record.last_change_at = now
        commands.extend(self._feed(record, Changed(), now))  # a warm watch settles: what its hint announced is seen
        commands.append(Publish(record.key, record.fingerprint, record.generation, previous))
        return commands

    def adopt(self, change: ChangeEvent, now: float) -> list[Command]:
        """Another replica saw this change and told everyone (our streams too): taken as ours, so that our next
        poll, if we hold the lease then, does not tell it again (changes seen elsewhere keep this replica's copy
        current, for when it takes the lease). Events arrive in the bus's order; a local look newer than an event
        that arrives late costs at worst one repeated notification, never a lost one. A first look elsewhere
        (`baseline`) changed nothing for anyone watching."""
        record = self._records.get(change.key)
        if record is None or change.baseline:
            return []
        fingerprint = change.fingerprint
        record.confirmation.clear()
        if fingerprint == record.fingerprint:
            return []
        record.fingerprint = fingerprint
        record.generation += 1
        return self._feed(record, Changed(), now)

    # -- polls -----------------------------------------------------------------------------------------------

    def handle(self, event: WatchEvent, now: float) -> list[Command]:
        """What an event of one watch's polls asks for (nothing, for a watch that has ended)."""
        record = self._records.get(event.key)
        if record is None:
            return []
        if isinstance(event, Hinted):
            return self._feed(record, Hint(warm=event.warm), now)
        if isinstance(event, Covered):
            return self.cover(record, event.native, now)
        if isinstance(event, PollDone):
            record.last_poll_at = now
            return self.polled(record, event.started, event.ticket, event.observation, now)
        if isinstance(event, PollFailed | PollCrashed):  # a crash counts as a failed poll, from its own start
            return self._feed(record, Looked(event.started, False), now)
        if isinstance(event, PollSkipped):  # nobody to poll for: neither a success nor a failure
            return self._feed(record, Looked(event.started, None), now)
        if isinstance(event, PollFinished):
            return self._feed(record, Finished(), now)
        assert_never(event)

    def recover(self, now: float) -> list[Command]:
        """The upstream answers again: each failing watch retries now (once per failure streak), in the order the
        watches started (the order of the records: which of them takes which slot of the hinted polls' budget)."""
        commands: list[Command] = []
        for key in self._index.ordered(self._failing):  # a closed engine's records are indexed no more
            commands.extend(self._feed(self._failing[key], Recover(), now))
        return commands

    def cover(self, record: Record, native: bool, now: float) -> list[Command]:
        """Covered by the upstream's notifications or not; losing the cover polls now (what changed meanwhile was
        not told)."""
        if native == record.native:
            return []
        record.native = native
        self._wanted(record)
        return [] if native else self._feed(record, Hint(), now)

    def fired(self, timer: int, now: float) -> list[Command]:
        key = self._timers.pop(timer)
        record = self._records.get(key)
        if record is None:
            return []
        return self._feed(record, TimerFired(timer), now)

    def polled(self, record: Record, started: float, ticket: int, seen: Observation, now: float) -> list[Command]:
        """The poll that started at `started` saw `seen` (an error state too: the upstream answered)."""
        assert record.plan is not None
        previous = record.plan.last_start
        commands = self._feed(record, Looked(started, True), now)
        applied = self.apply(record, seen, ticket, now)
        if self._reads is not None:
            changed = any(isinstance(command, Publish) for command in applied)
            self._reads.polled(record.key, changed, started - previous)
        return commands + applied

    def tighten(self, now: float) -> list[Command]:
        """The watches whose interval the read budget's allocations shortened during this step come sooner."""
        if self._reads is None:
            return []
        commands: list[Command] = []
        for record in self._reads.take_tightened():
            if record.plan is not None and record.plan.tightenable and self._records.get(record.key) is record:
                commands.extend(self._feed(record, Tighten(), now))
        return commands

    # -- the plans' commands, turned into the engine's -----------------------------------------------------

    def _feed(self, record: Record, event: PollEvent, now: float) -> list[Command]:
        assert record.plan is not None
        planned = record.plan.handle(event, now)
        if isinstance(event, Looked):  # the one event that changes its count of failed polls
            self._failed(record)
        commands: list[Command] = []
        for command in planned:
            if isinstance(command, SetTimer):
                self._timers[command.timer] = record.key
                commands.append(command)
            elif isinstance(command, CancelTimer):
                self._timers.pop(command.timer, None)
                commands.append(command)
            elif isinstance(command, Poll):
                commands.extend(self._poll(record, command, now))
            else:
                commands.append(command)
        return commands

    def _poll(self, record: Record, poll: Poll, now: float) -> list[Command]:
        if not poll.slotted:
            if not self._may_poll(record.key):  # another replica holds the lease: look again later
                return self._feed(record, Looked(now, None), now) + self._feed(record, Finished(), now)
            if self._reads is not None:
                # Every poll takes a slot of the read budget, hinted ones too (invariant 21); over it, it waits
                # for its slot: a timer of the plan's.
                replicas = self._replicas()
                slot = self._reads.slot(now, hinted=poll.hinted, replicas=replicas)
                commands: list[Command] = [BudgetShare(self._reads.per_s(replicas))]
                if slot > now:
                    commands.append(Waited("read_budget", slot - now))
                    return commands + self._feed(record, Slotted(slot), now)
                return [*commands, StartPoll(record.key, poll.due, poll.hinted)]
        return [StartPoll(record.key, poll.due, poll.hinted)]

    def _interval(self, record: Record, now: float) -> float:
        """`record`'s regular interval at `now` (its plan asks with the time of the event it handles)."""
        if (reads := self._reads) is not None:
            if reads.stale(record.key, now, counted=self._counted(record)):
                polled = (held for held in self._records.values() if self._counted(held))
                reads.allocate(now, polled, self._replicas())
            interval_s = self._schedule.budgeted_s(reads.interval_ms(record))
        elif record.native:
            interval_s = self._schedule.backstop_s(record.ttl_ms, record.rule_interval_ms)
        else:
            interval_s = self._schedule.interval_s(record.ttl_ms, record.rule_interval_ms)
        record.interval_s = interval_s
        return interval_s

    def _failed(self, record: Record) -> None:
        """Keeps `record` among the failing watches while its plan counts failed polls (and has not stopped)."""
        plan = record.plan
        if plan is not None and plan.errors and not plan.stopped:
            self._failing[record.key] = record
        elif self._failing.get(record.key) is record:
            del self._failing[record.key]

    def _counted(self, record: Record) -> bool:
        """Whether the read budget's allocation counts `record`: held, and this replica's to poll."""
        return record.holders > 0 and self._may_poll(record.key)

    def _wanted(self, record: Record) -> None:
        record.wanted_ms = self._schedule.wanted_ms(record.ttl_ms, record.rule_interval_ms, native=record.native)
