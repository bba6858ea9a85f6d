"""The poll plan's driver (`Watch`): it arms the plan's timers on the clock, runs the polls they ask for, and
reports how each went (a crash, a lease held elsewhere, the upstream's cover). When it polls is the plan's, whose
playbooks are in `test_schedules`.

The clock is moved by hand, one timer at a time (`ManualClock.fire_next`); each wait names what it waits for (the
poll asked of the upstream, the next timer armed), never a turn of the loop.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.changes import ChangeEvent, LocalCoordinator, PollCoordinator, WatchKey
from sidecar.config import PollingConfig
from sidecar.observability.metrics import Metrics
from sidecar.protocol.errors import UpstreamUnavailable
from sidecar.watch.budget import ReadBudget
from sidecar.watch.observation import Observation
from sidecar.watch.poller import Watch
from sidecar.watch.schedule import HintBudget, Schedule
from sidecar.watch.tickets import Tickets
from tests.kit import eventually
from tests.unit.watch.manual_clock import ManualClock

CONFIG = PollingConfig(
    default_interval_ms=5000,
    min_interval_ms=250,
    max_interval_ms=60000,
    jitter=0.1,
    backoff_initial_ms=1000,
    backoff_max_ms=8000,
)


class Upstream:
    """What the watch reads: a fingerprint the test sets, failures it injects, a gate to hold a poll open."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.fingerprint = "fp-0"
        self.failing = False
        self.crashing = False
        self.polled_at: list[float] = []
        self.held: asyncio.Event | None = None
        self.in_flight = 0

    async def read(self, _: Watch) -> Observation:
        self.polled_at.append(self.clock.now())
        self.in_flight += 1
        try:
            if self.held is not None:
                await self.held.wait()
        finally:
            self.in_flight -= 1
        if self.failing:
            raise UpstreamUnavailable("test", "connection refused")
        if self.crashing:
            raise RuntimeError("a bug in the read")
        return Observation(self.fingerprint, 2000, True)


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
    reads: ReadBudget | None = None,
) -> Watch:
    tickets = Tickets()

    async def sink(event: ChangeEvent) -> None:
        events.append(event)

    watch = Watch(
        WatchKey("resource", uri, "public"),
        Observation("fp-0", 2000, True),
        tickets.take(),
        schedule=schedule or Schedule(CONFIG, rand=lambda: 0.5),
        reader=upstream.read,
        sink=sink,
        gate=asyncio.Semaphore(4),
        tickets=tickets,
        metrics=metrics or Metrics(),
        on_auth_failure=lambda *_: None,
        coordinator=coordinator or LocalCoordinator(),
        budget=budget,
        clock=clock,
        reads=reads,
        holders=lambda key: 1,  # one stream holds it
    )
    watch.start()
    return watch


async def _poll(clock: ManualClock, *, armed: int = 1) -> None:
    """Fire the next timer and wait for the poll it starts to end: the next one armed (`armed` timers pending)."""
    clock.fire_next()
    await clock.until(lambda: clock.pending() == armed, f"the poll ended with {armed} timers armed")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def upstream(clock: ManualClock) -> Upstream:
    return Upstream(clock)


@pytest.mark.invariant(9)
async def test_polls_at_the_timers_the_plan_arms_and_publishes_a_change_once(
    clock: ManualClock, upstream: Upstream
) -> None:
    events: list[ChangeEvent] = []
    metrics = Metrics()
    watch = _watch(clock, upstream, events, metrics=metrics)
    assert clock.pending() == 1 and upstream.polled_at == []
    await _poll(clock)
    upstream.fingerprint = "fp-1"
    await _poll(clock)
    await _poll(clock)
    assert upstream.polled_at == [2.0, 4.0, 6.0]
    assert [event.fingerprint for event in events] == ["fp-1"]
    found = metrics.registry.get_sample_value("mcp_sidecar_poll_changes_total", {"kind": "resource"})
    assert found == 1, "one of the three polls found a change"
    await watch.stop()
    assert clock.pending() == 0


async def test_a_crashing_poll_is_logged_and_backs_off_like_a_failure(
    clock: ManualClock, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    watch = _watch(clock, upstream, [])
    upstream.crashing = True
    with caplog.at_level(logging.ERROR, logger="sidecar.watch.poller"):
        for _ in range(3):
            await _poll(clock)
    assert upstream.polled_at == [2.0, 3.0, 5.0]
    assert watch.consecutive_errors == 3
    crashes = [record for record in caplog.records if record.getMessage() == "poll crashed"]
    assert len(crashes) == 3
    assert all(record.levelno == logging.ERROR and record.exc_info is not None for record in crashes)
    assert {(getattr(r, "watch", None), getattr(r, "kind", None)) for r in crashes} == {
        (watch.key.short_hash, "resource")
    }
    await watch.stop()


async def test_a_poll_that_succeeds_after_a_failure_ends_the_backoff(clock: ManualClock, upstream: Upstream) -> None:
    watch = _watch(clock, upstream, [])
    upstream.failing = True
    await _poll(clock)  # fails: the next poll a backoff later (1 s)
    upstream.failing = False
    for _ in range(3):
        await _poll(clock)  # answered: from then on at its interval (2 s)
    assert upstream.polled_at == [2.0, 3.0, 5.0, 7.0]
    assert watch.consecutive_errors == 0
    await watch.stop()


async def test_a_replica_that_may_not_poll_a_key_asks_again_an_interval_later(
    clock: ManualClock, upstream: Upstream
) -> None:
    asked: list[tuple[WatchKey, float]] = []

    class Elsewhere(LocalCoordinator):
        def may_poll(self, key: WatchKey) -> bool:
            asked.append((key, clock.now()))
            return False

    watch = _watch(clock, upstream, [], coordinator=Elsewhere())
    await _poll(clock)
    await _poll(clock)
    assert upstream.polled_at == []
    assert asked == [(watch.key, 2.0), (watch.key, 4.0)]
    assert watch.consecutive_errors == 0
    await watch.stop()


async def test_a_key_the_upstreams_notifications_cover_polls_at_the_backstop_and_losing_the_cover_polls_soon(
    clock: ManualClock, upstream: Upstream
) -> None:
    schedule = Schedule(CONFIG.model_copy(update={"native_backstop_ms": 60_000}), rand=lambda: 0.5)
    watch = _watch(clock, upstream, [], schedule=schedule)
    watch.set_native(True)
    watch.set_native(True)
    assert watch.interval_s == 60.0
    await _poll(clock)  # the poll armed before the cover
    clock.advance_to(30.0)
    assert upstream.polled_at == [2.0] and clock.pending() == 1, "then the backstop's 60 s"
    watch.set_native(False)
    await _poll(clock)  # polled soon: at once, the only key hinted (past min_interval_ms)
    assert upstream.polled_at == [2.0, 30.0]
    assert watch.interval_s == 2.0
    await watch.stop()


async def test_hinted_polls_deferred_by_the_budget_are_counted_as_a_wait(
    clock: ManualClock, upstream: Upstream
) -> None:
    metrics, budget = Metrics(), HintBudget(per_s=1)
    watches = [_watch(clock, upstream, [], budget=budget, metrics=metrics, uri=f"x://{n}") for n in range(2)]
    clock.advance_to(0.1)
    for watch in watches:
        watch.hint()
    labels = {"limit": "hinted_polls"}
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_count", labels) == 1
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_sum", labels) == pytest.approx(1.0)
    for watch in watches:
        await watch.stop()


async def test_stopping_a_watch_ends_its_poll_in_flight_and_stopping_twice_is_harmless(
    clock: ManualClock, upstream: Upstream
) -> None:
    idle = _watch(clock, upstream, [])
    await idle.stop()
    await idle.stop()
    assert clock.pending() == 0
    busy = _watch(clock, upstream, [], uri="x://2")
    upstream.held = asyncio.Event()
    clock.fire_next()
    await eventually(lambda: upstream.in_flight == 1)
    await busy.stop()
    await busy.stop()
    assert upstream.in_flight == 0
    assert clock.pending() == 0, "nothing armed after it"
    assert upstream.polled_at == [2.0]


def _budgeted(clock: ManualClock, upstream: Upstream, metrics: Metrics) -> list[Watch]:
    """Two watches wanting a poll every 2 s each (1 a second) under a budget of 1 read a second (0.9 of it for
    regular polls): from the allocation a second on, each is given 1 / 0.45 s (their first polls, armed before it,
    are due at 2 s)."""
    config = CONFIG.model_copy(update={"max_reads_per_s": 1, "jitter": 0.0})
    watches: list[Watch] = []
    reads = ReadBudget(config, watches=lambda: watches, may_poll=lambda key: True)
    schedule = Schedule(config)
    for n in range(2):
        watches.append(_watch(clock, upstream, [], metrics=metrics, uri=f"x://{n}", schedule=schedule, reads=reads))
    clock.advance_to(1.0)
    assert [watch.interval_s for watch in watches] == pytest.approx([1 / 0.45] * 2)
    return watches


async def test_a_poll_over_the_read_budget_waits_for_its_slot_and_only_that_wait_is_counted(
    clock: ManualClock, upstream: Upstream
) -> None:
    metrics = Metrics()
    watches = _budgeted(clock, upstream, metrics)
    armed = clock.armed
    assert clock.advance(1.0) == 2
    await clock.until_armed(armed + 2, "one poll ended, the other waiting for its slot")
    assert upstream.polled_at == [2.0], "the first takes the free slot at once"
    labels = {"limit": "read_budget"}
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_count", labels) == 1
    assert metrics.registry.get_sample_value("mcp_sidecar_queue_wait_seconds_sum", labels) == pytest.approx(1.0)
    assert metrics.registry.get_sample_value("mcp_sidecar_read_budget_per_second") == 1, "the share it polls under"
    assert metrics.registry.get_sample_value("mcp_sidecar_read_budget_per_second") == 1, "the share it polls under"
    armed = clock.armed
    assert clock.advance(1.0) == 1
    await clock.until_armed(armed + 1, "the second poll, in its slot a second later")
    assert upstream.polled_at == [2.0, 3.0]
    for watch in watches:
        await watch.stop()


@pytest.mark.invariant(21)
async def test_hinted_polls_take_their_slots_as_hinted_and_leave_the_regular_ones_less_of_the_budget(
    clock: ManualClock, upstream: Upstream
) -> None:
    watches = _budgeted(clock, upstream, Metrics())
    before = watches[0].interval_s
    for watch in watches:
        watch.hint()  # polled at once (min_interval_ms has passed since their first look), in slots a second apart
    armed = clock.armed
    assert clock.advance(0.0) == 2
    await clock.until_armed(armed + 2, "one hinted poll ended, the other waiting for its slot")
    armed = clock.armed
    assert clock.advance(1.0) == 1
    await clock.until_armed(armed + 1, "the second hinted poll ended")
    assert len(upstream.polled_at) == 2
    assert watches[0].interval_s > 1.1 * before, "the budget's allocation leaves room for the hinted polls"
    for watch in watches:
        await watch.stop()
