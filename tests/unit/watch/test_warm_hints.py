"""A hint holds the watch warm: playbooks of its `PollPlan` after a warm hint (`hints.settle_ms`), then of the
engine that holds the plan, its polls answered by a source that shows a write late.

A write, the upstream's notification or the source's `POST /hints` makes the watch look at once; when that look
sees no change (a source whose reads lag its writes, one that re-indexes after a save), it looks again 0.25, 0.5,
1 and 2 s after the hint and at settle_ms, until a look sees a change or settle_ms has passed. Each of those looks
is a hinted poll: min_interval_ms after the last, jittered, within the budget of hinted polls, never during a
backoff. The latest hint of a burst restarts the schedule, so a burst costs one schedule.

Every poll here looks at once and is over at once; the test says which looks see a change.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sidecar.changes import WatchKey
from sidecar.config import PollingConfig
from sidecar.watch.engine import Engine
from sidecar.watch.engine.commands import BudgetShare, CancelTimer, SetTimer, Waited
from sidecar.watch.engine.events import Hinted, TimerFired, Wrote
from sidecar.watch.engine.polls import (
    Begin,
    Changed,
    Finished,
    Hint,
    Looked,
    Poll,
    PollCommand,
    PollEvent,
    PollPlan,
)
from sidecar.watch.observation import Observation
from sidecar.watch.rules import Rules
from sidecar.watch.schedule import HintBudget, Schedule
from tests.kit.playbook import Playbook
from tests.unit.watch.engine_cast import ALICE
from tests.unit.watch.engine_polls import Polled

CONFIG = PollingConfig(
    default_interval_ms=30_000,
    min_interval_ms=250,
    max_interval_ms=60_000,
    jitter=0.1,
    backoff_initial_ms=1000,
    backoff_max_ms=8000,
)
INTERVAL_S = 30.0
SETTLE_MS = 3000
SPREAD_S = 0.5 * CONFIG.jitter * CONFIG.min_interval_ms / 1000
"""rand() = 0.5: a hinted poll that waits (out min_interval_ms, or for its warm time) is jittered by this much."""
HINT_AT = 10.0

Book = Playbook[PollEvent, PollCommand]


class Run:
    """One watch's plan, driven: the timers it arms fire in order, and each poll they ask for looks at once."""

    def __init__(
        self,
        *,
        settle_ms: int = SETTLE_MS,
        config: PollingConfig = CONFIG,
        budget: HintBudget | None = None,
    ) -> None:
        schedule = Schedule(config, rand=lambda: 0.5, settle_ms=settle_ms)
        self.play = Book(PollPlan(schedule, interval=lambda now: INTERVAL_S, budget=budget, started=0.0))
        self.armed: dict[int, float] = {}
        self.polls: list[float] = []
        self.waited: list[Waited] = []
        self.hinted: list[bool] = []
        self._feed(Begin())

    def _feed(self, event: PollEvent) -> None:
        for command in self.play.feed(event):
            if isinstance(command, SetTimer):
                self.armed[command.timer] = command.when
            elif isinstance(command, CancelTimer):
                self.armed.pop(command.timer, None)
            elif isinstance(command, Waited):
                self.waited.append(command)

    def hint(self, at: float, *, warm: bool = True) -> None:
        self.play.at(at)
        self._feed(Hint(warm=warm))

    def until(self, until: float, *, sees: Callable[[float], bool] = lambda started: False, ok: bool = True) -> None:
        """Fire every timer due by `until`; a poll starting at t sees a change when `sees(t)` (and fails unless
        `ok`)."""
        while self.armed and min(self.armed.values()) <= until:
            timer, when = min(self.armed.items(), key=lambda item: item[1])
            del self.armed[timer]
            self.play.at(when)
            [poll] = self.play.feed(TimerFired(timer))
            assert isinstance(poll, Poll)
            self.polls.append(when)
            self.hinted.append(poll.hinted)
            self._feed(Looked(when, ok))
            if ok and sees(when):
                self._feed(Changed())
            self._feed(Finished())
        self.play.at(until)

    def next_poll(self) -> float:
        return min(self.armed.values())


def _at(*seconds: float) -> list[float]:
    return pytest.approx(list(seconds))  # type: ignore[return-value]  # times summed from jittered figures


def test_a_hint_looks_at_once_then_at_the_warm_offsets_until_settle_ms() -> None:
    run = Run()
    run.hint(HINT_AT)
    run.until(20.0)
    # At once (past min_interval_ms, the only hint of its spread), then 0.25, 0.5, 1, 2 and 3 s after the hint,
    # each a hinted poll, jittered as one that waits (the 0.5 s look min_interval_ms after the jittered 0.25 s).
    warm = [HINT_AT + offset + SPREAD_S for offset in (0.25, 0.5 + SPREAD_S, 1.0, 2.0, 3.0)]
    assert run.polls == _at(HINT_AT, *warm)
    assert all(run.hinted)
    assert run.next_poll() == pytest.approx(warm[-1] + INTERVAL_S), "settled: the interval from its last look"
    assert not run.play.engine.warm  # type: ignore[attr-defined]


def test_a_look_that_sees_the_change_ends_the_warm_schedule() -> None:
    run = Run()
    run.hint(HINT_AT)
    run.until(20.0, sees=lambda started: started >= HINT_AT + 0.9)  # the source shows the write ~1 s late
    assert run.polls == _at(HINT_AT, HINT_AT + 0.25 + SPREAD_S, HINT_AT + 0.5 + 2 * SPREAD_S, HINT_AT + 1 + SPREAD_S)
    assert run.next_poll() == pytest.approx(HINT_AT + 1 + SPREAD_S + INTERVAL_S)


def test_a_change_seen_at_once_costs_one_look_as_without_settling() -> None:
    run = Run()
    run.hint(HINT_AT)
    run.until(20.0, sees=lambda started: True)
    assert run.polls == [HINT_AT]


def test_settle_ms_0_and_the_sidecars_own_hints_ask_for_one_look() -> None:
    cold = Run(settle_ms=0)
    cold.hint(HINT_AT)
    cold.until(20.0)
    assert cold.polls == [HINT_AT]
    own = Run()
    own.hint(HINT_AT, warm=False)  # a lost cover, a lease taken: nothing was written
    own.until(20.0)
    assert own.polls == [HINT_AT]


def test_a_burst_of_hints_costs_one_schedule_counted_from_its_latest_hint() -> None:
    lone = Run()
    lone.hint(HINT_AT)
    lone.until(20.0)
    assert len(lone.polls) == 6
    burst = Run()
    for _ in range(20):  # one write hinting through every route at once, or writes while the first look is out
        burst.hint(HINT_AT)
    burst.until(20.0)
    assert burst.polls == lone.polls
    spread = Run()
    for n in range(20):  # 20 writes over 0.19 s, the first looked at at once
        spread.hint(HINT_AT + n * 0.01)
        spread.until(HINT_AT + n * 0.01)
    spread.until(20.0)
    latest = HINT_AT + 0.19
    after = [started for started in spread.polls if started > latest]
    assert len(after) == len(lone.polls), "one schedule from the latest hint, however many came before it"
    assert len(spread.polls) - len(after) == 1, "and the look the first write asked for"
    assert after[-1] == pytest.approx(latest + 3.0 + SPREAD_S), "it ends settle_ms after the latest hint"


def test_a_hint_during_the_schedule_restarts_it_from_that_hint() -> None:
    run = Run()
    run.hint(HINT_AT)
    run.until(HINT_AT + 1.5)  # looked at 0, 0.25, 0.5 and 1 s: no change yet
    run.hint(HINT_AT + 1.5)  # a second write
    run.until(30.0)
    again = HINT_AT + 1.5
    assert run.polls[4:] == _at(again, *(again + offset + SPREAD_S for offset in (0.25, 0.5 + SPREAD_S, 1, 2, 3)))


def test_each_warm_look_keeps_min_interval_ms_after_the_last() -> None:
    run = Run(config=CONFIG.model_copy(update={"min_interval_ms": 1000}))
    spread = 0.5 * CONFIG.jitter * 1.0
    run.hint(HINT_AT)
    run.until(20.0)
    # 0.25 and 0.5 s fall within min_interval_ms of the look at once: the next look waits it out (and is
    # jittered), past the 1 s look's time, so the next is at 2 s, or min_interval_ms after that look.
    assert run.polls == _at(HINT_AT, HINT_AT + 1 + spread, HINT_AT + 2 + 2 * spread, HINT_AT + 3 + 3 * spread)
    gaps = [later - earlier for earlier, later in zip(run.polls, run.polls[1:], strict=False)]
    assert min(gaps) >= 1.0


@pytest.mark.invariant(21)
def test_warm_looks_take_their_turn_in_the_budget_of_hinted_polls() -> None:
    run = Run(budget=HintBudget(per_s=1))
    run.hint(HINT_AT)
    run.until(20.0)
    gaps = [later - earlier for earlier, later in zip(run.polls, run.polls[1:], strict=False)]
    assert min(gaps) >= 1.0 - 1e-9, "one hinted poll a second, warm looks included"
    assert run.waited and all(wait.limit == "hinted_polls" for wait in run.waited), "deferred, and counted"
    assert run.polls == _at(HINT_AT, HINT_AT + 1, HINT_AT + 2 + SPREAD_S, HINT_AT + 3 + SPREAD_S)


@pytest.mark.invariant(9)
def test_a_failing_warm_look_backs_off_and_no_warm_look_cuts_the_backoff_short() -> None:
    run = Run()
    run.hint(HINT_AT)
    run.until(HINT_AT)  # the look at once: no change
    failing = HINT_AT + 0.25 + SPREAD_S
    run.until(failing, ok=False)
    assert run.polls[-1] == pytest.approx(failing)
    assert run.next_poll() == pytest.approx(failing + 1.0), "the backoff's first step, not the 0.5 s warm look"
    run.hint(HINT_AT + 0.6)  # a hint during the backoff polls nothing sooner
    assert run.next_poll() == pytest.approx(failing + 1.0)
    run.until(30.0)
    # Answered again: still warm (from the latest hint, at 0.6 s), it goes on with the looks after the backoff's.
    again = HINT_AT + 0.6
    assert run.polls[2:] == _at(failing + 1.0, again + 1 + SPREAD_S, again + 2 + SPREAD_S, again + 3 + SPREAD_S)


# -- the plan in the engine, its polls answered by a source that shows a write late ---------------------------

NOTE = "x://note"


class LaggingSource:
    """A source that shows a write `lag_s` after it is made (it re-indexes), read by one watch through the engine."""

    def __init__(self, lag_s: float, config: PollingConfig = CONFIG) -> None:
        self.lag_s = lag_s
        self.written_at: float | None = None
        engine = Engine(linger_s=8.0, absent_ttl_s=5.0, rate_per_s=1000.0, rules=Rules([]), polling=config,
                        settle_ms=SETTLE_MS, rand=lambda: 0.5)  # fmt: skip
        self.polled = Polled(engine, self._read)
        self.key = self.polled.watch(ALICE, NOTE, Observation("fp-0", int(INTERVAL_S * 1000), True))

    def _read(self, key: WatchKey, now: float) -> Observation:
        shown = self.written_at is not None and now >= self.written_at + self.lag_s
        return Observation("fp-1" if shown else "fp-0", int(INTERVAL_S * 1000), True)

    def write(self, at: float) -> None:
        """A write at `at` (nothing due before it), hinted as the sidecar hints a write: warm."""
        self.polled.clock.advance_to(at)
        self.written_at = at
        self.polled.feed(Hinted(self.key, warm=True))

    def until(self, until: float) -> None:
        self.polled.clock.advance(until - self.polled.clock.now())


@pytest.mark.invariant(22)
def test_a_write_the_source_shows_a_second_late_is_told_once_by_a_warm_look() -> None:
    source = LaggingSource(lag_s=0.8)
    source.write(HINT_AT)
    source.until(20.0)
    # The looks before the source shows the write saw the old content and told nobody; the 1 s one saw it.
    polled = source.polled
    assert polled.started_at() == _at(
        HINT_AT, HINT_AT + 0.25 + SPREAD_S, HINT_AT + 0.5 + 2 * SPREAD_S, HINT_AT + 1.0125
    )
    assert all(poll.hinted for poll in polled.polls)
    assert polled.told() == ["fp-1"]
    assert polled.clock.due() == _at(HINT_AT + 1.0125 + INTERVAL_S), "then its interval"


def test_a_write_through_the_sidecar_holds_the_watches_it_hints_warm_until_the_source_shows_it() -> None:
    source = LaggingSource(lag_s=0.8)
    polled = source.polled
    polled.clock.advance_to(HINT_AT)
    source.written_at = HINT_AT
    polled.feed(Wrote("alice"))  # the write itself, through the debounce: its round's hint is warm
    source.until(20.0)
    assert len(polled.started_at()) == 4, "the look at once, then the warm ones until the source showed the write"
    assert polled.told() == ["fp-1"], "told within the second, not an interval later"


@pytest.mark.invariant(21)
def test_warm_looks_wait_for_their_slots_of_the_read_budget() -> None:
    source = LaggingSource(lag_s=60.0, config=CONFIG.model_copy(update={"max_reads_per_s": 2, "jitter": 0.0}))
    source.write(HINT_AT)  # never shown within the warm schedule
    source.until(20.0)
    # Two reads a second at most, warm looks included: the 0.25 s look waits for its slot at 0.5 s (and stands
    # for the 0.5 s one), then 1, 2 and 3 s.
    assert source.polled.started_at() == _at(HINT_AT, HINT_AT + 0.5, HINT_AT + 1, HINT_AT + 2, HINT_AT + 3)
    assert [wait.limit for wait in source.polled.waited] == ["read_budget"], "the 0.25 s look waited for its slot"
    assert source.polled.waited[0].seconds == pytest.approx(0.25)
    shares = [command for _, _, commands in source.polled.play.steps for command in commands]
    assert shares.count(BudgetShare(2.0)) == 5, "each look took its slot: this replica's share, all of the budget"
