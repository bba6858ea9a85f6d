"""`polling.max_reads_per_s` and `polling.rules` in the engine: a real `WatchRegistry` on the hand-moved clock,
reading a scripted upstream that counts its reads. Figures here are engine time, not machine speed."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import pytest

from sidecar.bus.memory import MemoryBus
from sidecar.changes import ChangeEvent, WatchKey
from sidecar.config import PollingConfig
from sidecar.config.polling_rules import PollingRule
from sidecar.fair_share import FairShare
from sidecar.identity import ANONYMOUS_IDENTITY, PUBLIC, Identity
from sidecar.observability.metrics import Metrics
from sidecar.upstream.base import Upstream
from sidecar.watch.budget import ReadBudget
from tests.unit.watch.bounded_registry import BoundedRegistry
from tests.unit.watch.manual_clock import ManualClock, run_polls
from tests.unit.watch.scripted_upstream import ScriptedUpstream, contents

BUDGET = PollingConfig(
    default_interval_ms=200,
    min_interval_ms=200,
    max_interval_ms=10_000,
    max_reads_per_s=60,
    max_baselines_per_s=10_000,
    max_hinted_polls_per_s=10_000,
    revalidate_debounce_ms=0,
)
"""300 keys wanting a read every 200 ms (1,500 a second) against 60 a second; every key read every 10 s at least."""
HOT, KEYS = 30, 300


class CountingUpstream(ScriptedUpstream):
    """The scripted upstream, noting when (on the engine's clock) each URI was read."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.read_at: dict[str, list[float]] = {}

    async def call(self, method: str, params: dict[str, object], identity: Identity) -> dict[str, object]:
        if method == "resources/read":
            self.read_at.setdefault(str(params["uri"]), []).append(self.clock.now())
        return await super().call(method, params, identity)

    def longest_unread(self, since: float, until: float) -> float:
        """The longest any URI went without a read between `since` and `until`."""
        gaps = []
        for times in self.read_at.values():
            edges = [since, *(t for t in times if since < t < until), until]
            gaps.append(max(b - a for a, b in itertools.pairwise(edges)))
        return max(gaps)


class Bench:
    """A real registry over the counting upstream, on the hand-moved clock."""

    def __init__(self, config: PollingConfig) -> None:
        self.clock = ManualClock()
        self.upstream = CountingUpstream(self.clock)
        self.bus = MemoryBus()
        self.metrics = Metrics()
        fair = FairShare(capacity=64, per_client=64, max_queued_per_client=10_000, metrics=self.metrics)
        self.registry = BoundedRegistry(
            cast(Upstream, self.upstream), config, self.bus, self.metrics, fair, clock=self.clock
        )
        self.told: list[tuple[float, ChangeEvent]] = []
        self.bus.subscribe(lambda event: self.told.append((self.clock.now(), event)))

    async def run(self, seconds: float) -> None:
        """Move the clock on by `seconds`, each poll starting at its own time and ending before time moves on."""
        await run_polls(self.clock, seconds, lambda: self.registry.polls_in_flight)

    def watched(self) -> set[str | None]:
        return {watch.key.uri for watch in self.registry.watches()}

    def only_polls_armed(self) -> bool:
        """No poll in flight, and on the clock only each watch's next poll: one timer a watch, none of a watch
        that has stopped (its next poll, its linger) left armed."""
        return self.registry.polls_in_flight == 0 and self.clock.pending() == len(self.registry.watches())

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def poll_gaps(self, since: float) -> list[float]:
        """The time between each two reads after `since` (of any keys), in order."""
        times = sorted(at for reads in self.upstream.read_at.values() for at in reads if at > since)
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    def reads(self) -> list[str]:
        return [uri for method, uri, _ in self.upstream.calls if method == "resources/read"]

    async def watch(self, uris: list[str]) -> None:
        for uri in uris:
            self.upstream.resources[uri] = contents(uri, "0")
            assert await self.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None


@pytest.fixture
async def bench() -> AsyncIterator[Bench]:
    bench = Bench(BUDGET)
    yield bench
    await bench.registry.aclose()


def _uris() -> list[str]:
    return [f"bench://hot/{n}" for n in range(HOT)] + [f"bench://cold/{n}" for n in range(KEYS - HOT)]


@pytest.mark.invariant(21)
async def test_polls_never_exceed_the_budget_and_every_key_is_read_within_its_maximum_interval(bench: Bench) -> None:
    uris = _uris()
    await bench.watch(uris)
    start, first = bench.clock.now(), len(bench.reads())
    for _ in range(300):
        await bench.run(0.1)
    polls = bench.reads()[first:]
    # The rule, over the time that actually elapsed on the engine's clock (not a count over wall time): at most the
    # budget's reads a second (plus the one on the window's edge), and the budget spent, not left idle: the wanted
    # schedule asks for 1,500 a second, so all of the scheduled share (nine tenths) goes to polls, less jitter.
    elapsed = bench.clock.now() - start
    assert elapsed == pytest.approx(30.0)
    assert len(polls) <= BUDGET.max_reads_per_s * elapsed + 1
    assert len(polls) >= 0.8 * BUDGET.max_reads_per_s * elapsed, "the budget is spent, not left idle"
    assert set(polls) == set(uris), "no key went unread for its maximum interval"
    # Its slots are what keeps it: no two polls closer than one over the budget, so no second, wherever it starts,
    # holds more; the polls that came due over it waited for theirs, as the metrics tell.
    assert min(bench.poll_gaps(start)) >= 1 / BUDGET.max_reads_per_s - 1e-9
    assert bench.gauge("mcp_sidecar_read_budget_per_second") == BUDGET.max_reads_per_s
    assert (bench.gauge("mcp_sidecar_queue_wait_seconds_count", limit="read_budget") or 0) > 0
    assert bench.upstream.longest_unread(start, bench.clock.now()) <= BUDGET.max_interval_ms / 1000, "nor for longer"


@pytest.mark.invariant(21)
async def test_hinted_polls_count_against_the_budget(bench: Bench) -> None:
    await bench.watch(_uris()[:40])
    start, first = bench.clock.now(), len(bench.reads())
    for _ in range(200):
        bench.registry.hearing.wrote(ANONYMOUS_IDENTITY.context)  # a write every 50 ms hints every public watch
        await bench.run(0.05)
    elapsed = bench.clock.now() - start
    assert elapsed == pytest.approx(10.0)
    assert len(bench.reads()) - first <= BUDGET.max_reads_per_s * elapsed + 1
    assert min(bench.poll_gaps(start)) >= 1 / BUDGET.max_reads_per_s - 1e-9, "a hinted poll takes a slot too"


async def _staleness(policy: str) -> tuple[list[float], float]:
    """Every hot key changes each second for a minute: each change's wait until it is told, and the longest any
    key went unread."""
    config = BUDGET.model_copy(update={"allocation": policy})
    bench = Bench(config)
    try:
        uris = _uris()
        await bench.watch(uris)
        changed: dict[str, list[float]] = {uri: [] for uri in uris[:HOT]}
        for second in range(60):
            for uri in uris[:HOT]:
                bench.upstream.resources[uri] = contents(uri, str(second + 1))
                changed[uri].append(bench.clock.now())
            for _ in range(10):
                await bench.run(0.1)
        waits = []
        for uri, times in changed.items():
            told = sorted(at for at, event in bench.told if event.key.uri == uri and not event.baseline)
            for at in times[10:]:  # after the first ten seconds, once rates are known
                later = [t for t in told if t >= at]
                if later:
                    waits.append(later[0] - at)
        return waits, bench.upstream.longest_unread(10.0, bench.clock.now())
    finally:
        await bench.registry.aclose()


@pytest.mark.invariant(21)
async def test_adaptive_spends_the_budget_where_changes_are() -> None:
    adaptive, adaptive_unread = await _staleness("adaptive")
    uniform, uniform_unread = await _staleness("uniform")
    assert statistics.mean(adaptive) <= 0.6 * statistics.mean(uniform), (
        statistics.mean(adaptive),
        statistics.mean(uniform),
    )
    # No cold key waits longer than its maximum interval (a slot of the budget late at most).
    assert max(adaptive_unread, uniform_unread) <= BUDGET.max_interval_ms / 1000 + 0.2


async def test_a_rule_sets_a_keys_interval_and_ignores_its_noise() -> None:
    rule = PollingRule.model_validate(
        {"match": "report://*", "interval_ms": 1000, "ignore": {"json_pointers": ["/generatedAt"]}}
    )
    bench = Bench(PollingConfig(default_interval_ms=5000, jitter=0.0, rules=[rule]))
    try:
        uri = "report://daily"
        bench.upstream.resources[uri] = contents(uri, '{"total": 1, "generatedAt": 0}')
        await bench.watch([])
        assert await bench.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None
        for stamp in range(1, 6):
            bench.upstream.resources[uri] = contents(uri, f'{{"total": 1, "generatedAt": {stamp}}}')
            await bench.run(1.0)
        assert len(bench.reads()) == 6, "read every second (its rule), not every 5 s (the default)"
        assert [event for _, event in bench.told if not event.baseline] == [], "a new stamp is no change"
        bench.upstream.resources[uri] = contents(uri, '{"total": 2, "generatedAt": 9}')
        await bench.run(1.0)
        assert len([event for _, event in bench.told if not event.baseline]) == 1
    finally:
        await bench.registry.aclose()


async def test_a_watch_stopped_and_started_again_starts_from_a_fresh_change_rate() -> None:
    """A key's change rate is learnt by its watch: once the watch ends, a watch of the same key started later is
    allocated like a key never seen (as a brand-new key started with it is), not at the pace its old one earned."""
    config = BUDGET.model_copy(update={"max_reads_per_s": 10, "jitter": 0.0, "linger_ms": 1000})
    bench = Bench(config)
    try:
        hot, new = "bench://hot/0", "bench://new/0"
        cold = [f"bench://cold/{n}" for n in range(38)]
        bench.upstream.resources[hot] = contents(hot, "0")
        bench.upstream.resources[new] = contents(new, "0")
        await bench.watch(cold)
        handle = await bench.registry.acquire("resource", hot, ANONYMOUS_IDENTITY)
        assert handle is not None
        for tick in range(200):  # 20 s of a key changing at every look: the budget goes to it
            bench.upstream.resources[hot] = contents(hot, str(tick))
            await bench.run(0.1)
        learnt = bench.reads().count(hot)
        assert learnt >= 20, f"a key seen changing is polled far more often than every 10 s: {learnt} reads in 20 s"
        handle.release()
        await bench.run(1.0)  # its linger runs out at the end: the watch stops
        assert hot not in bench.watched()
        assert bench.only_polls_armed(), "the stopped watch's next poll called off"
        for uri in (hot, new):
            assert await bench.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None
        before = bench.reads()
        await bench.run(10.0)
        after = bench.reads()[len(before) :]
        assert after.count(hot) <= after.count(new) + 1, (after.count(hot), after.count(new))
    finally:
        await bench.registry.aclose()


async def test_keys_left_by_others_that_stopped_are_read_sooner_than_their_armed_polls() -> None:
    """Fifty keys share 9 reads a second (one every 5.6 s each); when forty stop, the next allocation gives the ten
    left one every 1.1 s, and each is re-armed for that at once, not only after the poll it was armed for."""
    config = BUDGET.model_copy(update={"max_reads_per_s": 10, "jitter": 0.0, "linger_ms": 0})
    bench = Bench(config)
    try:
        uris = [f"bench://key/{n}" for n in range(50)]
        kept = uris[::5]  # their next polls spread over the whole 5.6 s
        handles = []
        for uri in uris:
            bench.upstream.resources[uri] = contents(uri, "0")
            handle = await bench.registry.acquire("resource", uri, ANONYMOUS_IDENTITY)
            assert handle is not None
            handles.append(handle)
        await bench.run(20.0)
        assert bench.poll_gaps(15.0)[0] == pytest.approx(0.1), "the budget spent: a poll every slot"
        stopped = bench.clock.now()
        for uri, handle in zip(uris, handles, strict=True):
            if uri not in kept:
                handle.release()
        await bench.run(0.0)  # no linger: they stop now
        assert bench.watched() == set(kept)
        await bench.run(6.0)
        waited = {uri: min(at for at in bench.upstream.read_at[uri] if at > stopped) - stopped for uri in kept}
        # Within the allocation's second, plus the new interval, plus the slots of the others re-armed with it.
        assert max(waited.values()) < 2.0, waited
    finally:
        await bench.registry.aclose()


# -- the budget on its own: watches, polls and a clock set by hand in, slots and intervals out -------------------


class _Now:
    """The time the test hands the budget with each call (it reads no clock)."""

    def __init__(self, at: float) -> None:
        self.at = at


@dataclass
class _Watch:
    key: WatchKey
    wanted_ms: float = 10.0
    refs: int = 1
    tightened: int = 0

    def tighten(self) -> None:
        self.tightened += 1


def _key(name: str) -> WatchKey:
    return WatchKey("resource", f"x://{name}", PUBLIC)


class _Budget:
    def __init__(self, watches: list[_Watch], *, per_s: float = 10.0, replicas: int = 1, **config: Any) -> None:
        self.watches, self.clock = watches, _Now(100.0)
        self.native: set[WatchKey] = set()
        defaults = {"allocation": "uniform", "jitter": 0.0, "max_interval_ms": 100_000}
        polling = PollingConfig.model_validate({**defaults, **config, "max_reads_per_s": per_s})
        self.replicas = replicas
        self.budget: ReadBudget[_Watch] = ReadBudget(polling)

    def per_s(self) -> float:
        return self.budget.per_s(self.replicas)

    def slot(self, earliest: float, *, hinted: bool) -> float:
        return self.budget.slot(earliest, hinted=hinted, replicas=self.replicas)

    def interval_ms(self, watch: _Watch) -> float:
        """`watch`'s interval now, as the engine asks it (allocating anew, over the keys held and polled here, when
        the last allocation is stale); then, as the engine does after each step, what it shortened is re-armed."""
        if self.budget.stale(watch.key, self.clock.at):
            polled = [held for held in self.watches if held.refs and held.key not in self.native]
            self.budget.allocate(self.clock.at, polled, self.replicas)
        interval = self.budget.interval_ms(watch)
        for tightened in self.budget.take_tightened():
            tightened.tighten()
        return interval

    def intervals(self) -> list[float]:
        return [self.interval_ms(watch) for watch in self.watches]

    def reads_per_s(self) -> float:
        return sum(1000 / interval for interval in self.intervals())


def test_a_replicas_share_is_the_fleets_budget_over_the_live_replicas() -> None:
    assert _Budget([], per_s=60, replicas=3).per_s() == 20
    assert _Budget([], per_s=60, replicas=0).per_s() == 60, "no live replica known: this one is all"


def test_polls_take_slots_one_over_the_budget_apart_and_a_later_one_waits_for_nothing() -> None:
    budget = _Budget([], per_s=4)
    assert [budget.slot(100.0, hinted=False) for _ in range(3)] == [100.0, 100.25, 100.5]
    assert budget.slot(100.6, hinted=True) == 100.75
    assert budget.slot(200.0, hinted=False) == 200.0


@pytest.mark.invariant(21)
def test_hinted_polls_leave_the_regular_ones_less_of_the_budget_and_fade_with_a_ten_second_half_life() -> None:
    bench = _Budget([_Watch(_key(str(n))) for n in range(10)], per_s=10)
    assert bench.reads_per_s() == pytest.approx(9.0, rel=1e-9), "a tenth of the budget left for jitter"
    for _ in range(50):
        bench.slot(100.0, hinted=True)
    hinted = 50 * math.log(2) / 10
    bench.clock.at = 101.0
    assert bench.reads_per_s() == pytest.approx(9.0 - hinted * 2**-0.1, rel=1e-9)
    bench.clock.at = 111.0
    assert bench.reads_per_s() == pytest.approx(9.0 - hinted * 2**-1.1, rel=1e-9)


@pytest.mark.parametrize(("jitter", "floor_ms"), [(0.1, 10_000 * 0.9 / 1.1), (0.0, 10_000 * 0.95)])
def test_when_hinted_polls_take_the_whole_budget_every_key_falls_to_its_floor(jitter: float, floor_ms: float) -> None:
    bench = _Budget([_Watch(_key("a")), _Watch(_key("b"))], per_s=1, jitter=jitter, max_interval_ms=10_000)
    for _ in range(20):
        bench.slot(100.0, hinted=True)  # about 1.4 hinted polls a second against 0.9 to spend
    # Jittered, the floor stays within max_interval_ms less a margin for the wait for a slot.
    assert bench.intervals() == pytest.approx([floor_ms, floor_ms], rel=1e-9)


def test_a_key_seen_changing_is_polled_more_often_than_one_never_seen_changing_until_it_is_forgotten() -> None:
    hot, unseen, quiet = _Watch(_key("hot")), _Watch(_key("unseen")), _Watch(_key("quiet"))
    bench = _Budget([hot, unseen, quiet], per_s=10, allocation="adaptive")
    bench.budget.polled(hot.key, True, 10.0)  # one change in ten seconds: under one a second
    for _ in range(3):
        bench.budget.polled(hot.key, False, 10.0)
        bench.budget.polled(quiet.key, False, 10.0)
    fast, slow, quiet_ms = bench.intervals()
    assert fast < slow == quiet_ms
    bench.budget.forget(hot.key)
    # Forgotten, it is a new key: allocated anew at once, like the keys never seen changing.
    assert bench.intervals() == pytest.approx([3000 / 9] * 3, rel=1e-9)


def test_a_key_never_polled_nor_allocated_is_forgotten_without_fuss() -> None:
    # A watch can end before its first poll (its linger ran out first) and before any allocation counted it.
    bench = _Budget([], per_s=10)
    bench.budget.forget(_key("never"))
    quiet = _Watch(_key("quiet"))
    bench.watches.append(quiet)
    bench.interval_ms(quiet)  # allocated, never polled: no change rate yet
    bench.budget.forget(quiet.key)


def test_more_holders_of_a_key_get_it_polled_more_often() -> None:
    shared, single = _Watch(_key("shared"), refs=4), _Watch(_key("single"))
    bench = _Budget([shared, single], per_s=10, allocation="adaptive")
    for watch in (shared, single):
        bench.budget.polled(watch.key, True, 10.0)
    many, one = bench.intervals()
    assert one == pytest.approx(2 * many), "in proportion to the square root of the holders"


def test_an_allocation_is_kept_for_a_second_and_a_new_key_gets_its_own_at_once() -> None:
    first, second, third = _Watch(_key("1")), _Watch(_key("2")), _Watch(_key("3"))
    bench = _Budget([first], per_s=10)
    assert bench.interval_ms(first) == pytest.approx(1000 / 9, rel=1e-9)
    bench.clock.at = 100.5
    bench.watches.append(second)
    assert bench.interval_ms(second) == pytest.approx(2000 / 9, rel=1e-9), "not its wanted 10 ms"
    bench.clock.at = 101.0
    bench.watches.append(third)
    assert bench.interval_ms(first) == pytest.approx(2000 / 9, rel=1e-9), "kept for a second"
    bench.clock.at = 101.5
    assert bench.interval_ms(first) == pytest.approx(3000 / 9, rel=1e-9), "a second on: allocated anew"


def test_a_watch_nobody_holds_or_one_the_upstream_notifies_of_spends_none_of_the_budget() -> None:
    polled, unheld, native = _Watch(_key("polled")), _Watch(_key("unheld"), refs=0), _Watch(_key("native"))
    bench = _Budget([polled, unheld, native], per_s=10)
    bench.native.add(native.key)
    assert bench.intervals() == pytest.approx([1000 / 9, 10.0, 10.0], rel=1e-9)


def test_while_the_budget_covers_everyone_each_key_keeps_its_wanted_interval_exactly() -> None:
    slow = _Watch(_key("slow"), wanted_ms=1000.0)
    bench = _Budget([slow], per_s=10)
    assert bench.intervals() == [1000.0]
    assert slow.tightened == 0


def test_a_key_whose_interval_shrinks_by_more_than_a_fifth_is_rearmed_at_once() -> None:
    first = _Watch(_key("first"))
    others = [_Watch(_key(str(n))) for n in range(4)]
    bench = _Budget([first], per_s=10)
    bench.intervals()
    bench.watches.extend(others)
    bench.clock.at = 101.0
    bench.intervals()
    assert first.tightened == 0, "a longer interval waits for the poll already armed"
    del bench.watches[1:]
    bench.clock.at = 102.0
    bench.intervals()
    assert first.tightened == 1
    bench.clock.at = 103.0
    bench.intervals()
    assert first.tightened == 1, "the same interval again: nothing to re-arm"


def test_an_interval_shrunk_by_exactly_a_fifth_waits_for_the_poll_already_armed() -> None:
    watch = _Watch(_key("ttl"), wanted_ms=1250.0)
    bench = _Budget([watch], per_s=10)
    assert bench.intervals() == [1250.0]
    watch.wanted_ms = 1000.0  # its ttlMs shortened: within the budget, the wanted interval is its interval
    bench.clock.at = 101.0
    assert bench.intervals() == [1000.0]
    assert 1.0 == 1.25 * 0.8 and watch.tightened == 0, "below four fifths re-arms; four fifths exactly does not"
    watch.wanted_ms = 790.0
    bench.clock.at = 102.0
    bench.intervals()
    assert watch.tightened == 1
