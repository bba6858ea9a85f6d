"""The read budget's allocator on its own: keys, change rates, holders and a budget in; intervals out."""

from __future__ import annotations

import math
import random

import pytest

from sidecar.watch.allocator import ChangeRate, Demand, allocate

MAX_S = 10.0


def _reads(intervals: dict[object, float]) -> float:
    return sum(1 / interval for interval in intervals.values())


def _workload(hot: int = 30, cold: int = 270, wanted_s: float = 0.2) -> list[Demand]:
    return [Demand(("hot", n), wanted_s, 1.0) for n in range(hot)] + [
        Demand(("cold", n), wanted_s, 0.0) for n in range(cold)
    ]


def test_a_budget_that_covers_the_wanted_schedule_changes_nothing() -> None:
    demands = _workload(hot=3, cold=7, wanted_s=0.5)
    for policy in ("adaptive", "uniform"):
        assert allocate(demands, 20.0, max_interval_s=MAX_S, policy=policy) == {d.key: 0.5 for d in demands}


@pytest.mark.parametrize("policy", ["adaptive", "uniform"])
def test_an_allocation_spends_the_budget_and_no_more(policy: str) -> None:
    intervals = allocate(_workload(), 60.0, max_interval_s=MAX_S, policy=policy)  # type: ignore[arg-type]
    assert _reads(intervals) == pytest.approx(60.0)


def test_uniform_stretches_every_interval_by_one_factor() -> None:
    demands = [Demand("fast", 0.25, 5.0), Demand("slow", 1.0, 0.0)]
    intervals = allocate(demands, 2.5, max_interval_s=MAX_S, policy="uniform")
    assert intervals["fast"] / 0.25 == pytest.approx(intervals["slow"] / 1.0) == pytest.approx(2.0)


def test_adaptive_gives_the_polls_to_the_keys_that_change() -> None:
    intervals = allocate(_workload(), 60.0, max_interval_s=MAX_S, policy="adaptive")
    assert intervals[("hot", 0)] < 1.0 < MAX_S == intervals[("cold", 0)]


def test_adaptive_polls_in_proportion_to_the_square_root_of_rate_times_holders() -> None:
    demands = [Demand("a", 0.01, 1.0, 1), Demand("b", 0.01, 4.0, 1), Demand("c", 0.01, 1.0, 4)]
    intervals = allocate(demands, 5.0, max_interval_s=1000.0, policy="adaptive")
    assert intervals["a"] / intervals["b"] == pytest.approx(2.0)
    assert intervals["b"] == pytest.approx(intervals["c"])


def test_no_key_is_polled_faster_than_it_wants_nor_slower_than_the_maximum_interval() -> None:
    rng = random.Random(7)
    demands = [
        Demand(n, rng.choice([0.25, 1.0, 5.0]), rng.expovariate(1.0) * rng.random(), rng.randint(1, 9))
        for n in range(500)
    ]
    for budget in (1.0, 30.0, 80.0, 200.0, 2000.0):
        for policy in ("adaptive", "uniform"):
            intervals = allocate(demands, budget, max_interval_s=MAX_S, policy=policy)  # type: ignore[arg-type]
            for demand in demands:
                assert demand.wanted_s - 1e-9 <= intervals[demand.key] <= MAX_S + 1e-9


def test_when_even_the_maximum_interval_exceeds_the_budget_no_key_starves() -> None:
    intervals = allocate(_workload(), 5.0, max_interval_s=MAX_S, policy="adaptive")
    assert set(intervals.values()) == {MAX_S}


def test_what_the_changing_keys_do_not_need_goes_to_the_others() -> None:
    demands = [Demand("hot", 1.0, 10.0), Demand("cold-1", 0.5, 0.0), Demand("cold-2", 0.5, 0.0)]
    intervals = allocate(demands, 3.0, max_interval_s=MAX_S, policy="adaptive")
    assert intervals["hot"] == 1.0  # all it wants
    assert intervals["cold-1"] == pytest.approx(intervals["cold-2"]) == pytest.approx(1.0)


def test_the_change_rate_of_a_key_sampled_every_second_follows_the_estimator() -> None:
    rate = ChangeRate()
    assert rate.estimate() == rate.per_s() == 0.0
    for n in range(200):
        rate.record(changed=n % 2 == 0, interval_s=1.0)
    # Half the polls saw a change: r = -log(1 - 1/2) for a Poisson source (about 0.69 a second).
    assert rate.estimate() == pytest.approx(math.log(2), rel=0.1)  # its 0.5 terms bias it a little over ~20 polls


def test_a_key_changing_at_every_poll_is_taken_for_faster_than_its_estimate() -> None:
    seldom, saturated = ChangeRate(), ChangeRate()
    for n in range(100):
        seldom.record(changed=n % 10 == 0, interval_s=1.0)
        saturated.record(changed=True, interval_s=1.0)
    assert seldom.per_s() == pytest.approx(seldom.estimate(), rel=0.1)
    assert saturated.per_s() >= 4 * saturated.estimate()


def test_the_change_rate_follows_a_key_whose_pace_changes() -> None:
    rate = ChangeRate()
    for _ in range(100):
        rate.record(changed=True, interval_s=1.0)
    busy = rate.per_s()
    for _ in range(100):
        rate.record(changed=False, interval_s=1.0)
    assert rate.per_s() < busy / 20


def _cho_garcia_molina(polls: float, changes: float, seconds: float) -> float:
    """The estimator as the paper writes it, over the decayed counts."""
    return -math.log((polls - changes + 0.5) / (polls + 0.5)) / (seconds / polls)


def test_the_estimate_is_the_estimator_over_polls_whose_weight_decays_by_a_twentieth_each() -> None:
    rate = ChangeRate()
    rate.record(changed=True, interval_s=10.0)
    assert rate.estimate() == pytest.approx(_cho_garcia_molina(1, 1, 10), rel=1e-12) == pytest.approx(math.log(3) / 10)
    rate.record(changed=False, interval_s=4.0)
    polls, changes, seconds = 0.95 + 1, 0.95, 9.5 + 4
    assert rate.estimate() == pytest.approx(_cho_garcia_molina(polls, changes, seconds), rel=1e-12)
    assert rate.per_s() == pytest.approx(rate.estimate() * (1 + 4 * (changes / polls) ** 2), rel=1e-12)


def test_a_key_that_changed_at_every_poll_is_taken_for_five_times_its_estimate() -> None:
    rate = ChangeRate()
    rate.record(changed=True, interval_s=2.0)
    assert rate.per_s() == pytest.approx(5 * rate.estimate(), rel=1e-12)


def test_a_poll_that_covered_no_time_tells_no_rate() -> None:
    rate = ChangeRate()
    rate.record(changed=True, interval_s=-3.0)  # a clock that stepped back counts as no time, not negative time
    assert rate.estimate() == rate.per_s() == 0.0
    rate.record(changed=True, interval_s=1.0)
    assert rate.estimate() == pytest.approx(_cho_garcia_molina(1.95, 1.95, 1.0), rel=1e-12)


def test_a_demand_is_one_holder_and_no_change_seen_unless_told() -> None:
    demand = Demand("k", 1.0)
    assert (demand.rate_per_s, demand.holders) == (0.0, 1)


def test_keys_never_seen_changing_share_what_is_left_by_their_holders_and_none_counts_less_than_one() -> None:
    demands = [Demand("one", 0.01), Demand("none", 0.01, holders=0), Demand("four", 0.01, holders=4)]
    intervals = allocate(demands, 4.0, max_interval_s=1000.0, policy="adaptive")
    assert intervals["one"] == pytest.approx(intervals["none"])
    assert intervals["one"] == pytest.approx(2 * intervals["four"])
    assert _reads(intervals) == pytest.approx(4.0)


def test_a_key_that_wants_to_be_read_less_often_than_the_maximum_interval_is_never_read_more_often() -> None:
    demands = [Demand("lazy", 20.0), Demand("busy", 0.01, 1.0)]
    for budget in (0.05, 1.0):
        intervals = allocate(demands, budget, max_interval_s=MAX_S, policy="adaptive")
        assert intervals["lazy"] == pytest.approx(20.0)
    assert allocate(demands, 0.05, max_interval_s=MAX_S, policy="adaptive")["busy"] == pytest.approx(MAX_S)


def test_a_budget_that_exactly_pays_for_the_maximum_interval_reads_every_key_at_it() -> None:
    demands = [Demand("a", 1.0, 1.0), Demand("b", 1.0, 0.0)]
    assert sum([1 / MAX_S, 1 / MAX_S]) == 0.2, "an exact tie in floating point"
    assert allocate(demands, 0.2, max_interval_s=MAX_S, policy="adaptive") == {"a": MAX_S, "b": MAX_S}
