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
