"""`polling.max_reads_per_s` and `polling.rules` in the engine: the engine on the hand-moved clock with no event
loop (`budget_bench`), its polls reading resources the test changes, every read counted; a rule through a real
`WatchRegistry` (its engine and its looks are given the rules); then the budget on its own. Figures here are
engine time, not machine speed."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import pytest

from sidecar.changes import WatchKey
from sidecar.config import PollingConfig
from sidecar.config.polling_rules import PollingRule
from sidecar.identity import ANONYMOUS_IDENTITY, PUBLIC
from sidecar.watch.budget import ReadBudget
from tests.unit.watch.budget_bench import Bench
from tests.unit.watch.registry_world import make_world
from tests.unit.watch.scripted_upstream import contents

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


def _uris() -> list[str]:
    return [f"bench://hot/{n}" for n in range(HOT)] + [f"bench://cold/{n}" for n in range(KEYS - HOT)]


@pytest.mark.invariant(21)
def test_polls_never_exceed_the_budget_and_every_key_is_read_within_its_maximum_interval() -> None:
    bench = Bench(BUDGET)
    uris = _uris()
    bench.watch(uris)
    start, first = bench.clock.now(), len(bench.reads())
    for _ in range(300):
        bench.run(0.1)
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
    # holds more; the polls that came due over it waited for theirs, as the engine reports (the registry's metrics).
    assert min(bench.poll_gaps(start)) >= 1 / BUDGET.max_reads_per_s - 1e-9
    assert bench.budget_shares() == {BUDGET.max_reads_per_s}
    assert len(bench.waits("read_budget")) > 0
    assert bench.longest_unread(start, bench.clock.now()) <= BUDGET.max_interval_ms / 1000, "nor for longer"


@pytest.mark.invariant(21)
def test_hinted_polls_count_against_the_budget() -> None:
    bench = Bench(BUDGET)
    bench.watch(_uris()[:40])
    start, first = bench.clock.now(), len(bench.reads())
    for _ in range(200):
        bench.wrote()  # a write every 50 ms hints every watch of the writer's (anonymous) context
        bench.run(0.05)
    elapsed = bench.clock.now() - start
    assert elapsed == pytest.approx(10.0)
    assert len(bench.reads()) - first <= BUDGET.max_reads_per_s * elapsed + 1
    assert min(bench.poll_gaps(start)) >= 1 / BUDGET.max_reads_per_s - 1e-9, "a hinted poll takes a slot too"
    assert any(poll.hinted for poll in bench.polled.polls), "the writes' hints were polled"


def _staleness(policy: str) -> tuple[list[float], float]:
    """Every hot key changes each second for a minute: each change's wait until it is told, and the longest any
    key went unread."""
    bench = Bench(BUDGET.model_copy(update={"allocation": policy}))
    uris = _uris()
    bench.watch(uris)
    changed: dict[str, list[float]] = {uri: [] for uri in uris[:HOT]}
    for second in range(60):
        for uri in uris[:HOT]:
            bench.set(uri, str(second + 1))
            changed[uri].append(bench.clock.now())
        for _ in range(10):
            bench.run(0.1)
    waits = []
    for uri, times in changed.items():
        told = sorted(at for at, change in bench.told() if change.key.uri == uri)
        for at in times[10:]:  # after the first ten seconds, once rates are known
            later = [t for t in told if t >= at]
            if later:
                waits.append(later[0] - at)
    return waits, bench.longest_unread(10.0, bench.clock.now())


@pytest.mark.invariant(21)
def test_adaptive_spends_the_budget_where_changes_are() -> None:
    adaptive, adaptive_unread = _staleness("adaptive")
    uniform, uniform_unread = _staleness("uniform")
    assert statistics.mean(adaptive) <= 0.6 * statistics.mean(uniform), (
        statistics.mean(adaptive),
        statistics.mean(uniform),
    )
    # No cold key waits longer than its maximum interval (a slot of the budget late at most).
    assert max(adaptive_unread, uniform_unread) <= BUDGET.max_interval_ms / 1000 + 0.2


async def test_a_rule_sets_a_keys_interval_and_ignores_its_noise() -> None:
    # Through the registry: its engine is given the rules (the interval) and so are its looks (the fingerprint).
    rule = PollingRule.model_validate(
        {"match": "report://*", "interval_ms": 1000, "ignore": {"json_pointers": ["/generatedAt"]}}
    )
    world = make_world(PollingConfig(default_interval_ms=5000, jitter=0.0, rules=[rule]))
    try:
        uri = "report://daily"
        world.upstream.resources[uri] = contents(uri, '{"total": 1, "generatedAt": 0}')
        assert await world.registry.acquire("resource", uri, ANONYMOUS_IDENTITY) is not None
        for stamp in range(1, 6):
            world.upstream.resources[uri] = contents(uri, f'{{"total": 1, "generatedAt": {stamp}}}')
            await world.step(1.0, looks=1)
        assert len(world.upstream.reads(uri)) == 6, "read every second (its rule), not every 5 s (the default)"
        assert world.changes() == [], "a new stamp is no change"
        world.upstream.resources[uri] = contents(uri, '{"total": 2, "generatedAt": 9}')
        await world.step(1.0, looks=1)
        assert len(world.changes()) == 1
    finally:
        await world.registry.aclose()


def test_a_watch_stopped_and_started_again_starts_from_a_fresh_change_rate() -> None:
    """A key's change rate is learnt by its watch: once the watch ends, a watch of the same key started later is
    allocated like a key never seen (as a brand-new key started with it is), not at the pace its old one earned."""
    bench = Bench(BUDGET.model_copy(update={"max_reads_per_s": 10, "jitter": 0.0, "linger_ms": 1000}))
    hot, new = "bench://hot/0", "bench://new/0"
    cold = [f"bench://cold/{n}" for n in range(38)]
    bench.watch(cold)
    [held] = bench.watch([hot])
    for tick in range(200):  # 20 s of a key changing at every look: the budget goes to it
        bench.set(hot, str(tick))
        bench.run(0.1)
    learnt = bench.reads().count(hot)
    assert learnt >= 20, f"a key seen changing is polled far more often than every 10 s: {learnt} reads in 20 s"
    bench.release(held)
    bench.run(1.0)  # its linger runs out at the end: the watch stops
    assert hot not in bench.watched()
    assert bench.only_polls_armed(), "the stopped watch's next poll called off"
    bench.watch([hot, new])
    before = bench.reads()
    bench.run(10.0)
    after = bench.reads()[len(before) :]
    assert after.count(hot) <= after.count(new) + 1, (after.count(hot), after.count(new))


def test_keys_left_by_others_that_stopped_are_read_sooner_than_their_armed_polls() -> None:
    """Fifty keys share 9 reads a second (one every 5.6 s each); when forty stop, the next allocation gives the ten
    left one every 1.1 s, and each is re-armed for that at once, not only after the poll it was armed for."""
    bench = Bench(BUDGET.model_copy(update={"max_reads_per_s": 10, "jitter": 0.0, "linger_ms": 0}))
    uris = [f"bench://key/{n}" for n in range(50)]
    kept = uris[::5]  # their next polls spread over the whole 5.6 s
    keys = bench.watch(uris)
    bench.run(20.0)
    assert bench.poll_gaps(15.0)[0] == pytest.approx(0.1), "the budget spent: a poll every slot"
    stopped = bench.clock.now()
    for uri, key in zip(uris, keys, strict=True):
        if uri not in kept:
            bench.release(key)
    bench.run(0.0)  # no linger: they stop now
    assert bench.watched() == set(kept)
    bench.run(6.0)
    waited = {uri: min(at for at in bench.read_at[uri] if at > stopped) - stopped for uri in kept}
    # Within the allocation's second, plus the new interval, plus the slots of the others re-armed with it.
    assert max(waited.values()) < 2.0, waited


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


def test_a_key_the_allocation_leaves_out_asks_no_new_one_and_one_it_counted_leaving_does() -> None:
    kept, left, unheld = _Watch(_key("kept")), _Watch(_key("left")), _Watch(_key("unheld"), refs=0)
    bench = _Budget([kept, left, unheld], per_s=10)
    assert bench.interval_ms(kept) == pytest.approx(2000 / 9, rel=1e-9)
    budget = bench.budget
    assert not budget.stale(unheld.key, 100.5, counted=False), "a new allocation would leave it out too"
    assert budget.interval_ms(unheld) == 10.0, "its wanted interval, as an allocation would give it"
    assert budget.stale(unheld.key, 101.0, counted=False), "a second on, any key's interval allocates anew"
    budget.forget(unheld.key)  # never counted: the allocation stays
    assert not budget.stale(kept.key, 100.5)
    budget.forget(left.key)  # counted: its share is the others' at the next interval asked for
    assert budget.stale(unheld.key, 100.5, counted=False)
    bench.watches.remove(left)
    bench.clock.at = 100.5
    assert bench.interval_ms(kept) == pytest.approx(1000 / 9, rel=1e-9)


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
