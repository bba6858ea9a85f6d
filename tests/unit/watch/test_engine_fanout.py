"""What one event visits, as playbooks with no event loop: a recovery of the upstream retries the failing watches
(kept as their looks come back, not found by a pass over every watch), and the read budget allocates anew over
every watch only when its allocation is a second old or the keys it counts have changed, not at each start nor at
each poll of a key it leaves out (a watch not published yet, a lingering one, one another replica polls)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from sidecar.changes import WatchKey
from sidecar.config import PollingConfig
from sidecar.protocol.errors import UpstreamError, UpstreamUnavailable
from sidecar.watch.budget import ReadBudget
from sidecar.watch.engine.commands import CancelTimer, SetTimer
from sidecar.watch.engine.events import Hinted, Recovered, Release
from sidecar.watch.engine.polls import PollEvent, PollPlan, Recover
from sidecar.watch.observation import Observation
from tests.unit.watch.engine_cast import ALICE, LINGER_S, POLL_S, V1, polling_engine
from tests.unit.watch.engine_cast import SCHEDULE_CONFIG as CONFIG
from tests.unit.watch.engine_polls import Polled

DOWN = UpstreamUnavailable("http://upstream.test/mcp", "connection refused")


class _Upstream:
    """What each URI's poll sees now (V1 unless the test says otherwise), over an engine the test drives."""

    def __init__(
        self, polling: PollingConfig = CONFIG, *, may_poll: Callable[[WatchKey], bool] = lambda key: True
    ) -> None:
        self.seen: dict[str, Observation | UpstreamError] = {}
        engine = polling_engine(polling, may_poll=may_poll)
        self.engine = engine
        self.polled = Polled(engine, lambda key, started: self.seen.get(key.uri or "", V1))

    def watch(self, *uris: str) -> list[WatchKey]:
        return [self.polled.watch(ALICE, uri, V1) for uri in uris]

    def plan(self, key: WatchKey) -> PollPlan:
        plan = self.polled.record(key).plan
        assert plan is not None
        return plan


@pytest.fixture
def recovering(monkeypatch: pytest.MonkeyPatch) -> list[PollPlan]:
    """The plans each recovery visits, in order (every `Recover` a plan is fed)."""
    visited: list[PollPlan] = []
    handle = PollPlan.handle

    def noted(plan: PollPlan, event: PollEvent, now: float) -> Any:
        if isinstance(event, Recover):
            visited.append(plan)
        return handle(plan, event, now)

    monkeypatch.setattr(PollPlan, "handle", noted)
    return visited


@pytest.fixture
def allocations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int]]:
    """Each allocation of the read budget: when, and over how many keys."""
    made: list[tuple[float, int]] = []
    allocate = ReadBudget.allocate

    def noted(budget: ReadBudget[Any], now: float, polled: Iterable[Any], replicas: int) -> None:
        polled = list(polled)
        made.append((now, len(polled)))
        allocate(budget, now, polled, replicas)

    monkeypatch.setattr(ReadBudget, "allocate", noted)
    return made


def test_a_recovery_visits_the_failing_watches_only_until_each_succeeds_or_ends(recovering: list[PollPlan]) -> None:
    world = _Upstream()
    retried, healed, ended, healthy = world.watch("file:///retried", "file:///healed", "file:///ended", "file:///ok")
    for key in (retried, healed, ended):
        world.seen[key.uri or ""] = DOWN
    world.polled.clock.advance(POLL_S)  # each polls once: three fail, backing off 1 s
    assert [world.plan(key).errors for key in (retried, healed, ended, healthy)] == [1, 1, 1, 0]
    world.seen[healed.uri or ""] = V1
    world.polled.clock.advance(1.0)  # the backoff's polls: one succeeds by itself
    assert world.plan(healed).errors == 0
    world.polled.clock.advance(0.5)
    commands = world.polled.feed(Recovered())
    assert recovering == [world.plan(retried), world.plan(ended)], "neither the healed watch nor the healthy one"
    # Each failing watch retries now, in the order the watches started (the second spread after the first).
    assert commands == [CancelTimer(-9), SetTimer(-12, 6.5), CancelTimer(-11), SetTimer(-13, 6.5125)]
    world.polled.feed(Release(ended, ended.context))
    world.polled.clock.advance(LINGER_S + 0.1)  # its linger runs out while it fails: the watch ends
    assert world.engine.record(ended) is None
    recovering.clear()
    assert world.polled.feed(Recovered()) == [], "the same failure streak: it waits out its backoff"
    assert recovering == [world.plan(retried)], "the ended watch is not visited"
    world.seen[retried.uri or ""] = V1
    world.polled.clock.advance(8.0)  # its backoff's poll succeeds
    assert world.plan(retried).errors == 0
    recovering.clear()
    assert world.polled.feed(Recovered()) == []
    assert recovering == [], "no watch fails: a recovery visits none"


def test_a_recovery_retries_in_the_order_the_watches_started_not_the_order_they_failed(
    recovering: list[PollPlan],
) -> None:
    world = _Upstream()
    first, second = world.watch("file:///first", "file:///second")
    world.seen = {"file:///first": DOWN, "file:///second": DOWN}
    world.polled.clock.advance(1.0)
    world.polled.feed(Hinted(second))  # polled at once (its timer due now): the later watch fails first
    world.polled.clock.advance(0.0)
    assert world.plan(second).errors == 1 and world.plan(first).errors == 0
    world.polled.clock.advance(POLL_S - 1.0)  # the first's regular poll fails next
    assert world.plan(first).errors == 1
    world.polled.feed(Recovered())
    assert recovering == [world.plan(first), world.plan(second)]


def test_a_start_storm_allocates_the_read_budget_once_not_once_a_start(
    allocations: list[tuple[float, int]],
) -> None:
    world = _Upstream(CONFIG.model_copy(update={"max_reads_per_s": 10, "jitter": 0.0}))
    world.watch(*[f"file:///storm/{n}" for n in range(200)])
    # The first start's first interval finds no allocation yet; every other one is a key the allocation leaves out
    # until it is published (nobody holds it yet), which would get its wanted interval from a new one anyway.
    assert allocations == [(0.0, 0)]
    intervals = {world.polled.record(key).interval_s for key in world.engine.keys()}
    assert intervals == {POLL_S}, "its wanted interval: the first poll an interval after its first look"


def test_polls_of_keys_left_out_of_the_allocation_do_not_reallocate_it(allocations: list[tuple[float, int]]) -> None:
    owned = {f"file:///k/{n}" for n in range(0, 20, 2)}
    world = _Upstream(
        CONFIG.model_copy(update={"max_reads_per_s": 10, "jitter": 0.0}), may_poll=lambda key: key.uri in owned
    )
    keys = world.watch(*[f"file:///k/{n}" for n in range(20)])
    world.polled.clock.advance(4.0)
    for key in keys[1:6:2]:  # three keys another replica polls, and two of this one's, let go of: they linger
        world.polled.feed(Release(key, key.context))
    for key in keys[2:6:2]:
        world.polled.feed(Release(key, key.context))
    allocations.clear()
    world.polled.clock.advance(1.9)  # every first poll comes due at 5 s; this replica's wait for their slots
    # One allocation, at the first interval asked for at 5 s, over the eight keys held and polled here; none for
    # the polls of the ten another replica holds the lease on, nor of the two lingering.
    assert allocations == [(5.0, 8)]
    assert world.polled.polls, "this replica's keys were polled"


def test_a_new_watchs_first_interval_is_its_share_of_the_budget_not_its_wanted_one(
    allocations: list[tuple[float, int]],
) -> None:
    world = _Upstream(CONFIG.model_copy(update={"max_reads_per_s": 0.25, "jitter": 0.0}))
    first, _ = world.watch("file:///first", "file:///second")
    world.polled.clock.advance(POLL_S)  # the first polls at once; the second waits for its slot (at 9 s)
    assert world.polled.record(first).interval_s == pytest.approx(2 / (0.9 * 0.25)), "two keys share 9/10 of it"
    allocations.clear()
    world.polled.clock.advance(0.5)
    [third] = world.watch("file:///third")
    assert allocations == [], "a start asks no allocation: its key is not held until it is published"
    assert world.polled.record(third).interval_s == POLL_S, "its first poll an interval after its first look"
    world.polled.clock.advance(13.0 - 5.5)  # due at 10.5, it waits for its slot (13 s)
    assert world.polled.record(third).last_poll_at == 13.0
    assert allocations == [(9.0, 3), (13.0, 3)], "a second apart or more, the third counted once it was held"
    assert world.polled.record(third).interval_s == pytest.approx(3 / (0.9 * 0.25)), "three keys share it now"


def test_a_watch_newly_held_gets_its_share_at_its_first_poll_even_within_a_second_of_the_last_allocation(
    allocations: list[tuple[float, int]],
) -> None:
    world = _Upstream(CONFIG.model_copy(update={"max_reads_per_s": 10.0, "jitter": 0.0}))
    world.watch("file:///first", "file:///second")
    world.polled.clock.advance(POLL_S)
    assert allocations and allocations[-1][1] == 2
    allocations.clear()
    world.polled.clock.advance(0.5)
    [third] = world.watch("file:///third")
    world.polled.feed(Hinted(third, True))  # it polls soon, well within a second of the last allocation
    world.polled.clock.advance(0.5)
    assert world.polled.record(third).last_poll_at is not None
    assert [count for _, count in allocations] == [3], "counted once held, at its first poll: not a second later"
