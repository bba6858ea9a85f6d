"""When a watch polls: interval, backoff, hints and their budget, recovery, as playbooks of its `PollPlan`.

No event loop and no clock: each step feeds one event at a time the test names and expects the exact commands
(timers to arm and cancel, the poll to run). The arithmetic under them (`Schedule`: ttlMs clamped, jitter,
backoff) is at the end. What the engine makes of a plan's commands is `test_engine_polls`'s, how the registry runs
a poll `test_registry_polls`'s; writes' hints are `test_revalidate`'s.
"""

from __future__ import annotations

import pytest

from sidecar.watch.engine.commands import CancelTimer, Interval, SetTimer, Waited
from sidecar.watch.engine.events import TimerFired
from sidecar.watch.engine.polls import (
    Begin,
    Finished,
    Hint,
    LogLimiter,
    Looked,
    Poll,
    PollCommand,
    PollEvent,
    PollPlan,
    Recover,
    Slotted,
    Stop,
    Tighten,
)
from sidecar.watch.schedule import HintBudget, Schedule
from tests.kit.playbook import Playbook
from tests.unit.watch.engine_cast import SCHEDULE_CONFIG as CONFIG

TTL_MS = 2000

Book = Playbook[PollEvent, PollCommand]


def _midpoint() -> Schedule:
    """rand() = 0.5 puts interval and backoff jitter at zero; a hint's own spread is then 0.0125 s. (A fresh one
    per watch: a schedule remembers when it last let a hint poll at once.)"""
    return Schedule(CONFIG, rand=lambda: 0.5)


HINT_SPREAD_S = 0.5 * CONFIG.jitter * CONFIG.min_interval_ms / 1000


def _book(
    *, schedule: Schedule | None = None, budget: HintBudget | None = None, interval: list[float] | None = None
) -> Book:
    """A watch whose baseline was read at 0 and whose interval is its ttlMs (2 s) jittered, or `interval[0]`."""
    used = schedule or _midpoint()

    def wanted(now: float) -> float:
        return interval[0] if interval else used.interval_s(TTL_MS)

    return Book(PollPlan(used, interval=wanted, budget=budget, started=0.0))


def _at(seconds: float) -> float:
    return pytest.approx(seconds)  # type: ignore[return-value]  # a time computed by sums of jittered figures


def _polled(play: Book, timer: int, when: float, *, ok: bool | None = True, hinted: bool = False) -> list[PollCommand]:
    """Timer `timer`, armed for `when`, fires then; the poll it asks for looks at once: what the plan arms after."""
    play.at(when)
    play.step(TimerFired(timer), Poll(_at(when), hinted))
    play.step(Looked(when, ok))
    return play.feed(Finished())


@pytest.mark.invariant(9)
def test_polls_once_per_interval_from_the_baseline() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    assert _polled(play, 1, 2.0) == [Interval(2.0), SetTimer(2, 4.0)]
    play.step(TimerFired(1))  # a timer already fired (or cancelled) asks for nothing
    assert _polled(play, 2, 4.0) == [Interval(2.0), SetTimer(3, 6.0)]


@pytest.mark.invariant(9)
def test_failures_back_off_exponentially_then_the_interval_returns() -> None:
    plan = PollPlan(_midpoint(), interval=lambda now: 2.0, budget=None, started=0.0)
    play = Book(plan)
    play.step(Begin(), SetTimer(1, 2.0))
    when, armed = 2.0, []
    for timer in range(1, 7):
        [rearmed] = _polled(play, timer, when, ok=False)
        assert isinstance(rearmed, SetTimer)
        armed.append(rearmed.when)
        when = rearmed.when
    assert armed == [3.0, 5.0, 9.0, 17.0, 25.0, 33.0]
    assert plan.errors == 6
    assert _polled(play, 7, 33.0) == [Interval(2.0), SetTimer(8, 35.0)]


def test_a_hint_polls_after_min_interval_and_many_hints_are_one_poll() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    play.at(0.1).step(Hint(), CancelTimer(1), SetTimer(2, _at(0.25 + HINT_SPREAD_S)))
    for _ in range(4):
        play.step(Hint())  # coalesced into the hinted poll armed already
    assert _polled(play, 2, 0.25 + HINT_SPREAD_S, hinted=True) == [
        Interval(2.0),
        SetTimer(3, _at(2.25 + HINT_SPREAD_S)),
    ], "the next poll is the regular one"


def test_a_hint_during_a_poll_adds_exactly_one_poll_after_it() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    play.at(2.0).step(TimerFired(1), Poll(2.0, False))
    play.step(Hint())
    play.step(Hint())
    play.at(2.1).step(Looked(2.0, True))
    play.step(Finished(), Interval(2.0), SetTimer(2, 4.0), CancelTimer(2), SetTimer(3, _at(2.25 + HINT_SPREAD_S)))


def test_a_hint_between_the_timer_firing_and_its_poll_starting_adds_no_second_poll_beside_it() -> None:
    # The poll is in flight from its timer's firing: a burst of writes whose hints land before its look starts
    # must find it, and ask for one poll after it, never a second beside it.
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    play.at(2.0).step(TimerFired(1), Poll(2.0, False))
    play.step(Hint())
    play.at(3.0).step(Looked(2.0, True))
    # Past min_interval_ms and the only hint of its spread: it polls at once, without a pause.
    play.step(Finished(), Interval(2.0), SetTimer(2, 4.0), CancelTimer(2), SetTimer(3, 3.0))


def test_a_lone_hint_past_min_interval_polls_at_once() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    play.at(1.0).step(Hint(), CancelTimer(1), SetTimer(2, 1.0))


@pytest.mark.invariant(9)
def test_hints_to_many_watches_at_once_are_spread_after_the_first() -> None:
    # A write hinting many keys must not fire their polls in one instant: the first polls at once, the others
    # over the spread (up to jitter x min_interval_ms); and a hint that waits out min_interval_ms is jittered.
    draws: list[float] = []
    schedule = Schedule(CONFIG, rand=lambda: draws.pop(0) if draws else 0.5)
    spread_s = CONFIG.jitter * CONFIG.min_interval_ms / 1000
    plays = [_book(schedule=schedule) for _ in range(4)]
    for play in plays:
        play.step(Begin(), SetTimer(1, 2.0))
    draws += [0.2, 0.6, 0.9]
    for play, draw in zip(plays, [0.0, 0.2, 0.6, 0.9], strict=True):
        play.at(1.0).step(Hint(), CancelTimer(1), SetTimer(2, _at(1.0 + draw * spread_s)))
    first = plays[0]
    assert _polled(first, 2, 1.0, hinted=True) == [Interval(2.0), SetTimer(3, 3.0)]
    # 0.1 s after its poll: it waits out min_interval_ms, and that wait is jittered.
    first.at(1.1).step(Hint(), CancelTimer(3), SetTimer(4, _at(1.25 + 0.5 * spread_s)))


@pytest.mark.invariant(9)
def test_a_hint_never_cuts_a_backoff_short() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    assert _polled(play, 1, 2.0, ok=False) == [SetTimer(2, 3.0)]
    play.step(Hint())
    play.at(2.9).step(Hint())


def test_a_stopped_watch_never_polls_again() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    play.step(Stop(), CancelTimer(1))
    for event in (Hint(), Recover(), Tighten(), TimerFired(1)):
        play.at(play.now + 1).step(event)
    busy = _book()
    busy.step(Begin(), SetTimer(1, 2.0))
    busy.at(2.0).step(TimerFired(1), Poll(2.0, False))
    busy.step(Stop())
    busy.step(Looked(2.0, True))
    busy.step(Finished())  # stopped while it polled: nothing is armed after it
    shortened = [2.0]
    budgeted = _book(interval=shortened)
    budgeted.step(Begin(), SetTimer(1, 2.0))
    budgeted.step(Stop(), CancelTimer(1))
    shortened[0] = 0.5
    budgeted.at(1.0).step(Tighten())  # the read budget shortening every interval re-arms nothing stopped


def test_a_hint_after_a_poll_polls_min_interval_after_that_poll() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    assert _polled(play, 1, 2.0) == [Interval(2.0), SetTimer(2, 4.0)]
    play.at(2.1).step(Hint(), CancelTimer(2), SetTimer(3, _at(2.25 + HINT_SPREAD_S)))


def test_a_hint_just_before_a_regular_poll_is_answered_by_it_and_spends_no_budget() -> None:
    budget, schedule = HintBudget(per_s=1), _midpoint()
    play = _book(schedule=schedule, budget=budget)
    play.step(Begin(), SetTimer(1, 2.0))
    schedule.hint_jitter_s(1.995, waits=False)  # another key was hinted first: this hint is spread
    play.at(1.995).step(Hint())  # a hinted poll could run at 2.0075 at the soonest: the regular one at 2.0 comes first
    assert budget.slot(2.5) == 2.5, "the budget is whole"


def test_a_hint_during_a_poll_is_answered_by_the_next_regular_poll_when_that_comes_sooner() -> None:
    interval = [2.0]
    play = _book(interval=interval)
    play.step(Begin(), SetTimer(1, 2.0))
    play.at(2.0).step(TimerFired(1), Poll(2.0, False))
    play.step(Hint())
    play.at(2.1).step(Looked(2.0, True))
    interval[0] = 0.25  # the look said ttlMs 250: the next regular poll is min_interval_ms after this one
    play.step(Finished(), Interval(0.25), SetTimer(2, 2.25))


def test_the_hint_budget_lets_a_seconds_worth_through_at_once_then_spaces_the_rest_and_refills() -> None:
    budget = HintBudget(per_s=4)
    assert [budget.slot(0.0) for _ in range(8)] == pytest.approx([0.0] * 4 + [0.25, 0.5, 0.75, 1.0])
    assert budget.slot(0.6) == pytest.approx(1.25), "a poll wanted later still waits its turn"
    assert [budget.slot(10.0) for _ in range(6)] == pytest.approx([10.0] * 4 + [10.25, 10.5]), (
        "a quiet spell refills it"
    )


def test_a_hint_budget_under_one_a_second_lets_one_through_at_a_time() -> None:
    budget = HintBudget(per_s=0.5)
    assert [budget.slot(0.0) for _ in range(3)] == pytest.approx([0.0, 2.0, 4.0])
    assert budget.slot(100.0) == 100.0


def test_hinted_polls_past_the_budget_are_deferred_to_their_slot_and_counted_never_dropped() -> None:
    budget = HintBudget(per_s=1)
    first, second = _book(budget=budget), _book(budget=budget)
    soonest = 0.25 + HINT_SPREAD_S
    for play in (first, second):
        play.step(Begin(), SetTimer(1, 2.0))
    first.at(0.1).step(Hint(), CancelTimer(1), SetTimer(2, _at(soonest)))
    second.at(0.1).step(Hint(), Waited("hinted_polls", _at(1.0)), CancelTimer(1), SetTimer(2, _at(soonest + 1.0)))


def test_a_hint_deferred_past_the_next_regular_poll_leaves_that_poll_where_it_was() -> None:
    budget = HintBudget(per_s=1)
    plays = [_book(budget=budget) for _ in range(3)]
    for play in plays:
        play.step(Begin(), SetTimer(1, 2.0))
    soonest = 0.25 + HINT_SPREAD_S
    plays[0].at(0.1).step(Hint(), CancelTimer(1), SetTimer(2, _at(soonest)))
    plays[1].at(0.1).step(Hint(), Waited("hinted_polls", _at(1.0)), CancelTimer(1), SetTimer(2, _at(soonest + 1)))
    plays[2].at(0.1).step(Hint(), Waited("hinted_polls", _at(2.0)))  # its slot, 2.2625, is after 2.0: not armed


def test_a_look_with_nobody_to_poll_for_neither_backs_off_nor_ends_a_backoff() -> None:
    # Another replica holds the lease (or no stream holds the key): it looks again an interval after it asked.
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    assert _polled(play, 1, 2.0, ok=None) == [Interval(2.0), SetTimer(2, 4.0)]
    assert _polled(play, 2, 4.0, ok=False) == [SetTimer(3, 5.0)]
    assert _polled(play, 3, 5.0, ok=None) == [SetTimer(4, 6.0)], "still backing off, at the same step"


def test_the_upstream_answering_again_retries_a_failing_watch_once_per_failure_streak() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    play.step(Recover())  # not failing: nothing to retry
    assert _polled(play, 1, 2.0, ok=False) == [SetTimer(2, 3.0)]
    retry = 2.25 + HINT_SPREAD_S
    play.at(2.1).step(Recover(), CancelTimer(2), SetTimer(3, _at(retry)))
    assert _polled(play, 3, retry, ok=False, hinted=True) == [SetTimer(4, _at(retry + 2.0))]
    play.at(2.5).step(Recover())  # the same streak: no second retry
    assert _polled(play, 4, retry + 2.0) == [Interval(2.0), SetTimer(5, _at(retry + 4.0))]  # the streak is over
    assert _polled(play, 5, retry + 4.0, ok=False) == [SetTimer(6, _at(retry + 5.0))]  # a new streak
    play.at(7.0).step(Recover(), CancelTimer(6), SetTimer(7, 7.0))  # the retry at once: a lone key, past the floor


def test_a_shorter_interval_from_the_read_budget_moves_a_regular_poll_only() -> None:
    interval = [2.0]
    play = _book(interval=interval)
    play.step(Begin(), SetTimer(1, 2.0))
    interval[0] = 1.0
    play.at(0.5).step(Tighten(), CancelTimer(1), SetTimer(2, 1.0))
    play.step(Tighten())  # armed for that already
    interval[0] = 0.2
    play.at(0.9).step(Tighten(), CancelTimer(2), SetTimer(3, 0.9))  # never in the past
    assert _polled(play, 3, 0.9, ok=False) == [SetTimer(4, 1.9)]
    interval[0] = 0.1
    play.at(1.0).step(Tighten())  # a backoff is not shortened


@pytest.mark.invariant(21)
def test_a_poll_waiting_for_its_slot_of_the_read_budget_is_in_flight_until_it_runs_then() -> None:
    play = _book()
    play.step(Begin(), SetTimer(1, 2.0))
    play.at(2.0).step(TimerFired(1), Poll(2.0, False))
    play.step(Slotted(2.5), SetTimer(2, 2.5))
    play.step(Hint())  # the poll to come may predate the write: one more after it
    play.step(Tighten())  # the slot is not the interval's to move
    play.at(2.5).step(TimerFired(2), Poll(2.0, False, slotted=True))  # due when it was due: its lag counts from then
    play.step(Looked(2.5, True))
    play.step(Finished(), Interval(2.0), SetTimer(3, 4.5), CancelTimer(3), SetTimer(4, _at(2.75 + HINT_SPREAD_S)))
    waiting = _book()
    waiting.step(Begin(), SetTimer(1, 2.0))
    waiting.at(2.0).step(TimerFired(1), Poll(2.0, False))
    waiting.step(Slotted(2.5), SetTimer(2, 2.5))
    waiting.step(Stop(), CancelTimer(2))


# -- the arithmetic: interval, jitter and backoff (`Schedule`), and the failure log's pace ----------------------


@pytest.mark.invariant(9)
@pytest.mark.parametrize(
    ("ttl_ms", "base_s"),
    [(None, 5.0), (0, 5.0), (100, 0.25), (2000, 2.0), (10**9, 60.0)],
    ids=["absent", "zero", "below-min", "in-range", "above-max"],
)
def test_interval_is_ttl_clamped_with_jitter_on_both_sides(ttl_ms: int | None, base_s: float) -> None:
    low = Schedule(CONFIG, rand=lambda: 0.0).interval_s(ttl_ms)
    high = Schedule(CONFIG, rand=lambda: 0.999999).interval_s(ttl_ms)
    assert low == pytest.approx(base_s * 0.9)
    assert high == pytest.approx(base_s * 1.1, rel=1e-4)


@pytest.mark.invariant(9)
def test_backoff_doubles_up_to_its_cap() -> None:
    schedule = _midpoint()  # no jitter at the midpoint
    assert [schedule.backoff_s(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 8.0]


def test_backoff_is_jittered_even_when_interval_jitter_is_off() -> None:
    schedule = Schedule(CONFIG.model_copy(update={"jitter": 0.0}), rand=lambda: 0.0)
    assert schedule.backoff_s(1) < 1.0


def test_an_interval_under_the_read_budget_is_jittered_but_never_past_max_interval() -> None:
    low = Schedule(CONFIG, rand=lambda: 0.0)
    high = Schedule(CONFIG, rand=lambda: 0.999999)
    assert low.budgeted_s(10_000) == pytest.approx(9.0) and high.budgeted_s(10_000) == pytest.approx(11.0, rel=1e-4)
    # The budget covering every key gives each its wanted interval: jittered up, it would pass max_interval_ms.
    assert high.budgeted_s(60_000) == 60.0 and low.budgeted_s(60_000) == pytest.approx(54.0)


def test_a_covered_key_polls_at_its_usual_interval_unless_a_backstop_is_set() -> None:
    usual = _midpoint()
    assert usual.backstop_s(2000) == usual.interval_s(2000)
    assert usual.backstop_s(2000, 10_000) == usual.interval_s(2000, 10_000) == 10.0  # the key's rule, as uncovered
    stretched = Schedule(CONFIG.model_copy(update={"native_backstop_ms": 60_000}), rand=lambda: 0.5)
    assert stretched.backstop_s(2000) == 60.0


def test_failure_lines_are_allowed_one_per_interval_from_the_first_one_on_even_right_after_boot() -> None:
    limiter = LogLimiter(10.0)  # the monotonic clock starts near 0 at boot
    allowed = [limiter.allow(now) for now in (0.0, 9.999, 10.0, 15.0, 19.999, 20.0)]
    assert allowed == [True, False, True, False, False, True]
