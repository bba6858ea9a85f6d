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


class Engine:
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

    def reads(self) -> list[str]:
        return [uri for method, uri, _ in self.upstream.calls if method == "resources/read"]

    async def watch(self, uris: list[str]) -> None:
        for uri in uris:
            self.upstream.resources[uri] = contents(uri, "0")
            assert await self.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    engine = Engine(BUDGET)
    yield engine
    await engine.registry.aclose()


def _uris() -> list[str]:
    return [f"bench://hot/{n}" for n in range(HOT)] + [f"bench://cold/{n}" for n in range(KEYS - HOT)]


@pytest.mark.invariant(21)
async def test_polls_never_exceed_the_budget_and_every_key_is_read_within_its_maximum_interval(engine: Engine) -> None:
    uris = _uris()
    await engine.watch(uris)
    start, first = engine.clock.now(), len(engine.reads())
    for _ in range(300):
        await run_polls(engine.clock, 0.1)
    polls = engine.reads()[first:]
    # The rule, over the time that actually elapsed on the engine's clock (not a count over wall time): at most the
    # budget's reads a second (plus the one on the window's edge), and the budget spent, not left idle: the wanted
    # schedule asks for 1,500 a second, so all of the scheduled share (nine tenths) goes to polls, less jitter.
    elapsed = engine.clock.now() - start
    assert elapsed == pytest.approx(30.0)
    assert len(polls) <= BUDGET.max_reads_per_s * elapsed + 1
    assert len(polls) >= 0.8 * BUDGET.max_reads_per_s * elapsed, "the budget is spent, not left idle"
    assert set(polls) == set(uris), "no key went unread for its maximum interval"


@pytest.mark.invariant(21)
async def test_hinted_polls_count_against_the_budget(engine: Engine) -> None:
    await engine.watch(_uris()[:40])
    start, first = engine.clock.now(), len(engine.reads())
    for _ in range(200):
        engine.registry.revalidate(ANONYMOUS_IDENTITY)  # a write every 50 ms hints every public watch
        await run_polls(engine.clock, 0.05)
    elapsed = engine.clock.now() - start
    assert elapsed == pytest.approx(10.0)
    assert len(engine.reads()) - first <= BUDGET.max_reads_per_s * elapsed + 1


async def _staleness(policy: str) -> tuple[list[float], float]:
    """Every hot key changes each second for a minute: each change's wait until it is told, and the longest any
    key went unread."""
    config = BUDGET.model_copy(update={"allocation": policy})
    engine = Engine(config)
    try:
        uris = _uris()
        await engine.watch(uris)
        changed: dict[str, list[float]] = {uri: [] for uri in uris[:HOT]}
        for second in range(60):
            for uri in uris[:HOT]:
                engine.upstream.resources[uri] = contents(uri, str(second + 1))
                changed[uri].append(engine.clock.now())
            for _ in range(10):
                await run_polls(engine.clock, 0.1)
        waits = []
        for uri, times in changed.items():
            told = sorted(at for at, event in engine.told if event.key.uri == uri and not event.baseline)
            for at in times[10:]:  # after the first ten seconds, once rates are known
                later = [t for t in told if t >= at]
                if later:
                    waits.append(later[0] - at)
        return waits, engine.upstream.longest_unread(10.0, engine.clock.now())
    finally:
        await engine.registry.aclose()


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
    engine = Engine(PollingConfig(default_interval_ms=5000, jitter=0.0, rules=[rule]))
    try:
        uri = "report://daily"
        engine.upstream.resources[uri] = contents(uri, '{"total": 1, "generatedAt": 0}')
        await engine.watch([])
        assert await engine.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None
        for stamp in range(1, 6):
            engine.upstream.resources[uri] = contents(uri, f'{{"total": 1, "generatedAt": {stamp}}}')
            await run_polls(engine.clock, 1.0)
        assert len(engine.reads()) == 6, "read every second (its rule), not every 5 s (the default)"
        assert [event for _, event in engine.told if not event.baseline] == [], "a new stamp is no change"
        engine.upstream.resources[uri] = contents(uri, '{"total": 2, "generatedAt": 9}')
        await run_polls(engine.clock, 1.0)
        assert len([event for _, event in engine.told if not event.baseline]) == 1
    finally:
        await engine.registry.aclose()


async def test_a_watch_stopped_and_started_again_starts_from_a_fresh_change_rate() -> None:
    """A key's change rate is learnt by its watch: once the watch ends, a watch of the same key started later is
    allocated like a key never seen (as a brand-new key started with it is), not at the pace its old one earned."""
    config = BUDGET.model_copy(update={"max_reads_per_s": 10, "jitter": 0.0, "linger_ms": 1000})
    engine = Engine(config)
    try:
        hot, new = "bench://hot/0", "bench://new/0"
        cold = [f"bench://cold/{n}" for n in range(38)]
        engine.upstream.resources[hot] = contents(hot, "0")
        engine.upstream.resources[new] = contents(new, "0")
        await engine.watch(cold)
        handle = await engine.registry.acquire("resource", hot, ANONYMOUS_IDENTITY)
        assert handle is not None
        for tick in range(200):  # 20 s of a key changing at every look: the budget goes to it
            engine.upstream.resources[hot] = contents(hot, str(tick))
            await run_polls(engine.clock, 0.1)
        learnt = engine.reads().count(hot)
        assert learnt >= 20, f"a key seen changing is polled far more often than every 10 s: {learnt} reads in 20 s"
        (watch,) = [watch for watch in engine.registry.watches() if watch.key.uri == hot]
        handle.release()
        await run_polls(engine.clock, 1.0)  # its linger runs out at the end: the watch stops
        assert watch not in engine.registry.watches()
        await engine.clock.until(lambda: not engine.clock.armed_by(watch), "the stopped watch's next poll called off")
        for uri in (hot, new):
            assert await engine.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None
        before = engine.reads()
        await run_polls(engine.clock, 10.0)
        after = engine.reads()[len(before) :]
        assert after.count(hot) <= after.count(new) + 1, (after.count(hot), after.count(new))
    finally:
        await engine.registry.aclose()


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
        self.budget = ReadBudget(
            polling,
            watches=lambda: self.watches,
            may_poll=lambda key: key not in self.native,
            replicas=lambda: replicas,
        )

    def interval_ms(self, watch: _Watch) -> float:
        """`watch`'s interval now; then, as the poll driver does after each step, what it shortened is re-armed."""
        interval = self.budget.interval_ms(watch, self.clock.at)
        for tightened in self.budget.take_tightened():
            tightened.tighten()
        return interval

    def intervals(self) -> list[float]:
        return [self.interval_ms(watch) for watch in self.watches]

    def reads_per_s(self) -> float:
        return sum(1000 / interval for interval in self.intervals())


def test_a_replicas_share_is_the_fleets_budget_over_the_live_replicas() -> None:
    assert _Budget([], per_s=60, replicas=3).budget.per_s() == 20
    assert _Budget([], per_s=60, replicas=0).budget.per_s() == 60, "no live replica known: this one is all"


def test_polls_take_slots_one_over_the_budget_apart_and_a_later_one_waits_for_nothing() -> None:
    budget = _Budget([], per_s=4).budget
    assert [budget.slot(100.0, hinted=False) for _ in range(3)] == [100.0, 100.25, 100.5]
    assert budget.slot(100.6, hinted=True) == 100.75
    assert budget.slot(200.0, hinted=False) == 200.0


@pytest.mark.invariant(21)
def test_hinted_polls_leave_the_regular_ones_less_of_the_budget_and_fade_with_a_ten_second_half_life() -> None:
    engine = _Budget([_Watch(_key(str(n))) for n in range(10)], per_s=10)
    assert engine.reads_per_s() == pytest.approx(9.0, rel=1e-9), "a tenth of the budget left for jitter"
    for _ in range(50):
        engine.budget.slot(100.0, hinted=True)
    hinted = 50 * math.log(2) / 10
    engine.clock.at = 101.0
    assert engine.reads_per_s() == pytest.approx(9.0 - hinted * 2**-0.1, rel=1e-9)
    engine.clock.at = 111.0
    assert engine.reads_per_s() == pytest.approx(9.0 - hinted * 2**-1.1, rel=1e-9)


@pytest.mark.parametrize(("jitter", "floor_ms"), [(0.1, 10_000 * 0.9 / 1.1), (0.0, 10_000 * 0.95)])
def test_when_hinted_polls_take_the_whole_budget_every_key_falls_to_its_floor(jitter: float, floor_ms: float) -> None:
    engine = _Budget([_Watch(_key("a")), _Watch(_key("b"))], per_s=1, jitter=jitter, max_interval_ms=10_000)
    for _ in range(20):
        engine.budget.slot(100.0, hinted=True)  # about 1.4 hinted polls a second against 0.9 to spend
    # Jittered, the floor stays within max_interval_ms less a margin for the wait for a slot.
    assert engine.intervals() == pytest.approx([floor_ms, floor_ms], rel=1e-9)


def test_a_key_seen_changing_is_polled_more_often_than_one_never_seen_changing_until_it_is_forgotten() -> None:
    hot, unseen, quiet = _Watch(_key("hot")), _Watch(_key("unseen")), _Watch(_key("quiet"))
    engine = _Budget([hot, unseen, quiet], per_s=10, allocation="adaptive")
    engine.budget.polled(hot.key, True, 10.0)  # one change in ten seconds: under one a second
    for _ in range(3):
        engine.budget.polled(hot.key, False, 10.0)
        engine.budget.polled(quiet.key, False, 10.0)
    fast, slow, quiet_ms = engine.intervals()
    assert fast < slow == quiet_ms
    engine.budget.forget(hot.key)
    # Forgotten, it is a new key: allocated anew at once, like the keys never seen changing.
    assert engine.intervals() == pytest.approx([3000 / 9] * 3, rel=1e-9)


def test_more_holders_of_a_key_get_it_polled_more_often() -> None:
    shared, single = _Watch(_key("shared"), refs=4), _Watch(_key("single"))
    engine = _Budget([shared, single], per_s=10, allocation="adaptive")
    for watch in (shared, single):
        engine.budget.polled(watch.key, True, 10.0)
    many, one = engine.intervals()
    assert one == pytest.approx(2 * many), "in proportion to the square root of the holders"


def test_an_allocation_is_kept_for_a_second_and_a_new_key_gets_its_own_at_once() -> None:
    first, second, third = _Watch(_key("1")), _Watch(_key("2")), _Watch(_key("3"))
    engine = _Budget([first], per_s=10)
    assert engine.interval_ms(first) == pytest.approx(1000 / 9, rel=1e-9)
    engine.clock.at = 100.5
    engine.watches.append(second)
    assert engine.interval_ms(second) == pytest.approx(2000 / 9, rel=1e-9), "not its wanted 10 ms"
    engine.clock.at = 101.0
    engine.watches.append(third)
    assert engine.interval_ms(first) == pytest.approx(2000 / 9, rel=1e-9), "kept for a second"
    engine.clock.at = 101.5
    assert engine.interval_ms(first) == pytest.approx(3000 / 9, rel=1e-9), "a second on: allocated anew"


def test_a_watch_nobody_holds_or_one_the_upstream_notifies_of_spends_none_of_the_budget() -> None:
    polled, unheld, native = _Watch(_key("polled")), _Watch(_key("unheld"), refs=0), _Watch(_key("native"))
    engine = _Budget([polled, unheld, native], per_s=10)
    engine.native.add(native.key)
    assert engine.intervals() == pytest.approx([1000 / 9, 10.0, 10.0], rel=1e-9)


def test_while_the_budget_covers_everyone_each_key_keeps_its_wanted_interval_exactly() -> None:
    slow = _Watch(_key("slow"), wanted_ms=1000.0)
    engine = _Budget([slow], per_s=10)
    assert engine.intervals() == [1000.0]
    assert slow.tightened == 0


def test_a_key_whose_interval_shrinks_by_more_than_a_fifth_is_rearmed_at_once() -> None:
    first = _Watch(_key("first"))
    others = [_Watch(_key(str(n))) for n in range(4)]
    engine = _Budget([first], per_s=10)
    engine.intervals()
    engine.watches.extend(others)
    engine.clock.at = 101.0
    engine.intervals()
    assert first.tightened == 0, "a longer interval waits for the poll already armed"
    del engine.watches[1:]
    engine.clock.at = 102.0
    engine.intervals()
    assert first.tightened == 1
    engine.clock.at = 103.0
    engine.intervals()
    assert first.tightened == 1, "the same interval again: nothing to re-arm"


def test_an_interval_shrunk_by_exactly_a_fifth_waits_for_the_poll_already_armed() -> None:
    watch = _Watch(_key("ttl"), wanted_ms=1250.0)
    engine = _Budget([watch], per_s=10)
    assert engine.intervals() == [1250.0]
    watch.wanted_ms = 1000.0  # its ttlMs shortened: within the budget, the wanted interval is its interval
    engine.clock.at = 101.0
    assert engine.intervals() == [1000.0]
    assert 1.0 == 1.25 * 0.8 and watch.tightened == 0, "below four fifths re-arms; four fifths exactly does not"
    watch.wanted_ms = 790.0
    engine.clock.at = 102.0
    engine.intervals()
    assert watch.tightened == 1
