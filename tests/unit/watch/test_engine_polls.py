"""The engine's polls of a watch, as playbooks: which look is applied (the ticket rule), what is a change and its
generation, changes heard from the bus, failures and backoff, the lease, hints, recovery, the upstream's cover,
the read and hint budgets, and a lingering watch's poll with nobody to poll for. No loop and no clock: the poll a
`StartPoll` asks for is fed back as the events the registry would feed (`PollDone`, `PollFailed`, `PollSkipped`,
`PollCrashed`, then `PollFinished`). What the registry does with them (the gate, metrics, spans, the publish) is
`test_registry_polls`'s; when one plan polls, `test_schedules`'s."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sidecar.changes import ChangeEvent, WatchKey
from sidecar.config import PollingConfig
from sidecar.watch.engine import Engine
from sidecar.watch.engine.commands import (
    BudgetShare,
    CancelTimer,
    Command,
    Cover,
    Interval,
    Observed,
    Publish,
    Resolve,
    SetTimer,
    StartLook,
    StartPoll,
    Track,
    Uncover,
    Untrack,
    Waited,
)
from sidecar.watch.engine.events import (
    ChangeHeard,
    Covered,
    Forwarded,
    Hinted,
    LookDone,
    PollCrashed,
    PollDone,
    PollFailed,
    PollFinished,
    PollSkipped,
    Published,
    Recovered,
    Release,
    Subscribe,
    TimerFired,
)
from sidecar.watch.engine.record import Record
from sidecar.watch.observation import Observation, observation_from_read
from tests.unit.watch.engine_cast import (
    ALICE,
    ALICE_PHONE,
    DOC,
    LINGER_S,
    OTHER,
    POLL_S,
    V1,
    V2,
    Book,
    key,
    polling_engine,
    started,
)
from tests.unit.watch.engine_cast import SCHEDULE_CONFIG as CONFIG

"""Jittered, but the playbooks draw the midpoint (no jitter): a watch polls every 5 s, backs off 1, 2, 4, 8 s."""
V3 = Observation("fp-v3", None, False)


def _book(polling: PollingConfig = CONFIG, *, may_poll: Callable[[WatchKey], bool] = lambda key: True) -> Book:
    engine = polling_engine(polling, may_poll=may_poll)
    return Book(engine)


def _record(play: Book, watched: WatchKey) -> Record:
    engine = play.engine
    assert isinstance(engine, Engine)
    record = engine.record(watched)
    assert record is not None, f"{watched} is watched"
    return record


def _about(seconds: float) -> float:
    return pytest.approx(seconds)  # type: ignore[return-value]  # a time computed by sums of floats


def _polls(play: Book, timer: int, watched: WatchKey, ticket: int, seen: Observation, *told: Command) -> None:
    """`timer` fires now and starts a poll of `watched` (a regular one, due now), which sees `seen` at `ticket`:
    applied, and `told` besides."""
    play.step(TimerFired(timer), StartPoll(watched, play.now, False))
    play.step(PollDone(watched, play.now, ticket, seen), Observed(watched, seen.fingerprint, ticket), *told)


def _other(play: Book, waiter: int, look: int, ticket: int, timer: int) -> WatchKey:
    """alice's second watch (OTHER) starts now; its first poll's timer is `timer`."""
    other = key("alice", OTHER)
    play.step(Subscribe(waiter, "resource", OTHER, ALICE), StartLook(look, "resource", OTHER, ALICE, paced=False))
    commands = play.feed(LookDone(look, ticket, V1))
    assert SetTimer(timer, play.now + POLL_S) in commands, commands
    play.step(Published(look), Track(other), Cover(ALICE, "resource", OTHER), Resolve(waiter, other))
    return other


@pytest.mark.invariant(9)
def test_polls_once_an_interval_from_its_first_look_and_tells_each_change_once_with_the_next_generation() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.at(5.0)
    _polls(play, -1, watched, 2, V1)  # the baseline again: applied (the cache is told), no change
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-2, 10.0))
    play.at(10.0)
    _polls(play, -2, watched, 3, V2, Publish(watched, V2.fingerprint, 1))
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-3, 15.0))
    play.at(15.0)
    _polls(play, -3, watched, 4, V2)  # seen already: told once
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-4, 20.0))
    play.at(20.0)
    _polls(play, -4, watched, 5, V3, Publish(watched, V3.fingerprint, 2))
    record = _record(play, watched)
    assert (record.fingerprint, record.generation) == (V3.fingerprint, 2)
    assert (record.last_poll_at, record.last_change_at) == (20.0, 20.0)


def test_a_new_watch_has_neither_polled_nor_changed_and_is_held_by_the_stream_that_started_it() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    record = _record(play, watched)
    assert (record.refs, record.generation, record.consecutive_errors) == (1, 0, 0)
    assert record.last_poll_at is None and record.last_change_at is None
    assert record.native is False and record.fingerprint == V1.fingerprint


@pytest.mark.invariant(7)
def test_a_poll_that_started_before_a_fresher_look_does_not_overwrite_it() -> None:
    # The poll's ticket (3) was taken as it started; a joiner's look that started after it (4) is applied first.
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.at(5.0)
    play.step(TimerFired(-1), StartPoll(watched, 5.0, False))
    play.step(Subscribe(2, "resource", DOC, ALICE_PHONE), StartLook(2, "resource", DOC, ALICE_PHONE, paced=False))
    joined: list[Command] = [
        Observed(watched, V2.fingerprint, 4),
        Publish(watched, V2.fingerprint, 1),
        Resolve(2, watched),
    ]
    play.step(LookDone(2, 4, V2), *joined)
    stale = Observation("fp-stale", None, False)
    play.step(PollDone(watched, 5.0, 3, stale))  # neither applied nor told to the cache: no change either
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-2, 10.0))
    record = _record(play, watched)
    assert (record.fingerprint, record.generation) == (V2.fingerprint, 1)


@pytest.mark.invariant(7)
def test_a_forwarded_read_older_than_the_last_look_applied_changes_nothing() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    stale = 2  # a forwarded read's ticket, taken before the poll below started
    play.at(5.0)
    _polls(play, -1, watched, 3, V1)  # a poll that started later is applied first
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-2, 10.0))
    old = {"result": {"contents": [{"uri": DOC, "text": "old"}]}}
    play.step(Forwarded("resources/read", {"uri": DOC}, ALICE, old, stale))  # neither applied nor told
    fresh = {"result": {"contents": [{"uri": DOC, "text": "v2"}]}}
    v2 = observation_from_read(fresh["result"]).fingerprint
    play.step(
        Forwarded("resources/read", {"uri": DOC}, ALICE, fresh, 4), Observed(watched, v2, 4), Publish(watched, v2, 1)
    )
    record = _record(play, watched)
    assert (record.fingerprint, record.generation) == (v2, 1)


@pytest.mark.invariant(6)
def test_the_baseline_itself_is_not_a_change() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.at(5.0)
    _polls(play, -1, watched, 2, V1)
    record = _record(play, watched)
    assert record.generation == 0


def test_a_look_no_newer_than_the_baseline_is_ignored() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 5)
    play.at(5.0)
    play.step(TimerFired(-1), StartPoll(watched, 5.0, False))
    play.step(PollDone(watched, 5.0, 4, V2))  # older than the baseline
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-2, 10.0))
    play.at(10.0)
    play.step(TimerFired(-2), StartPoll(watched, 10.0, False))
    play.step(PollDone(watched, 10.0, 5, V2))  # the baseline's own ticket
    record = _record(play, watched)
    assert (record.fingerprint, record.generation) == (V1.fingerprint, 0)


def test_a_change_another_replica_told_is_taken_as_ours_and_not_told_again() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(ChangeHeard(ChangeEvent(watched, V2.fingerprint, 7, 0.0)))
    play.step(ChangeHeard(ChangeEvent(watched, V2.fingerprint, 7, 0.0)))  # the same again: one change
    record = _record(play, watched)
    assert (record.fingerprint, record.generation) == (V2.fingerprint, 1)
    play.at(5.0)
    _polls(play, -1, watched, 2, V2)  # our next poll sees it: no change
    play.step(ChangeHeard(ChangeEvent(watched, V3.fingerprint, 8, 0.0)))
    assert (record.fingerprint, record.generation) == (V3.fingerprint, 2)


@pytest.mark.invariant(9)
def test_a_failing_poll_backs_off_and_the_first_that_succeeds_ends_the_backoff() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    record = _record(play, watched)
    play.at(5.0)
    play.step(TimerFired(-1), StartPoll(watched, 5.0, False))
    play.step(PollFailed(watched, 5.0))
    play.step(PollFinished(watched), SetTimer(-2, 6.0))  # a backoff, not an interval
    assert record.consecutive_errors == 1
    play.at(6.0)
    play.step(TimerFired(-2), StartPoll(watched, 6.0, False))
    play.step(PollFailed(watched, 6.0))
    play.step(PollFinished(watched), SetTimer(-3, 8.0))
    assert record.consecutive_errors == 2
    play.at(8.0)
    _polls(play, -3, watched, 2, V1)
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-4, 13.0))  # from then on at its interval
    assert record.consecutive_errors == 0


def test_a_poll_that_crashed_after_its_look_was_applied_backs_off_like_a_failure() -> None:
    # Its publish raised: the look was applied (and told), and the next poll comes a backoff after it started.
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.at(5.0)
    _polls(play, -1, watched, 2, V2, Publish(watched, V2.fingerprint, 1))
    play.step(PollCrashed(watched, 5.0))
    play.step(PollFinished(watched), SetTimer(-2, 6.0))
    record = _record(play, watched)
    assert record.consecutive_errors == 1


def test_a_poll_that_crashed_before_its_look_came_back_backs_off_from_its_own_start() -> None:
    # Counted from the previous poll's start instead, the backoff would land in the past and the next poll start at
    # once: a poll that crashed every time would poll without pause.
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.at(5.0)
    play.step(TimerFired(-1), StartPoll(watched, 5.0, False))
    play.step(PollCrashed(watched, 5.0))
    play.step(PollFinished(watched), SetTimer(-2, 6.0))


def test_a_replica_that_may_not_poll_a_key_asks_again_an_interval_later() -> None:
    asked: list[tuple[WatchKey, float]] = []

    def elsewhere(polled: WatchKey) -> bool:
        asked.append((polled, play.now))
        return False  # another replica holds the lease

    play = _book(may_poll=elsewhere)
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.at(5.0)
    play.step(TimerFired(-1), Interval(POLL_S), SetTimer(-2, 10.0))
    play.at(10.0)
    play.step(TimerFired(-2), Interval(POLL_S), SetTimer(-3, 15.0))
    assert asked == [(watched, 5.0), (watched, 10.0)]
    record = _record(play, watched)
    assert record.consecutive_errors == 0, "neither a success nor a failure"


def test_a_lingering_watchs_poll_that_has_nobody_to_poll_for_comes_again_an_interval_later() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    lingers = [Uncover("alice", "resource", DOC), Untrack(watched), SetTimer(2, LINGER_S)]
    play.step(Release(watched, "alice"), *lingers)  # it lingers 8 s
    assert play.engine.poller(watched) is None, "no stream holds it: no credential to poll with"
    play.at(POLL_S)
    play.step(TimerFired(-1), StartPoll(watched, POLL_S, False))
    play.step(PollSkipped(watched, POLL_S))  # nobody to poll for: no read, neither a success nor a failure
    # The linger's end (8 s) stays armed, and the next poll comes an interval after this one.
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-2, 2 * POLL_S))
    assert _record(play, watched).consecutive_errors == 0


def test_a_hint_polls_soon_as_a_hinted_poll_and_a_hint_for_no_watch_is_nothing() -> None:
    play = _book()
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.at(1.0)
    play.step(Hinted(watched), CancelTimer(-1), SetTimer(-2, 1.0))  # past min_interval_ms: at once
    play.step(Hinted(watched))  # hints coalesce
    play.step(Hinted(key("bob")))
    play.step(TimerFired(-2), StartPoll(watched, 1.0, True))


def test_the_upstream_answering_again_retries_each_failing_watch_at_once_once_per_failure_streak() -> None:
    play = _book()
    failing = started(play, 1, 1, ALICE, V1, 1)
    healthy = _other(play, 2, 2, 2, -2)
    play.at(5.0)
    play.step(TimerFired(-1), StartPoll(failing, 5.0, False))
    play.step(PollFailed(failing, 5.0))
    play.step(PollFinished(failing), SetTimer(-3, 6.0))
    play.at(5.5)
    play.step(Recovered(), CancelTimer(-3), SetTimer(-4, 5.5))  # the healthy watch keeps its interval
    play.step(TimerFired(-4), StartPoll(failing, 5.5, True))
    play.step(PollFailed(failing, 5.5))
    play.step(PollFinished(failing), SetTimer(-5, 7.5))
    play.step(Recovered())  # the same failure streak: it waits out its backoff
    assert _record(play, healthy).consecutive_errors == 0


def test_a_key_the_upstreams_notifications_cover_polls_at_the_backstop_and_losing_the_cover_polls_soon() -> None:
    play = _book(CONFIG.model_copy(update={"native_backstop_ms": 60_000}))
    watched = started(play, 1, 1, ALICE, V1, 1)
    play.step(Covered(watched, True))
    play.step(Covered(watched, True))
    record = _record(play, watched)
    assert (record.native, record.wanted_ms) == (True, 60_000)
    play.at(5.0)
    _polls(play, -1, watched, 2, V1)  # the poll armed before the cover
    play.step(PollFinished(watched), Interval(60.0), SetTimer(-2, 65.0))  # then the backstop's 60 s
    play.at(30.0)
    play.step(Covered(watched, False), CancelTimer(-2), SetTimer(-3, 30.0))  # at once: what changed was not told
    play.step(TimerFired(-3), StartPoll(watched, 30.0, True))
    play.step(PollDone(watched, 30.0, 3, V1), Observed(watched, V1.fingerprint, 3))
    play.step(PollFinished(watched), Interval(POLL_S), SetTimer(-4, 35.0))
    assert (record.native, record.wanted_ms) == (False, 5000)


def test_hinted_polls_past_the_hint_budget_are_deferred_to_their_slot_and_counted_as_a_wait() -> None:
    play = _book(CONFIG.model_copy(update={"max_hinted_polls_per_s": 1}))
    first = started(play, 1, 1, ALICE, V1, 1)
    second = _other(play, 2, 2, 2, -2)
    play.at(1.0)
    play.step(Hinted(first), CancelTimer(-1), SetTimer(-3, 1.0))
    # Spread after the first (0.0125 s at the midpoint), then to the budget's next slot a second after it.
    play.step(Hinted(second), Waited("hinted_polls", _about(1.0 - 0.0125)), CancelTimer(-2), SetTimer(-4, 2.0))


def _budgeted(play: Book) -> tuple[WatchKey, WatchKey]:
    """Two watches wanting a poll every 5 s each under a budget of a read every 4 s: their first polls are at 5 s."""
    first = started(play, 1, 1, ALICE, V1, 1)
    second = _other(play, 2, 2, 2, -2)
    play.at(5.0)
    return first, second


_BUDGET = CONFIG.model_copy(update={"max_reads_per_s": 0.25, "jitter": 0.0})


def test_a_poll_over_the_read_budget_waits_for_its_slot_and_only_that_wait_is_counted() -> None:
    play = _book(_BUDGET)
    first, second = _budgeted(play)
    play.step(TimerFired(-1), BudgetShare(0.25), StartPoll(first, 5.0, False))  # the free slot, at once
    play.step(TimerFired(-2), BudgetShare(0.25), Waited("read_budget", 4.0), SetTimer(-3, 9.0))
    play.step(PollDone(first, 5.0, 3, V1), Observed(first, V1.fingerprint, 3))
    play.at(9.0)
    play.step(TimerFired(-3), StartPoll(second, 5.0, False))  # in its slot; it was due at 5 s (its lag counts)


@pytest.mark.invariant(21)
def test_hinted_polls_take_their_slots_as_hinted_and_leave_the_regular_ones_less_of_the_budget() -> None:
    play = _book(_BUDGET)
    first, second = _budgeted(play)
    play.step(TimerFired(-1), BudgetShare(0.25), StartPoll(first, 5.0, False))
    play.step(TimerFired(-2), BudgetShare(0.25), Waited("read_budget", 4.0), SetTimer(-3, 9.0))
    play.step(PollDone(first, 5.0, 3, V1), Observed(first, V1.fingerprint, 3))
    before = 2 / (0.9 * 0.25)  # two keys share 0.9 of the budget
    play.step(PollFinished(first), Interval(_about(before)), SetTimer(-4, _about(5.0 + before)))
    play.at(9.0)
    play.step(TimerFired(-3), StartPoll(second, 5.0, False))
    play.step(PollDone(second, 9.0, 4, V1), Observed(second, V1.fingerprint, 4))
    play.step(PollFinished(second), Interval(_about(before)), SetTimer(-5, _about(9.0 + before)))
    # Hinted, each polls at once (min_interval_ms has passed since its last look), but in its slot of the budget.
    play.at(10.0)
    play.step(Hinted(first), CancelTimer(-4), SetTimer(-6, 10.0))
    play.step(TimerFired(-6), BudgetShare(0.25), Waited("read_budget", 3.0), SetTimer(-7, 13.0))
    play.at(11.0)
    play.step(Hinted(second), CancelTimer(-5), SetTimer(-8, 11.0))
    play.step(TimerFired(-8), BudgetShare(0.25), Waited("read_budget", 6.0), SetTimer(-9, 17.0))
    play.at(13.0)
    play.step(TimerFired(-7), StartPoll(first, 10.0, True))
    play.step(PollDone(first, 13.0, 5, V1), Observed(first, V1.fingerprint, 5))
    play.feed(PollFinished(first))
    record = _record(play, first)
    assert record.interval_s > 1.1 * before, "the allocation leaves room for hinted polls"
