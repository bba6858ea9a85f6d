"""When a watch polls: interval, backoff, hints and the write debounce, on a clock the test moves by hand.

Nothing here sleeps: `ManualClock.advance` fires what has come due and waits for the polls it started.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

import pytest

from sidecar.changes import ChangeEvent, LocalCoordinator, WatchKey
from sidecar.config import PollingConfig
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import UpstreamUnavailable
from sidecar.watch.observe import Observation
from sidecar.watch.poller import Schedule, Watch
from sidecar.watch.revalidate import Revalidator

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


class _ManualTimer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self._when = when
        self.callback = callback
        self.cancelled = False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A Clock whose time moves only when the test says so."""

    def __init__(self) -> None:
        self._now = 0.0
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> _ManualTimer:
        timer = _ManualTimer(when, callback)
        heapq.heappush(self._timers, (when, next(self._order), timer))
        return timer

    async def advance(self, seconds: float) -> None:
        """Move time on, firing each due timer at its own time and letting what it started finish."""
        until = self._now + seconds
        await _settle()  # what the test just released runs first, and may arm timers
        while self._timers and self._timers[0][0] <= until:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.callback()
            await _settle()
        self._now = until

    def fire_next(self) -> None:
        """Fire the next timer now, and return before anything it started has run."""
        while self._timers:
            when, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self._now = max(self._now, when)
                timer.callback()
                return


async def _settle() -> None:
    """Wait until every task but this one has finished or is blocked on something the test controls."""
    while True:
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        if not others:
            return
        done, _ = await asyncio.wait(others, timeout=0)  # one turn of the loop for them
        if not done and all(_blocked(t) for t in others):
            return


def _blocked(task: asyncio.Task[object]) -> bool:
    waiter = getattr(task, "_fut_waiter", None)
    return waiter is not None and not waiter.done()


class Upstream:
    """What the watch reads: a fingerprint the test sets, failures it injects, a gate to hold a poll open."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.fingerprint = "fp-0"
        self.failing = False
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
        return Observation(self.fingerprint, 2000, True)


def _watch(
    clock: ManualClock, upstream: Upstream, events: list[ChangeEvent], schedule: Schedule | None = None
) -> Watch:
    tickets = itertools.count(1)

    async def sink(event: ChangeEvent) -> None:
        events.append(event)

    watch = Watch(
        WatchKey("resource", "x://1", "public"),
        Observation("fp-0", 2000, True),
        next(tickets),
        schedule=schedule or _midpoint(),
        reader=upstream.read,
        sink=sink,
        gate=asyncio.Semaphore(4),
        next_ticket=lambda: next(tickets),
        metrics=Metrics(),
        on_auth_failure=lambda *_: None,
        coordinator=LocalCoordinator(),
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
    watches = [_watch(clock, upstream, [], schedule) for upstream in upstreams]
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


async def test_writes_within_the_debounce_window_are_one_round_of_hints(clock: ManualClock) -> None:
    hinted: list[frozenset[str]] = []
    announced: list[frozenset[str]] = []

    class Coordinator(LocalCoordinator):
        async def announce_revalidate(self, contexts: frozenset[str]) -> None:
            announced.append(contexts)

    tasks: list[asyncio.Task[None]] = []
    revalidator = Revalidator(
        100,
        Coordinator(),
        lambda contexts, links: hinted.append(contexts),
        lambda coro: tasks.append(asyncio.ensure_future(coro)),
        clock,
    )
    revalidator.wrote("alice")
    await clock.advance(0.05)
    revalidator.wrote("bob")
    revalidator.wrote("alice")
    await clock.advance(0.049)
    assert hinted == []
    await clock.advance(0.001)
    assert hinted == [frozenset({"alice", "bob"})]
    assert announced == [frozenset({"alice", "bob"})]
    revalidator.wrote("carol")
    await clock.advance(0.1)
    assert hinted[-1] == frozenset({"carol"})
