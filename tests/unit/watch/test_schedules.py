"""When a watch polls: interval, backoff and hints, on a clock the test moves by hand (writes: test_revalidate).

Nothing here sleeps: `ManualClock.advance` fires what has come due and waits for the polls it started.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.changes import ChangeEvent, LocalCoordinator, PollCoordinator, WatchKey
from sidecar.config import PollingConfig
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import UpstreamUnavailable
from sidecar.watch.observe import Observation
from sidecar.watch.poller import Watch
from sidecar.watch.schedule import HintBudget, Schedule
from sidecar.watch.tickets import Tickets
from tests.unit.watch.manual_clock import ManualClock

CONFIG = PollingConfig(
    default_interval_ms=5000,
    min_interval_ms=250,
    max_interval_ms=60000,
    jitter=0.1,
    backoff_initial_ms=1000,
    backoff_max_ms=8000,
)


def _midpoint() -> Schedule:
    """rand() = 0.5 puts interval and backoff jitter at zero; a hint's own spread is then 0.0125 s. (A fresh one
    per watch: a schedule remembers when it last let a hint poll at once.)"""
    return Schedule(CONFIG, rand=lambda: 0.5)


HINT_SPREAD_S = 0.5 * CONFIG.jitter * CONFIG.min_interval_ms / 1000


class Upstream:
    """What the watch reads: a fingerprint the test sets, failures it injects, a gate to hold a poll open."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.fingerprint = "fp-0"
        self.ttl_ms = 2000
        self.failing = False
        self.crashing = False
        self.polled_at: list[float] = []
        self.held: asyncio.Event | None = None
        self.in_flight = 0
        self.most_in_flight = 0

    async def read(self, _: Watch) -> Observation:
        self.polled_at.append(self.clock.now())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.held is not None:
                await self.held.wait()
        finally:
            self.in_flight -= 1
        if self.failing:
            raise UpstreamUnavailable("test", "connection refused")
        if self.crashing:
            raise RuntimeError("a bug in the read")
        return Observation(self.fingerprint, self.ttl_ms, True)


def _watch(
    clock: ManualClock,
    upstream: Upstream,
    events: list[ChangeEvent],
    *,
    coordinator: PollCoordinator | None = None,
    budget: HintBudget | None = None,
    metrics: Metrics | None = None,
    uri: str = "x://1",
    schedule: Schedule | None = None,
) -> Watch:
    tickets = Tickets()

    async def sink(event: ChangeEvent) -> None:
        events.append(event)

    watch = Watch(
        WatchKey("resource", uri, "public"),
        Observation("fp-0", 2000, True),
        tickets.take(),
        schedule=schedule or _midpoint(),
        reader=upstream.read,
        sink=sink,
        gate=asyncio.Semaphore(4),
        tickets=tickets,
        metrics=metrics or Metrics(),
        on_auth_failure=lambda *_: None,
        coordinator=coordinator or LocalCoordinator(),
        budget=budget,
        clock=clock,
    )
    watch.start()
    return watch


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def upstream(clock: ManualClock) -> Upstream:
    return Upstream(clock)


@pytest.mark.invariant(9)
async def test_polls_once_per_ttl_and_reports_a_change_once(clock: ManualClock, upstream: Upstream) -> None:
    events: list[ChangeEvent] = []
    watch = _watch(clock, upstream, events)
    await clock.advance(1.999)
    assert upstream.polled_at == []
    await clock.advance(0.001)
    assert upstream.polled_at == [2.0]
    upstream.fingerprint = "fp-1"
    await clock.advance(2.0)
    await clock.advance(2.0)
    assert upstream.polled_at == [2.0, 4.0, 6.0]
    assert [event.fingerprint for event in events] == ["fp-1"]
    await watch.stop()


@pytest.mark.invariant(9)
async def test_failures_back_off_exponentially_then_the_interval_returns(
    clock: ManualClock, upstream: Upstream
) -> None:
    watch = _watch(clock, upstream, [])
    upstream.failing = True
    await clock.advance(2.0 + 1 + 2 + 4 + 8 + 8)
    assert upstream.polled_at == [2.0, 3.0, 5.0, 9.0, 17.0, 25.0]
    assert watch.consecutive_errors == 6
    upstream.failing = False
    await clock.advance(8.0 + 2.0)
    assert upstream.polled_at[-2:] == [33.0, 35.0]
    assert watch.consecutive_errors == 0
    await watch.stop()


async def test_a_hint_polls_after_min_interval_and_many_hints_are_one_poll(
    clock: ManualClock, upstream: Upstream
) -> None:
    watch = _watch(clock, upstream, [])
    await clock.advance(0.1)
    for _ in range(5):
        watch.hint()
    await clock.advance(0.5)
    assert upstream.polled_at == [pytest.approx(0.25 + HINT_SPREAD_S)]
    await clock.advance(1.0)
    assert len(upstream.polled_at) == 1, "the hints coalesced; the next poll is the regular one"
    await watch.stop()


async def test_a_hint_during_a_poll_adds_exactly_one_poll_after_it(clock: ManualClock, upstream: Upstream) -> None:
    watch = _watch(clock, upstream, [])
    upstream.held = asyncio.Event()
    await clock.advance(2.0)
    assert upstream.polled_at == [2.0]  # in flight, held open
    watch.hint()
    watch.hint()
    await clock.advance(0.1)
    upstream.held.set()
    upstream.held = None
    await clock.advance(0.5)
    assert upstream.polled_at == [2.0, pytest.approx(2.25 + HINT_SPREAD_S)]
    await watch.stop()


async def test_a_hint_between_the_timer_firing_and_its_poll_starting_adds_no_second_poll_beside_it(
    clock: ManualClock, upstream: Upstream
) -> None:
    # The timer's callback starts the poll as a task, which runs a loop turn later; a burst of writes whose
    # hints land in that turn found neither a timer nor a poll in flight, and armed a second poll beside it.
    watch = _watch(clock, upstream, [])
    upstream.held = asyncio.Event()
    await clock.advance(1.9)
    clock.fire_next()  # the regular poll at 2.0, not yet running
    watch.hint()
    await clock.advance(1.0)
    assert upstream.polled_at == [2.0] and upstream.most_in_flight == 1
    upstream.held.set()
    upstream.held = None
    await clock.advance(0.5)
    # Past min_interval_ms and the only hint of its spread: it polls at once, without a pause.
    assert upstream.polled_at == [2.0, pytest.approx(3.0)], "the hint is one poll after it"
    assert upstream.most_in_flight == 1
    await watch.stop()


async def test_a_lone_hint_past_min_interval_polls_at_once(clock: ManualClock, upstream: Upstream) -> None:
    # One write's key: nothing to spread it from, so no pause between the write's hint and its poll.
    watch = _watch(clock, upstream, [])
    await clock.advance(1.0)
    watch.hint()
    await clock.advance(0.0)
    assert upstream.polled_at == [1.0]
    await watch.stop()


@pytest.mark.invariant(9)
async def test_hints_to_many_watches_at_once_are_spread_after_the_first(clock: ManualClock) -> None:
    # A write hinting many keys must not fire their polls in one instant: the first polls at once, the others
    # over the spread (up to jitter x min_interval_ms); and a hint that waits out min_interval_ms is jittered.
    draws: list[float] = []
    schedule = Schedule(CONFIG, rand=lambda: draws.pop(0) if draws else 0.5)
    spread_s = CONFIG.jitter * CONFIG.min_interval_ms / 1000
    upstreams = [Upstream(clock) for _ in range(4)]
    watches = [_watch(clock, upstream, [], schedule=schedule) for upstream in upstreams]
    draws += [0.2, 0.6, 0.9]  # the hints' draws, after the starts' own (later ones draw 0.5)
    await clock.advance(1.0)
    for watch in watches:
        watch.hint()
    await clock.advance(0.1)
    polled = [upstream.polled_at for upstream in upstreams]
    assert polled == [[1.0], [pytest.approx(1.0 + 0.2 * spread_s)], [pytest.approx(1.0 + 0.6 * spread_s)],
                      [pytest.approx(1.0 + 0.9 * spread_s)]]  # fmt: skip
    watches[0].hint()  # 0.1 s after its poll: it waits out min_interval_ms, and that wait is jittered
    await clock.advance(0.5)
    assert upstreams[0].polled_at == [1.0, pytest.approx(1.25 + 0.5 * spread_s)]
    for watch in watches:
        await watch.stop()


@pytest.mark.invariant(9)
async def test_a_hint_never_cuts_a_backoff_short(clock: ManualClock, upstream: Upstream) -> None:
    watch = _watch(clock, upstream, [])
    upstream.failing = True
    await clock.advance(2.0)
    watch.hint()
    await clock.advance(0.999)
    assert upstream.polled_at == [2.0]
    await clock.advance(0.001)
    assert upstream.polled_at == [2.0, 3.0]
    await watch.stop()


async def test_a_stopped_watch_never_polls_again(clock: ManualClock, upstream: Upstream) -> None:
    watch = _watch(clock, upstream, [])
    await watch.stop()
    watch.hint()
    await clock.advance(60.0)
    assert upstream.polled_at == []


async def test_a_hint_after_a_poll_polls_min_interval_after_that_poll(clock: ManualClock, upstream: Upstream) -> None:
    watch = _watch(clock, upstream, [])
    await clock.advance(2.1)
    watch.hint()
    await clock.advance(0.5)
    assert upstream.polled_at == [2.0, pytest.approx(2.25 + HINT_SPREAD_S)]
    await watch.stop()


async def test_a_hint_just_before_a_regular_poll_is_answered_by_it_and_spends_no_budget(
    clock: ManualClock, upstream: Upstream
) -> None:
    budget, schedule = HintBudget(per_s=1), _midpoint()
    watch = _watch(clock, upstream, [], budget=budget, schedule=schedule)
    await clock.advance(1.995)
    schedule.hint_jitter_s(clock.now(), waits=False)  # another key was hinted first: this hint is spread
    watch.hint()  # a hinted poll could run at 2.0075 at the soonest: the regular one at 2.0 comes first
    await clock.advance(0.5)
    assert upstream.polled_at == [2.0]
    assert budget.slot(2.5) == 2.5, "the budget is whole"
    await watch.stop()


async def test_a_hint_during_a_poll_is_answered_by_the_next_regular_poll_when_that_comes_sooner(
    clock: ManualClock, upstream: Upstream
) -> None:
    upstream.ttl_ms = 250  # the next regular poll is min_interval_ms after this one: sooner than a hinted one
    watch = _watch(clock, upstream, [])
    upstream.held = asyncio.Event()
    await clock.advance(2.0)
    watch.hint()
    await clock.advance(0.1)
    upstream.held.set()
    upstream.held = None
    await clock.advance(0.2)
    assert upstream.polled_at == [2.0, 2.25]
    await watch.stop()


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


async def test_hinted_polls_past_the_budget_are_deferred_to_their_slot_and_counted_never_dropped(
    clock: ManualClock, upstream: Upstream
) -> None:
    metrics = Metrics()
    budget = HintBudget(per_s=1)
    watches = [_watch(clock, upstream, [], budget=budget, metrics=metrics, uri=f"x://{n}") for n in range(2)]
    await clock.advance(0.1)
    for watch in watches:
        watch.hint()
    await clock.advance(1.5)
    soonest = 0.25 + HINT_SPREAD_S
    assert upstream.polled_at == pytest.approx([soonest, soonest + 1.0])
    labels = {"limit": "hinted_polls"}
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_count", labels) == 1
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_sum", labels) == pytest.approx(1.0)
    for watch in watches:
        await watch.stop()


async def test_a_hint_deferred_past_the_next_regular_poll_leaves_that_poll_where_it_was(
    clock: ManualClock, upstream: Upstream
) -> None:
    budget = HintBudget(per_s=1)
    watches = [_watch(clock, upstream, [], budget=budget, uri=f"x://{n}") for n in range(3)]
    await clock.advance(0.1)
    for watch in watches:
        watch.hint()  # the last one's slot, 2.2625, is after its regular poll at 2.0
    await clock.advance(2.0)
    soonest = 0.25 + HINT_SPREAD_S
    assert upstream.polled_at == pytest.approx([soonest, soonest + 1.0, 2.0])
    for watch in watches:
        await watch.stop()


async def test_a_crashing_poll_is_logged_and_backs_off_like_a_failure(
    clock: ManualClock, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    watch = _watch(clock, upstream, [])
    upstream.crashing = True
    with caplog.at_level(logging.ERROR, logger="sidecar.watch.poller"):
        await clock.advance(2.0 + 1 + 2)
    assert upstream.polled_at == [2.0, 3.0, 5.0]
    assert watch.consecutive_errors == 3
    crashes = [record for record in caplog.records if record.getMessage() == "poll crashed"]
    assert len(crashes) == 3
    assert all(record.levelno == logging.ERROR and record.exc_info is not None for record in crashes)
    assert {(getattr(r, "watch", None), getattr(r, "kind", None)) for r in crashes} == {
        (watch.key.short_hash, "resource")
    }
    await watch.stop()


async def test_a_replica_that_may_not_poll_a_key_asks_again_an_interval_later(
    clock: ManualClock, upstream: Upstream
) -> None:
    asked: list[WatchKey] = []

    class Elsewhere(LocalCoordinator):
        def may_poll(self, key: WatchKey) -> bool:
            asked.append(key)
            return False

    watch = _watch(clock, upstream, [], coordinator=Elsewhere())
    await clock.advance(4.0)
    assert upstream.polled_at == []
    assert asked == [watch.key, watch.key]  # at 2.0 and 4.0
    await watch.stop()


async def test_a_key_the_upstreams_notifications_cover_polls_at_the_backstop_and_losing_the_cover_polls_soon(
    clock: ManualClock, upstream: Upstream
) -> None:
    schedule = Schedule(CONFIG.model_copy(update={"native_backstop_ms": 60_000}), rand=lambda: 0.5)
    watch = _watch(clock, upstream, [], schedule=schedule)
    watch.set_native(True)
    watch.set_native(True)
    assert watch.interval_s == 60.0
    await clock.advance(30.0)
    assert upstream.polled_at == [2.0], "the poll armed before the cover, then the backstop's 60 s"
    watch.set_native(False)
    await clock.advance(1.0)
    assert upstream.polled_at == [2.0, 30.0]  # polled soon: at once, the only key hinted (past min_interval_ms)
    assert watch.interval_s == 2.0
    await watch.stop()


async def test_the_upstream_answering_again_retries_a_failing_watch_once_per_failure_streak(
    clock: ManualClock, upstream: Upstream
) -> None:
    watch = _watch(clock, upstream, [])
    watch.recover()  # not failing: nothing to retry
    upstream.failing = True
    await clock.advance(2.1)  # failed at 2.0; backing off to 3.0
    watch.recover()
    await clock.advance(0.4)
    assert upstream.polled_at == [2.0, pytest.approx(2.25 + HINT_SPREAD_S)]  # failed again: backing off 2 s
    watch.recover()  # the same streak: no second retry
    await clock.advance(1.5)
    assert len(upstream.polled_at) == 2
    upstream.failing = False
    await clock.advance(1.0)  # the backoff's poll at 4.2625 succeeds: the streak is over
    upstream.failing = True
    await clock.advance(2.0)  # the regular poll at 6.2625 fails: a new streak, backing off to 7.2625
    watch.recover()
    await clock.advance(0.2)
    assert upstream.polled_at[2:] == pytest.approx(
        [4.2625, 6.2625, 7.0]
    )  # the retry at once: a lone key, past the floor
    await watch.stop()


async def test_stopping_a_watch_ends_its_poll_in_flight_and_stopping_twice_is_harmless(
    clock: ManualClock, upstream: Upstream
) -> None:
    idle = _watch(clock, upstream, [])
    await idle.stop()
    await idle.stop()
    busy = _watch(clock, upstream, [], uri="x://2")
    upstream.held = asyncio.Event()
    await clock.advance(2.0)
    assert upstream.in_flight == 1
    await busy.stop()
    await busy.stop()
    assert upstream.in_flight == 0
    await clock.advance(60.0)
    assert upstream.polled_at == [2.0]
