"""When one watch polls, as pure state: its interval, backoff, hints and their budget, recovery (`PollPlan`).

The rules of `sidecar.watch.schedule` applied over time: the next poll one interval after the last one started,
exponential backoff while it fails, a hinted poll soon (never sooner than min_interval_ms after the last, nor
than a backoff allows, within the budget of hinted polls), then, while the hint keeps the watch warm and no look
has seen a change, more hinted polls 0.25, 0.5, 1, 2 s... after it (the same floors and budget), one retry per
failure streak once the upstream is back. Like the registry's engine it never awaits and reads no clock: each
event comes with the time it happened, and its timers are commands (`SetTimer`, `CancelTimer`). The watch engine
(`sidecar.watch.engine.watching`) holds one plan per watch: it has the registry arm the plan's timers and feeds
`TimerFired` back; a fired timer asks for a `Poll`, which the engine turns into a `StartPoll` for the registry,
whose look comes back as `Looked` and `Finished` (or, when the read budget has no slot free yet, as `Slotted`: a
timer for the slot, and the poll then). Nothing happens between two of its steps, so a hint can never find the
poll half-started.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from sidecar.watch.engine.commands import CancelTimer, Interval, SetTimer, Waited
from sidecar.watch.engine.events import TimerFired
from sidecar.watch.schedule import HintBudget, Schedule

__all__ = [
    "Begin",
    "Changed",
    "Finished",
    "Hint",
    "LogLimiter",
    "Looked",
    "Poll",
    "PollCommand",
    "PollEvent",
    "PollPlan",
    "Recover",
    "Slotted",
    "Stop",
    "Tighten",
]


@dataclass(frozen=True, slots=True)
class Begin:
    """The watch starts from its baseline (read at the plan's start): its first poll is an interval later."""


@dataclass(frozen=True, slots=True)
class Hint:
    """Something suggests the key changed (a write, the upstream's notification, a lost cover): poll soon. A `warm`
    hint (a write, the upstream's notification, the source's) keeps the watch warm: its look seeing no change is
    not the end, since a source may show a write a moment after it is made. The latest warm hint of a burst
    restarts the schedule (its looks count from it, and it ends settle_ms after it): a burst is one schedule."""

    warm: bool = False


@dataclass(frozen=True, slots=True)
class Changed:
    """A look at the key (a poll's, or a client's read applied to the watch) saw it change: a warm watch settles."""


@dataclass(frozen=True, slots=True)
class Recover:
    """The upstream answers again: a failing watch retries now, once per failure streak."""


@dataclass(frozen=True, slots=True)
class Tighten:
    """The read budget gave the key a shorter interval: its next poll comes that much after its last."""


@dataclass(frozen=True, slots=True)
class Looked:
    """The poll's look, which started at `started`, is back: `ok` True (answered), False (failed), None (nobody to
    poll for, or another replica holds the lease: neither a success nor a failure)."""

    started: float
    ok: bool | None


@dataclass(frozen=True, slots=True)
class Slotted:
    """The poll took a slot of the read budget at `slot`, later than now: it runs then (still in flight until)."""

    slot: float


@dataclass(frozen=True, slots=True)
class Finished:
    """The poll is over (its change, if any, published): the next one is armed."""


@dataclass(frozen=True, slots=True)
class Stop:
    """The watch ends: nothing is armed again."""


PollEvent = Begin | Hint | Changed | Recover | Tighten | TimerFired | Slotted | Looked | Finished | Stop


@dataclass(frozen=True, slots=True)
class Poll:
    """Poll now; it was due at `due` (a `hinted` poll, or a regular one), and is `slotted` when it waited for its
    slot of the read budget already. Answered by Looked, then Finished (or Slotted)."""

    due: float
    hinted: bool
    slotted: bool = False


PollCommand = SetTimer | CancelTimer | Poll | Waited | Interval


class PollPlan:
    """One watch's poll schedule. `interval` says its regular interval at a time (jittered, under the read budget);
    `budget`, shared by every watch of one upstream, spaces hinted polls; `ids` numbers its timers (the engine's
    one counter, so that a timer's id names one plan)."""

    __slots__ = (
        "_budget",
        "_due",
        "_due_hinted",
        "_hinted",
        "_ids",
        "_interval",
        "_next_id",
        "_recovery_retried",
        "_schedule",
        "_slotted",
        "_timer",
        "_timer_when",
        "_warm_from",
        "errors",
        "last_start",
        "polling",
        "stopped",
    )

    def __init__(
        self,
        schedule: Schedule,
        *,
        interval: Callable[[float], float],
        budget: HintBudget | None,
        started: float,
        ids: Callable[[], int] | None = None,
    ) -> None:
        self._schedule = schedule
        self._interval = interval
        self._budget = budget
        self.last_start = started
        """When the last poll (or the baseline) started: intervals and the hint floor count from it."""
        self.errors = 0
        """Consecutive failed polls: the backoff's step."""
        self.polling = False
        """A poll is in flight: from its timer's firing (a hint in between must find it) to Finished."""
        self.stopped = False
        self._due = started
        self._due_hinted = False
        self._timer: int | None = None
        self._timer_when = 0.0
        self._ids = itertools.count(1)
        self._next_id = ids if ids is not None else self._ids.__next__
        self._hinted = False
        """A hint came while a poll was in flight (which may predate the write): one more after it."""
        self._recovery_retried = False
        self._slotted = False
        """The armed timer is the slot of the read budget a poll waits for (the poll in flight meanwhile)."""
        self._warm_from: float | None = None
        """When the latest warm hint came, while the watch is warm (no look since saw a change, settle_ms not past)."""

    @property
    def warm(self) -> bool:
        """A hint keeps it looking again soon while its looks see no change."""
        return self._warm_from is not None

    def handle(self, event: PollEvent, now: float) -> list[PollCommand]:
        """What `event`, which happened at `now`, asks for."""
        commands: list[PollCommand] = []
        if isinstance(event, Begin):
            self._arm(self.last_start + self._interval(now), commands)
        elif isinstance(event, Hint):
            if event.warm and self._schedule.settle_s > 0 and not self.stopped:
                self._warm_from = now  # a hint in a warm schedule restarts it: one schedule per burst
            if not self.errors:  # backing off: the next poll is already as early as a failing upstream should see it
                self._poll_soon(now, commands)
        elif isinstance(event, Changed):
            self._warm_from = None  # seen: what the hint announced has arrived (a look armed already still runs)
        elif isinstance(event, Recover):
            # Once per failure streak: when only this key fails while other requests succeed, the upstream
            # "recovers" after every failure of it, and a retry each time would poll it every min_interval_ms.
            if self.errors and not self._recovery_retried:
                self._recovery_retried = True
                self._poll_soon(now, commands)
        elif isinstance(event, Tighten):
            self._tighten(now, commands)
        elif isinstance(event, TimerFired):
            if event.timer == self._timer:
                self._timer = None
                self.polling = True
                commands.append(Poll(self._due, self._due_hinted, self._slotted))
                self._slotted = False
        elif isinstance(event, Slotted):
            # Its due time and kind stay the poll's (its lag counts from when it was due, not from its slot).
            self._slotted = True
            self._set(event.slot, commands)
        elif isinstance(event, Looked):
            self.last_start = event.started
            if event.ok:
                self.errors = 0
                self._recovery_retried = False
            elif event.ok is False:
                self.errors += 1
        elif isinstance(event, Finished):
            self._finished(now, commands)
        elif isinstance(event, Stop):
            self.stopped = True
            self._cancel(commands)
        else:
            assert_never(event)
        return commands

    @property
    def tightenable(self) -> bool:
        """Whether a shorter interval would move its next poll: a regular one is armed (not a backoff's, not a
        hinted one)."""
        return self._timer is not None and not self.polling and not self.errors and not self._due_hinted

    def _tighten(self, now: float, commands: list[PollCommand]) -> None:
        if self.tightenable:
            due = max(self.last_start + self._interval(now), now)
            if self._timer is not None and due < self._timer_when:
                self._arm(due, commands)

    def _finished(self, now: float, commands: list[PollCommand]) -> None:
        self.polling = False
        if self.stopped:
            return
        if self.errors:
            delay = self._schedule.backoff_s(self.errors)
        else:
            delay = self._interval(now)
            commands.append(Interval(delay))
        hinted, self._hinted = self._hinted and not self.errors, False
        self._arm(self.last_start + delay, commands)
        if hinted:
            self._arm_hinted(now, self.last_start + delay, commands)
        elif not self.errors:  # a failing upstream waits out its backoff, warm or not
            self._arm_warm(now, self.last_start + delay, commands)

    def _arm_warm(self, now: float, scheduled: float, commands: list[PollCommand]) -> None:
        """Still warm, this look saw no change: the next look of the hint's schedule, as a hinted poll."""
        if self._warm_from is None:
            return
        wanted = self._schedule.warm_look(self._warm_from, after=self.last_start)
        if wanted is None:
            self._warm_from = None  # settled: settle_ms passed with no change seen
            return
        self._arm_hinted(now, scheduled, commands, earliest=wanted)

    def _poll_soon(self, now: float, commands: list[PollCommand]) -> None:
        if self.stopped:
            return
        if self.polling:
            self._hinted = True
            return
        self._arm_hinted(now, self._timer_when if self._timer is not None else None, commands)

    def _arm_hinted(
        self, now: float, scheduled: float | None, commands: list[PollCommand], *, earliest: float | None = None
    ) -> None:
        # A hinted poll: not sooner than min_interval_ms after the last one (nor than `earliest`, a warm look's
        # time), jittered (a burst of hints across many watches, or the recovery after an outage, must not fire
        # them all in one instant), and within the upstream's budget of hinted polls. A regular poll already due
        # sooner is left alone.
        floor = self.last_start + self._schedule.min_interval_s
        if earliest is not None:
            floor = max(floor, earliest)
        due = max(floor, now) + self._schedule.hint_jitter_s(now, waits=floor > now)
        if scheduled is not None and scheduled <= due:
            return
        slot = self._budget.slot(due) if self._budget is not None else due
        if slot > due:
            commands.append(Waited("hinted_polls", slot - due))  # deferred, never dropped
        if scheduled is None or slot < scheduled:
            self._arm(slot, commands, hinted=True)

    def _arm(self, due: float, commands: list[PollCommand], *, hinted: bool = False) -> None:
        self._cancel(commands)
        self._due = due
        self._due_hinted = hinted
        self._set(due, commands)

    def _set(self, when: float, commands: list[PollCommand]) -> None:
        timer = self._next_id()
        self._timer, self._timer_when = timer, when
        commands.append(SetTimer(timer, when))

    def _cancel(self, commands: list[PollCommand]) -> None:
        if self._timer is not None:
            commands.append(CancelTimer(self._timer))
            self._timer = None


class LogLimiter:
    """Allows one line per interval, on the time it is given: an outage with thousands of failing watches logs a
    line every `interval_s`, not one per watch."""

    __slots__ = ("_interval_s", "_last")

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._last = -interval_s

    def allow(self, now: float) -> bool:
        if now - self._last >= self._interval_s:
            self._last = now
            return True
        return False
